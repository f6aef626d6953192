"""What a serving signature takes: ranks, the model's own inputs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.serving import serving_inputs
from tests.serving_cases import SERVED_RAW
from tests.serving_cases import served_feeds
from tests.serving_cases import served_model


def test_serving_signature_names_raw_features(tmp_path):
    _, pre, model = served_model(tmp_path)
    export = kte.export_saved_model(
        model, str(tmp_path / "e"), preprocessor=pre
    )
    signature = tf.saved_model.load(export).signatures["serving_default"]
    assert sorted(signature.structured_input_signature[1]) == sorted(SERVED_RAW)
    # A single-valued feature is accepted as [batch] and as [batch, 1].
    feeds = served_feeds()
    feeds["item"] = feeds["item"][:, tf.newaxis]
    np.testing.assert_array_equal(
        signature(**feeds)["score"], signature(**served_feeds())["score"]
    )


def test_export_passes_the_model_only_its_own_inputs(tmp_path):
    """A preprocessor with more columns than the model gave the model an
    extra key, which Keras matched by position: `b` served `a`'s row."""
    a = kte.embedding_column(kte.categorical_column_with_identity("a", 10), 2)
    b = kte.embedding_column(kte.categorical_column_with_identity("b", 10), 2)
    inputs = kte.FeaturePreprocessor([b]).keras_inputs()
    layer = kte.TPUEmbeddingLayer([b], output="concat")
    model = keras.Model(inputs, layer(inputs))
    path = kte.export_saved_model(
        model, str(tmp_path / "e"), preprocessor=kte.FeaturePreprocessor([a, b])
    )
    serve = kte.load_saved_model(path).signatures["serving_default"]
    out = serve(a=tf.constant([5], tf.int64), b=tf.constant([1], tf.int64))
    np.testing.assert_allclose(
        next(iter(out.values()))[0], layer.table_variable("b").numpy()[1]
    )


def test_export_refuses_a_model_input_the_preprocessor_lacks(tmp_path):
    b = kte.embedding_column(kte.categorical_column_with_identity("b", 10), 2)
    c = kte.embedding_column(kte.categorical_column_with_identity("c", 10), 2)
    inputs = kte.FeaturePreprocessor([b, c]).keras_inputs()
    layer = kte.TPUEmbeddingLayer([b, c], output="concat")
    model = keras.Model(inputs, layer(inputs))
    with pytest.raises(KeyError, match="'c'"):
        kte.export_saved_model(
            model,
            str(tmp_path / "e"),
            preprocessor=kte.FeaturePreprocessor([b]),
        )


def test_batch_matrix_takes_rank_1_and_2_and_names_a_rank_3_feature():
    # Of unknown rank, as a raw feature's signature leaves it.
    as_matrix = tf.function(
        lambda value: serving_inputs.as_batch_matrix("a", value),
        input_signature=[tf.TensorSpec(None, tf.int64)],
        autograph=False,
    )
    assert as_matrix(tf.constant([1, 2], tf.int64)).shape == (2, 1)
    assert as_matrix(tf.constant([[1, 2]], tf.int64)).shape == (1, 2)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        # Assert escapes the quotes in its message.
        match=r"Feature \\?'a\\?' must be \[batch\]",
    ):
        as_matrix(tf.constant([[[1]]], tf.int64))


def test_a_crossed_key_read_by_a_weighted_column_is_refused():
    """Dropping the crossed key's padding would part the weighted column's
    ids from its weights."""
    a = kte.categorical_column_with_identity("a", 10)
    crossed = kte.crossed_column(["a", "b"], 9, key_dtypes=["int64", "int64"])
    weighted = kte.weighted_categorical_column(a, "a_w")
    pre = kte.FeaturePreprocessor(
        [kte.embedding_column(crossed, 2), kte.embedding_column(weighted, 2)]
    )
    with pytest.raises(ValueError, match="'a' is crossed by .*another key"):
        serving_inputs.cross_padding(pre)


def _ids_model():
    columns = [
        kte.embedding_column(kte.categorical_column_with_identity(k, 10), 2)
        for k in ("a", "b")
    ]
    inputs = {
        "a": keras.Input((1,), dtype="int64", name="a"),
        "b": keras.Input((3,), dtype="int64", name="b"),
    }
    layer = kte.TPUEmbeddingLayer(columns, output="concat")
    return keras.Model(inputs, keras.layers.Dense(1, name="s")(layer(inputs)))


def _graph_ops(concrete):
    graph = concrete.graph.as_graph_def()
    ops = [node.op for node in graph.node]
    for function in graph.library.function:
        ops += [node.op for node in function.node_def]
    return ops


