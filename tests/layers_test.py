"""TPUEmbeddingLayer / SharedTPUEmbedding on the default device."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing

VOCAB, DIM = testing.VOCAB, testing.DIM
identity_column = testing.identity_column


def test_weighted_sequence_matches_numpy():
    column = kte.embedding_column(
        kte.weighted_categorical_column(
            kte.sequence_categorical_column_with_identity("s", VOCAB), "sw"
        ),
        DIM,
        combiner="sum",
        max_sequence_length=3,
    )
    layer = kte.TPUEmbeddingLayer([column], return_sequence_lengths=True)
    ids = tf.constant([[1, 2, 3, 4], [5, -1, -1, -1], [-1, -1, -1, -1]])
    weights = tf.constant([[2.0, 1.0, 0.5, 9.0], [3.0, 0, 0, 0], [0.0] * 4])
    out = layer({"s": ids, "sw": weights})
    table = layer.table_variable("s_weighted_by_sw").numpy()
    want = np.zeros((3, 3, DIM))
    for row in range(3):
        for pos in range(3):
            if ids[row, pos] >= 0:
                want[row, pos] = (
                    weights[row, pos].numpy() * table[ids[row, pos]]
                )
    np.testing.assert_allclose(out[column.name], want, atol=1e-6)
    np.testing.assert_array_equal(
        out[column.name + "_sequence_length"], [3, 1, 0]
    )


def test_concat_orders_by_name_and_rejects_sequences():
    b = identity_column("b")
    a = identity_column("a", combiner="mean")
    layer = kte.TPUEmbeddingLayer([b, a], output="concat")
    features = {"a": tf.constant([[1]]), "b": tf.constant([[2]])}
    out = layer(features)
    np.testing.assert_allclose(
        out[0, :DIM], layer.table_variable("a").numpy()[1], atol=1e-7
    )
    seq = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("s", 4),
        2,
        max_sequence_length=2,
    )
    with pytest.raises(ValueError, match="sequence columns"):
        kte.TPUEmbeddingLayer([seq], output="concat")


def test_plain_tensor_input_and_empty_batch():
    layer = kte.TPUEmbeddingLayer([identity_column()])
    single = layer(tf.constant([3, 4]))
    assert single["ids_embedding"].shape == (2, DIM)
    empty = layer(tf.zeros([0, 2], tf.int64))
    assert empty["ids_embedding"].shape == (0, DIM)
    trailing_empty = layer(tf.ragged.constant([[1], [], []], dtype=tf.int64))
    assert trailing_empty["ids_embedding"].shape == (3, DIM)


def test_invalid_inputs():
    layer = kte.TPUEmbeddingLayer([identity_column("x"), identity_column("y")])
    with pytest.raises(KeyError, match=r"Missing feature 'y'.*\['x', 'y'\]"):
        layer({"x": tf.constant([1])})
    with pytest.raises(TypeError, match="Feature 'x' must hold integer ids"):
        layer({"x": tf.constant([1.0]), "y": tf.constant([1])})
    with pytest.raises(ValueError, match="Feature 'x' must be rank 1"):
        layer({"x": tf.zeros([1, 1, 1], tf.int64), "y": tf.constant([1])})
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Feature 'x' \(table 'x'\).*\[0, 8\)",
    ):
        layer({"x": tf.constant([[1, 8]]), "y": tf.constant([1])})


def test_extra_keys_are_ignored_by_name_without_a_warning():
    """One feature dict feeding several layers is the documented usage:
    it warned on every such model."""
    layer = kte.TPUEmbeddingLayer([identity_column("x")])
    ids = tf.constant([[1, 2], [3, -1]])
    # The extra key comes first: a positional match would read it.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with_extra = layer({"a": tf.constant([[7, 7], [7, 7]]), "x": ids})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = layer({"a": tf.constant([[7, 7], [7, 7]]), "x": ids})
    expected = layer({"x": ids})["x_embedding"]
    np.testing.assert_array_equal(with_extra["x_embedding"], expected)
    np.testing.assert_array_equal(again["x_embedding"], expected)


def test_shared_layer_builds_from_categorical_columns():
    item = kte.categorical_column_with_identity("item", VOCAB)
    hist = kte.sequence_categorical_column_with_identity("hist", VOCAB)
    layer = kte.SharedTPUEmbedding(
        [item, hist], dimension=DIM, max_sequence_lengths=[0, 2]
    )
    out = layer({"item": tf.constant([1]), "hist": tf.constant([[1, 2, 3]])})
    table = layer.table_variable("hist_item_shared_embedding").numpy()
    np.testing.assert_allclose(out["item_shared_embedding"][0], table[1])
    np.testing.assert_allclose(out["hist_shared_embedding"][0], table[[1, 2]])
    assert len(layer.weights) == 3  # one table, the step, the trap
    with pytest.raises(TypeError, match="shared_embedding_columns"):
        kte.SharedTPUEmbedding([identity_column()])


def test_serving_device_rules():
    with pytest.raises(
        ValueError, match="Column 'ids_embedding' has no tensor"
    ):
        kte.TPUEmbeddingLayer(
            [identity_column()], serving_lookup_device="tpu_tensor_core"
        )
    with pytest.raises(ValueError, match="serving_lookup_device"):
        kte.TPUEmbeddingLayer(
            [identity_column()], serving_lookup_device="tpu_embedding_core"
        )
    # The layer's switch overrides the column for serving; without it the
    # export refuses (tests/serving_test.py).
    kte.TPUEmbeddingLayer(
        [identity_column(embedding_lookup_device="tpu_embedding_core")],
        serving_lookup_device="cpu",
    )


def test_config_and_model_round_trip(tmp_path):
    columns = [identity_column("a", combiner="sqrtn"), identity_column("b")]
    config = kte.EmbeddingConfig(
        optimizer=kte.optimizers.Adagrad(0.3, clipvalue=(-1.0, 2.0)),
        clipping_limit=2.0,
        partition_strategy="mod",
    )
    layer = kte.TPUEmbeddingLayer(columns, config=config, output="concat")
    rebuilt = testing.assert_config_round_trip(layer)
    assert rebuilt.config == config
    inputs = {k: keras.Input((None,), dtype="int64", name=k) for k in "ab"}
    model = keras.Model(inputs, keras.layers.Dense(2)(layer(inputs)))
    data = {"a": np.array([[1, 2], [3, -1]]), "b": np.array([[4, 4], [0, 1]])}
    testing.assert_model_save_load(model, data, str(tmp_path / "m.keras"))


def _two_table_model(order, sizes=(6, 6)):
    columns = {
        name: kte.embedding_column(
            kte.categorical_column_with_identity(name, size), 3
        )
        for name, size in zip(("a", "b"), sizes)
    }
    inputs = {k: keras.Input((1,), dtype="int64", name=k) for k in "ab"}
    layer = kte.TPUEmbeddingLayer(
        [columns[name] for name in order], name="emb", output="concat"
    )
    return keras.Model(inputs, layer(inputs)), layer


def test_weights_load_by_table_name_whatever_the_column_order(tmp_path):
    """Keras stores a layer's variables by position: columns listed in
    another order swapped the tables."""
    source, source_layer = _two_table_model("ab")
    source_layer.table_variable("a").assign(np.full((6, 3), 1.0, "float32"))
    source_layer.table_variable("b").assign(np.full((6, 3), 2.0, "float32"))
    path = str(tmp_path / "m.weights.h5")
    source.save_weights(path)
    target, target_layer = _two_table_model("ba")
    target.load_weights(path)
    np.testing.assert_array_equal(target_layer.table_variable("a").numpy(), 1.0)
    np.testing.assert_array_equal(target_layer.table_variable("b").numpy(), 2.0)


def test_weights_with_other_tables_are_refused_naming_both(tmp_path):
    source, _ = _two_table_model("ab")
    path = str(tmp_path / "m.weights.h5")
    source.save_weights(path)
    target, _ = _two_table_model("ab", sizes=(6, 7))
    with pytest.raises(ValueError, match=r"'b'.*\[6, 3\].*\[7, 3\]"):
        target.load_weights(path)


def test_weights_stored_by_position_still_load():
    """Files written by Keras' positional rule ("0", "1", ...) load so."""
    _, layer = _two_table_model("ab")
    positional = {
        str(i): np.full(v.shape, i, v.dtype)
        for i, v in enumerate(
            layer._trainable_variables + layer._non_trainable_variables
        )
    }
    layer.load_own_variables(positional)
    index = [v.path for v in layer._non_trainable_variables].index(
        layer.table_variable("b").path
    )
    np.testing.assert_array_equal(layer.table_variable("b").numpy(), index + 1)


