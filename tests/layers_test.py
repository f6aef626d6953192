"""TPUEmbeddingLayer / SharedTPUEmbedding on the default device."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing

VOCAB, DIM = 8, 3


def identity_column(key="ids", combiner="sum", **kwargs):
    return kte.embedding_column(
        kte.categorical_column_with_identity(key, VOCAB),
        DIM,
        combiner=combiner,
        **kwargs,
    )


def numpy_pooled(table, ids, weights, combiner):
    out = np.zeros((len(ids), table.shape[1]))
    for row, (row_ids, row_w) in enumerate(zip(ids, weights)):
        pairs = [(i, w) for i, w in zip(row_ids, row_w) if i >= 0]
        if combiner != "sum":
            pairs = [(i, w) for i, w in pairs if w > 0]
        if not pairs:
            continue
        total = sum(w * table[i] for i, w in pairs)
        if combiner == "mean":
            total = total / sum(w for _, w in pairs)
        elif combiner == "sqrtn":
            total = total / np.sqrt(sum(w * w for _, w in pairs))
        out[row] = total
    return out


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


def test_extra_keys_are_ignored_by_name_with_one_warning():
    layer = kte.TPUEmbeddingLayer([identity_column("x")])
    ids = tf.constant([[1, 2], [3, -1]])
    # The extra key comes first: a positional match would read it.
    with pytest.warns(UserWarning, match=r"ignores the input keys \['a'\]"):
        with_extra = layer({"a": tf.constant([[7, 7], [7, 7]]), "x": ids})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = layer({"a": tf.constant([[7, 7], [7, 7]]), "x": ids})
    expected = layer({"x": ids})["x_embedding"]
    np.testing.assert_array_equal(with_extra["x_embedding"], expected)
    np.testing.assert_array_equal(again["x_embedding"], expected)


def test_identity_default_value_maps_out_of_range():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("x", VOCAB, default_value=0),
        DIM,
        combiner="sum",
    )
    layer = kte.TPUEmbeddingLayer([column])
    out = layer({"x": tf.constant([[100]])})["x_embedding"]
    np.testing.assert_allclose(out[0], layer.table_variable("x").numpy()[0])


def test_weights_must_match_ids():
    column = kte.embedding_column(
        kte.weighted_categorical_column(
            kte.categorical_column_with_identity("x", VOCAB), "w"
        ),
        DIM,
    )
    layer = kte.TPUEmbeddingLayer([column])
    with pytest.raises(ValueError, match="exactly the structure"):
        layer({"x": tf.constant([[1, 2]]), "w": tf.constant([[1.0]])})
    with pytest.raises(tf.errors.InvalidArgumentError, match="row lengths"):
        layer(
            {
                "x": tf.ragged.constant([[1, 2], [3]]),
                "w": tf.ragged.constant([[1.0], [1.0, 2.0]]),
            }
        )
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or inf"):
        layer({"x": tf.constant([[1]]), "w": tf.constant([[np.nan]])})


def _train_steps(layer, batches, grads_out):
    for ids in batches:
        with tf.GradientTape() as tape:
            out = layer({"ids": tf.constant(ids)}, training=True)
            loss = tf.reduce_sum(out["ids_embedding"] * grads_out)
        tape.gradient(loss, layer.trainable_weights)


BATCHES = [
    [[1, 1, 2], [2, 3, -1], [5, -1, -1]],
    [[1, 4, 4], [4, -1, -1], [-1, -1, -1]],
    [[6, 6, 6], [1, 2, 3], [2, -1, -1]],
    [[7, 1, -1], [1, 1, 1], [0, -1, -1]],
    [[3, 3, -1], [5, 6, 7], [4, 4, 2]],
]


@pytest.mark.parametrize("optimizer_name", ["sgd", "adagrad"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_updates_match_numpy_engine_rules(optimizer_name, combiner):
    lr_fn = lambda step: 0.2 / (1.0 + tf.cast(step, tf.float32))  # noqa: E731
    config = kte.EmbeddingConfig(
        optimizer=(
            kte.optimizers.SGD(0.5)
            if optimizer_name == "sgd"
            else kte.optimizers.Adagrad(0.5, initial_accumulator_value=0.2)
        ),
        clipping_limit=0.6,
        gradient_multiplier_fn=lambda step: (
            1.0 + 0.5 * tf.cast(step, tf.float32)
        ),
    )
    column = identity_column(combiner=combiner, learning_rate_fn=lr_fn)
    layer = kte.TPUEmbeddingLayer([column], config=config)
    layer.build()
    table = layer.table_variable("ids").numpy().astype(np.float64)
    accumulator = np.full_like(table, 0.2)
    upstream = np.random.default_rng(0).normal(size=(3, DIM))
    _train_steps(layer, BATCHES, tf.constant(upstream, tf.float32))

    for step, ids in enumerate(BATCHES):
        ones = [[1.0] * len(r) for r in ids]
        # d(output[row]) / d(table[i]) = scale(row) for each occurrence.
        grad = np.zeros_like(table)
        for row, row_ids in enumerate(ids):
            valid = [i for i in row_ids if i >= 0]
            scale = {
                "sum": 1.0,
                "mean": 1.0 / max(len(valid), 1),
                "sqrtn": 1.0 / np.sqrt(max(len(valid), 1)),
            }[combiner]
            for i in valid:
                grad[i] += scale * upstream[row]
        touched = sorted({i for r in ids for i in r if i >= 0})
        grad = np.clip(grad * (1.0 + 0.5 * step), -0.6, 0.6)
        lr = 0.2 / (1.0 + step)
        for i in touched:
            if optimizer_name == "sgd":
                table[i] -= lr * grad[i]
            else:
                accumulator[i] += grad[i] ** 2
                table[i] -= lr * grad[i] / np.sqrt(accumulator[i])
        del ones
    np.testing.assert_allclose(
        layer.table_variable("ids").numpy(), table, atol=1e-6
    )
    assert int(layer.embedding_step.numpy()) == len(BATCHES)
    if optimizer_name == "adagrad":
        np.testing.assert_allclose(
            layer.slot_variables("ids")["accumulators"].numpy(),
            accumulator,
            atol=1e-6,
        )


def test_untouched_rows_stay_put():
    layer = kte.TPUEmbeddingLayer(
        [identity_column()],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(1.0)),
    )
    layer.build()
    before = layer.table_variable("ids").numpy().copy()
    _train_steps(layer, [[[1, 2]]], tf.ones([1, DIM]))
    after = layer.table_variable("ids").numpy()
    changed = np.where(np.any(before != after, axis=1))[0]
    np.testing.assert_array_equal(changed, [1, 2])


@pytest.mark.parametrize("keras_optimizer", ["sgd", "adam", "rmsprop"])
def test_fit_trains_tables_with_any_keras_optimizer(keras_optimizer):
    # Regression: with Adam, Grappler pruned updates that hung on control
    # edges only; the trap now makes them a data dependency.
    layer = kte.TPUEmbeddingLayer(
        [identity_column()],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.1)),
    )
    inputs = {
        "ids": keras.Input((None,), sparse=True, dtype="int64", name="ids")
    }
    model = keras.Model(
        inputs, keras.layers.Dense(1)(layer(inputs)["ids_embedding"])
    )
    model.compile(keras_optimizer, "mse")
    ids = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64) + 1)
    ids = tf.SparseTensor(ids.indices, ids.values - 1, ids.dense_shape)
    dataset = tf.data.Dataset.from_tensors(
        ({"ids": ids}, tf.ones([2, 1]))
    ).repeat(4)
    before = layer.table_variable("ids").numpy().copy()
    model.fit(dataset, epochs=2, verbose=0)
    assert int(layer.embedding_step.numpy()) == 8
    assert int(model.optimizer.iterations.numpy()) == 8
    assert not np.allclose(before[:4], layer.table_variable("ids").numpy()[:4])
    np.testing.assert_array_equal(
        before[4:], layer.table_variable("ids").numpy()[4:]
    )


def test_tables_are_not_trained_by_keras_optimizer():
    layer = kte.TPUEmbeddingLayer([identity_column()])
    layer.build()
    assert [w.name for w in layer.trainable_weights] == ["table_update_trigger"]
    assert "ids" in [w.name for w in layer.non_trainable_weights]


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


def test_large_ids_string_ids_and_int_weights():
    layer = kte.TPUEmbeddingLayer([identity_column("x")])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[0, 8\)"):
        layer({"x": tf.constant([[2**40]], tf.int64)})
    with pytest.raises(TypeError, match="Feature 'x' must hold integer ids"):
        layer({"x": tf.constant([["3"]])})
    weighted = kte.TPUEmbeddingLayer(
        [
            kte.embedding_column(
                kte.weighted_categorical_column(
                    kte.categorical_column_with_identity("x", VOCAB), "w"
                ),
                DIM,
                combiner="sum",
            )
        ]
    )
    as_int = weighted({"x": tf.constant([[1, 2]]), "w": tf.constant([[2, 3]])})
    as_float = weighted(
        {"x": tf.constant([[1, 2]]), "w": tf.constant([[2.0, 3.0]])}
    )
    name = "x_weighted_by_w_embedding"
    np.testing.assert_array_equal(as_int[name], as_float[name])