def test_ids_export_takes_the_model_input_shapes_and_checks_rank_once(
    tmp_path,
):
    """The signature left the rank open, so every call checked and
    reshaped every feature on the host: the check now folds at trace time."""
    path = kte.export_saved_model(
        _ids_model(), str(tmp_path / "e"), inputs="ids", verbose=False
    )
    serve = tf.saved_model.load(path).signatures["serving_default"]
    specs = serve.structured_input_signature[1]
    assert specs["a"].shape.as_list() == [None, 1]
    assert specs["b"].shape.as_list() == [None, 3]
    assert "Rank" not in _graph_ops(serve)
    ids = {
        "a": tf.constant([[1], [2]], tf.int64),
        "b": tf.constant([[1, 2, -1]] * 2, tf.int64),
    }
    assert serve(**ids)["s"].shape == (2, 1)


def test_ids_export_refuses_another_shape_naming_the_feature(tmp_path):
    """A loaded signature runs its graph on any shape: `[batch]` or
    `[batch, 2]` ids for a `[batch, 1]` input failed deep in the lookup,
    or could have been read from the wrong cells."""
    path = kte.export_saved_model(
        _ids_model(), str(tmp_path / "e"), inputs="ids", verbose=False
    )
    b = tf.constant([[1, 2, -1]], tf.int64)
    for serve in (
        tf.saved_model.load(path).signatures["serving_default"],
        kte.load_saved_model(path).signatures["serving_default"],
    ):
        for a in ([[[1]]], [1], [[1, 2]]):
            with pytest.raises(
                (ValueError, TypeError, tf.errors.InvalidArgumentError),
                match=r"tensor a \[|Feature 'a'|name='a'",
            ):
                serve(a=tf.constant(a, tf.int64), b=b)


def test_a_batch_matrix_of_known_rank_is_checked_at_trace_time():
    concrete = tf.function(
        lambda value: serving_inputs.as_batch_matrix("a", value),
        autograph=False,
    ).get_concrete_function(tf.TensorSpec([None, 2], tf.int64))
    assert "Assert" not in _graph_ops(concrete)
    one = tf.function(
        lambda value: serving_inputs.as_batch_matrix("a", value),
        autograph=False,
    ).get_concrete_function(tf.TensorSpec([None], tf.int64))
    assert one.output_shapes.as_list() == [None, 1]
    with pytest.raises(ValueError, match=r"Feature 'a' must be \[batch\]"):
        serving_inputs.as_batch_matrix("a", tf.zeros([1, 1, 1], tf.int64))


def test_ids_export_refuses_a_model_input_of_rank_3(tmp_path):
    """It failed inside Keras on the reshaped `[batch, n]` input, without
    saying what to do."""
    inputs = {"x": keras.Input((2, 3), name="x")}
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs["x"]))
    with pytest.raises(ValueError, match="model input 'x' has shape"):
        kte.export_saved_model(
            model, str(tmp_path / "e"), inputs="ids", verbose=False
        )


class ByKey(keras.Model):
    """Subclassed: reads its dict by key, declares no inputs."""

    def __init__(self):
        super().__init__()
        column = kte.embedding_column(
            kte.categorical_column_with_identity("item", 5), 2
        )
        self.lookups = kte.TPUEmbeddingLayer([column], output="concat")

    def call(self, features):
        return self.lookups(features)


def test_ids_export_of_a_subclassed_model_is_refused_naming_it(tmp_path):
    # It failed with AttributeError: no attribute 'inputs'.
    model = ByKey()
    model({"item": tf.constant([[1]], tf.int64)})
    with pytest.raises(ValueError, match="ByKey 'by_key' is subclassed"):
        kte.export_saved_model(model, tmp_path, inputs="ids", verbose=False)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_one_batch_on_the_host_names_every_feature_and_its_size(traced):
    check = serving_inputs.ensure_one_batch
    if traced:
        check = tf.function(check)
    same = {"a": tf.zeros([3, 2]), "b": tf.zeros([3], tf.int64)}
    checked = check(same)
    assert sorted(checked) == ["a", "b"] and checked["b"].shape == [3]
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Features .{1,2}a.{1,2}, .{1,2}b.{1,2}, .{1,2}c.{1,2} must "
        r"each hold one row per example(.|\n)*order:\] \[3 3 1\]",
    ):
        check(dict(same, c=tf.zeros([1, 1])))
    # A single feature has nothing to agree with.
    assert check({"a": tf.zeros([2])})["a"].shape == [2]


def test_rows_conformed_in_a_program_compile_for_any_batch_sizes():
    # Ids and weights of other batch sizes failed XLA's compile, naming
    # nothing, before the checks computed in the program could name them.
    @tf.function(jit_compile=True)
    def program(ids, weights):
        ids, weights = serving_inputs.conform_rows([ids, weights])
        return tf.cast(ids, tf.float32) * weights

    ids = tf.constant([[1, 2], [3, 4]], tf.int64)
    np.testing.assert_array_equal(
        program(ids, tf.ones([2, 2])), [[1, 2], [3, 4]]
    )
    assert program(ids, tf.ones([5, 2])).shape == [2, 2]
    assert program(ids, tf.ones([1, 2])).shape == [2, 2]