def test_subclassed_model_without_training_argument_trains_tables():
    """Keras calls such a model without `training`; tables must still train
    in `fit` (they silently did not), and not in `predict` or `evaluate`."""
    column = kte.embedding_column(
        kte.categorical_column_with_identity("i", 20), 3
    )
    config = kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.3))
    x = {"i": tf.constant([[1], [2]], tf.int64)}
    y = np.ones((2, 1), "float32")

    def train(make_model):
        keras.utils.set_random_seed(1)
        layer = kte.TPUEmbeddingLayer([column], config=config, output="concat")
        model = make_model(layer)
        model(x)
        model.compile("sgd", "mse")
        before = layer.table_variable("i").numpy().copy()
        model.predict(x, verbose=0)
        model.evaluate(x, y, verbose=0)
        np.testing.assert_array_equal(layer.table_variable("i"), before)
        model.fit(x, y, epochs=2, verbose=0)
        # Both paths must train: equal untrained tables would compare equal.
        moved = layer.table_variable("i").numpy() != before
        assert moved[[1, 2]].all() and not moved[[0, 3]].any()
        return layer

    class Ranker(keras.Model):
        def __init__(self, layer):
            super().__init__()
            self.embedding = layer
            self.head = keras.layers.Dense(1)

        def call(self, features):  # no `training` argument
            return self.head(self.embedding(features))

    def functional(layer):
        inputs = {"i": keras.Input((1,), dtype="int64", name="i")}
        return keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))

    subclassed = train(Ranker)
    reference = train(functional)
    assert int(subclassed.embedding_step.numpy()) == 2
    np.testing.assert_allclose(
        subclassed.table_variable("i"), reference.table_variable("i")
    )


def test_serving_lookups_take_the_table_dtype():
    """The layer serves its own rows from int8 copies inside, and its
    float32 rows again after (as `export_saved_model` traces it)."""
    layer = kte.TPUEmbeddingLayer([testing.identity_column()])
    ids = tf.constant([[3]], tf.int64)
    trained = layer(ids)["ids_embedding"].numpy()
    with layer.serving_lookups(table_dtype="int8"):
        served = layer(ids)["ids_embedding"].numpy()
    codes, scale_offset = kte.quantization.quantize_rows(
        layer.table_variable("ids").numpy(), "int8", "ids"
    )
    np.testing.assert_allclose(
        served[0],
        kte.quantization.dequantize_rows(codes, scale_offset)[3],
        atol=1e-6,
    )
    assert not np.allclose(served, trained, atol=1e-7)
    np.testing.assert_array_equal(layer(ids)["ids_embedding"], trained)
    with pytest.raises(ValueError, match="table_dtype"):
        with layer.serving_lookups(table_dtype="int4"):
            pass
