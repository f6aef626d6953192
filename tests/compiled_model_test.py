"""`export_saved_model(jit_compile=True)`: the model past its lookups as
one XLA program, the lookups' checks kept."""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed._compat import keras


def _columns():
    ident = kte.categorical_column_with_identity
    return [
        kte.embedding_column(ident("a", 20), 4),
        kte.embedding_column(ident("b", 30), 4, combiner="sum"),
    ]


def _dlrm_like(numeric=True):
    """Two lookups, a numeric input, an MLP and a pairwise dot."""
    inputs = kte.FeaturePreprocessor(_columns()).keras_inputs()
    if numeric:
        inputs["x"] = keras.Input((2,), name="x")
    lookups = kte.TPUEmbeddingLayer(_columns())
    vectors = list(lookups({"a": inputs["a"], "b": inputs["b"]}).values())
    if numeric:
        vectors.append(keras.layers.Dense(4, activation="relu")(inputs["x"]))
    stacked = keras.ops.stack(vectors, axis=1)
    count = len(vectors)
    dots = keras.ops.reshape(
        keras.ops.matmul(stacked, keras.ops.transpose(stacked, (0, 2, 1))),
        (-1, count * count),
    )
    top = keras.layers.Concatenate()([vectors[-1], dots])
    score = keras.layers.Dense(1, name="score")(
        keras.layers.Dense(8, activation="relu")(top)
    )
    return keras.Model(inputs, score)


def _features(batch, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "a": tf.constant(rng.integers(0, 20, (batch, 1)), tf.int64),
        "b": tf.constant(rng.integers(-1, 30, (batch, 3)), tf.int64),
        "x": tf.constant(rng.normal(size=(batch, 2)), tf.float32),
    }


def _xla_programs(serve):
    """Names of the XLA-compiled functions of a loaded signature, and the
    op types of each."""
    library = serve.graph.as_graph_def().library
    return {
        f.signature.name: {node.op for node in f.node_def}
        for f in library.function
        if "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b
    }


@pytest.mark.parametrize("inputs", ["ids", "raw"])
def test_the_model_past_its_lookups_is_one_program_with_the_same_answer(
    tmp_path, inputs
):
    # Raw features come through the columns' preprocessor, which makes no
    # numeric input.
    model = _dlrm_like(numeric=inputs == "ids")
    kte.export_saved_model(
        model, tmp_path, inputs=inputs, verbose=False, jit_compile=True
    )
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    for batch in (1, 5, 64):
        features = _features(batch, seed=batch)
        if inputs == "raw":
            del features["x"]
        want = model(features, training=False).numpy()
        got = serve(**features)["score"].numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
    programs = _xla_programs(serve)
    # One program holds every Dense layer, apart from the lookups' gather.
    dense = [ops for ops in programs.values() if "MatMul" in ops]
    assert len(dense) == 1
    assert "ResourceGather" not in dense[0]
    assert any("ResourceGather" in ops for ops in programs.values())


def test_the_lookups_still_check_their_ids(tmp_path):
    kte.export_saved_model(
        _dlrm_like(), tmp_path, inputs="ids", verbose=False, jit_compile=True
    )
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    bad = dict(_features(2), b=tf.constant([[1, 31, -1]] * 2, tf.int64))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"Feature .{1,2}b.{1,2} \(table"
    ):
        serve(**bad)


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.lookups = kte.TPUEmbeddingLayer(_columns())
        self.score = keras.layers.Dense(1)

    def call(self, features):
        vectors = self.lookups(features)
        return self.score(keras.ops.concatenate(list(vectors.values()), 1))


def test_a_subclassed_model_is_refused_naming_it(tmp_path):
    model = _Subclassed()
    model(_features(2))
    with pytest.raises(ValueError, match="subclassed _Subclassed"):
        kte.export_saved_model(
            model, tmp_path, inputs="ids", verbose=False, jit_compile=True
        )


def test_a_lookup_called_twice_is_refused_naming_it(tmp_path):
    inputs = {
        "a": keras.Input((1,), dtype="int64", name="a"),
        "b": keras.Input((3,), dtype="int64", name="b"),
    }
    lookups = kte.TPUEmbeddingLayer(_columns(), output="concat", name="twice")
    again = {"a": inputs["a"], "b": keras.ops.flip(inputs["b"], 1)}
    merged = keras.layers.Add()([lookups(inputs), lookups(again)])
    model = keras.Model(
        inputs, keras.layers.Dense(1)(merged), name="model_with_twice"
    )
    with pytest.raises(
        ValueError, match="model_with_twice.*called more than once"
    ):
        kte.export_saved_model(
            model, tmp_path, inputs="ids", verbose=False, jit_compile=True
        )


def test_layers_xla_cannot_compile_fail_the_export_not_a_call(tmp_path):
    inputs = {"a": keras.Input((1,), dtype="int64", name="a")}
    column = kte.embedding_column(
        kte.categorical_column_with_identity("a", 9), 2
    )
    vector = kte.TPUEmbeddingLayer([column], output="concat")(inputs)
    # String ops have no XLA kernel.
    text = keras.layers.Lambda(
        lambda x: tf.strings.to_number(tf.strings.as_string(x)),
        output_shape=(2,),
    )(vector)
    model = keras.Model(inputs, text)
    with pytest.raises(ValueError, match="failed at export"):
        kte.export_saved_model(
            model, tmp_path, inputs="ids", verbose=False, jit_compile=True
        )
