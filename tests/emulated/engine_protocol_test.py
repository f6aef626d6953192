"""One engine step, driven through TF's own `TPUEmbedding` (`"V1"`).

The layers feed the engine as TF's mid-level API requires: one
`TPUEmbedding` for every embedding layer of a model, one named enqueue of
every feature per step, its dequeue inside the gradient trap, one
`apply_gradients` with each table's learning rate and each layer's
gradient multiplier, and the step counted once (`engines/engine_step.py`).
Here TF's own code checks the protocol (its enqueue rules, its output
shapes, its refusal of a second engine object) and the emulated chip
applies the gradients: what the tables hold is what the engine did.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models
from tests.engine_models import BATCH
from tests.engine_models import FEATURES
from tests.engine_models import N
from tests.engine_models import build_model
from tests.engine_models import engine_columns
from tests.engine_models import examples

STEPS = N // BATCH


def _built(strategy):
    keras.utils.set_random_seed(models.SEED)
    with strategy.scope():
        return build_model()


def _engine_tables(model):
    """Every engine table, as TF's own retrieve reads it off the chip."""
    return {
        name: value
        for name, value in models.engine_values(model).items()
        if "/" not in name
    }


@pytest.fixture(scope="module")
def trained():
    """Two layers (a plain, a weighted, a shared and a sequence column) on
    one engine, trained 2 epochs of 4 steps on 2 replicas."""
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = _built(strategy)
        data = kte.distribute_dataset(strategy, examples(), BATCH)
        model.fit(data, epochs=2, verbose=0)
        yield strategy, model, data


def test_both_layers_feed_one_tpu_embedding_every_feature(trained):
    _, model, _ = trained
    engine = model.get_layer("embed").engine.mid_level
    assert isinstance(engine, tf.tpu.experimental.embedding.TPUEmbedding)
    assert engine._built
    for layer in (model.get_layer("embed"), model.get_layer("shared")):
        assert layer.engine.mid_level is engine
        assert layer.local_table_specs == []
    # TF's enqueue asserts the features' structure is its config's: every
    # step enqueued all four features of both layers in one call.
    assert sorted(engine._feature_config) == FEATURES


def test_the_config_is_the_columns_translation(trained):
    _, model, _ = trained
    built = model.get_layer("embed").engine.mid_level._feature_config
    columns, shared = engine_columns()
    expected = {}
    for cols in (columns, shared):
        expected.update(kte.to_tpu_feature_configs(cols))
    assert sorted(built) == sorted(expected) == FEATURES
    for name, feature in built.items():
        want = expected[name]
        assert feature.name == want.name
        assert feature.max_sequence_length == want.max_sequence_length
        for field in ("name", "vocabulary_size", "dim", "combiner"):
            assert getattr(feature.table, field) == getattr(want.table, field)
    # Shared columns share one TableConfig object, as TF requires.
    assert built["item_shared_embedding"].table is (
        built["hist_shared_embedding"].table
    )


def test_fit_trains_once_per_step_evaluate_and_predict_do_not(trained):
    strategy, model, data = trained
    for name in ("embed", "shared"):
        assert int(model.get_layer(name).embedding_step.numpy()) == 2 * STEPS
    assert int(model.optimizer.iterations.numpy()) == 2 * STEPS
    # The chip applied the gradients: every table left its initial values
    # (the same seed builds the same initial tables on CPU).
    fitted = _engine_tables(model)
    keras.utils.set_random_seed(models.SEED)
    untrained = build_model()
    assert sorted(fitted) == [
        "hist_item_shared_embedding",
        "tags_weighted_by_tag_w",
        "user",
    ]
    for name, values in fitted.items():
        layer = "shared" if name == "hist_item_shared_embedding" else "embed"
        initial = untrained.get_layer(layer).table_variable(name).numpy()
        assert initial.shape == values.shape
        assert not np.allclose(initial, values), name
    model.evaluate(data, verbose=0)
    predictions = model.predict(data, verbose=0)
    assert predictions.shape == (N, 1)
    # Evaluate and predict enqueue and dequeue but send no gradients: the
    # tables on the chip and the step count did not move.
    for name, values in _engine_tables(model).items():
        np.testing.assert_array_equal(values, fitted[name], err_msg=name)
    for name in ("embed", "shared"):
        assert int(model.get_layer(name).embedding_step.numpy()) == 2 * STEPS


def test_evaluate_with_another_batch_size_says_why_and_what_to_do(trained):
    """TF fixes the engine's batch at its first step. Keras traces its
    step again for a second batch with the batch unknown
    (`reduce_retracing`), so TPUStrategy's dynamic padding pads the dense
    ids and TF's enqueue refuses them as no direct input. The cause the
    user must hear is the batch: the message names the engine's batch,
    the batches the strategy's datasets were given, and the fix."""
    # Last of the fixture's tests: a refused step ends its use.
    strategy, model, _ = trained
    smaller = kte.distribute_dataset(strategy, examples(), BATCH // 2)
    for run in (model.evaluate, model.predict):
        with pytest.raises(
            ValueError,
            match=r"(?s)per-replica batch of 4 \(global 8 over 2 replicas\)"
            r".*per-replica batches \[2, 4\].*same global_batch_size",
        ):
            run(smaller, verbose=0)


def _one_column_model(strategy, column, key):
    """`column` alone, fed `[batch, 1]` dense ids of feature `key`."""
    with strategy.scope():
        layer = kte.TPUEmbeddingLayer([column])
        inputs = {key: keras.Input((1,), dtype="int64", name=key)}
        return keras.Model(inputs, layer(inputs)[f"{key}_embedding"])


def test_dense_batch_by_one_ids_give_batch_by_dim():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4
    )
    ids = tf.constant([[3], [5], [7], [9]], tf.int64)
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = _one_column_model(strategy, column, "user")
        out = model.predict(
            kte.distribute_dataset(
                strategy, tf.data.Dataset.from_tensor_slices({"user": ids}), 4
            ),
            verbose=0,
        )
    # TF's dequeue gives [batch, dim] for [batch, 1] ids (its own output
    # shape logic, run here); the layer passes it through unchanged.
    assert out.shape == (4, 4)
    cpu = kte.TPUEmbeddingLayer([column])({"user": ids})["user_embedding"]
    assert cpu.shape == (4, 4)


def test_dense_ids_of_a_sequence_feature_are_refused_at_trace_time():
    # TF's engine would combine them into [batch, dim] (one id per example).
    column = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("hist", 20),
        4,
        max_sequence_length=3,
    )
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = _one_column_model(strategy, column, "hist")
        data = kte.distribute_dataset(
            strategy,
            tf.data.Dataset.from_tensor_slices(
                {"hist": tf.constant([[3], [5], [7], [9]], tf.int64)}
            ),
            4,
        )
        with pytest.raises(
            ValueError, match="'hist_embedding' reaches the TPU"
        ):
            model.predict(data, verbose=0)


def test_a_second_engine_object_fails_with_advice():
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
            columns, _ = engine_columns()
            # The user's own TPUEmbedding, built: TF configures the chip.
            theirs = tf.tpu.experimental.embedding.TPUEmbedding(
                kte.to_tpu_feature_configs(columns[:1]),
                tf.tpu.experimental.embedding.SGD(0.1),
            )
            theirs.build(
                per_replica_input_shapes={
                    "user_embedding": tf.TensorShape([4, 1])
                }
            )
            model = build_model()
        data = kte.distribute_dataset(strategy, examples(), BATCH)
        # TF's own build refuses a second engine on the TPU system
        # ("TPU is already initialized for embeddings"); the layers say
        # what to do instead.
        with pytest.raises(RuntimeError, match="do not build your own"):
            model.fit(data, epochs=1, verbose=0)


def test_learning_rates_and_multipliers_reach_the_engine():
    """Three tables on one engine: one trained, one whose column's
    learning rate is 0, one whose layer's gradient multiplier is 0. Only
    the first may move on the chip."""

    def column(key, **kwargs):
        return kte.embedding_column(
            kte.categorical_column_with_identity(key, 20), 4, **kwargs
        )

    keys = ("user", "frozen", "muted")
    ids = np.arange(16, dtype=np.int64)[:, None] % 20
    data = tf.data.Dataset.from_tensor_slices(
        ({key: ids for key in keys}, np.ones((16, 1), np.float32))
    )
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
            inputs = {
                key: keras.Input((1,), dtype="int64", name=key) for key in keys
            }
            sgd = kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.5))
            own = kte.TPUEmbeddingLayer(
                [
                    column("user"),
                    column("frozen", learning_rate_fn=lambda s: 0.0),
                ],
                config=sgd,
                output="concat",
                name="embed",
            )(inputs)
            muted = kte.TPUEmbeddingLayer(
                [column("muted")],
                config=kte.EmbeddingConfig(
                    optimizer=kte.optimizers.SGD(0.5),
                    gradient_multiplier_fn=lambda step: 0.0,
                ),
                output="concat",
                name="muted_layer",
            )(inputs)
            joined = keras.layers.Concatenate()([own, muted])
            model = keras.Model(inputs, keras.layers.Dense(1)(joined))
            model.compile(optimizer="sgd", loss="mse")
        batches = kte.distribute_dataset(strategy, data, 8)
        model.fit(batches, epochs=1, verbose=0)  # TF creates the tables
        before = _engine_tables(model)
        model.fit(batches, epochs=1, verbose=0)
        after = _engine_tables(model)
    moved = {
        name: bool(np.abs(after[name] - before[name]).max() > 0)
        for name in before
    }
    assert moved == {"user": True, "frozen": False, "muted": False}


def test_a_layer_with_engine_and_local_tables_counts_one_step_per_step():
    # learning_rate_fns read embedding_step; counted twice per step, every
    # schedule would run twice as fast. This one trains for 4 steps.
    on_engine = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20),
        4,
        learning_rate_fn=lambda step: tf.where(step < 4, 0.5, 0.0),
    )
    on_tensor_core = kte.embedding_column(
        kte.categorical_column_with_identity("item", 20),
        4,
        embedding_lookup_device="tpu_tensor_core",
        tensor_core_shape=[None, 1],
    )
    ids = np.arange(16, dtype=np.int64)[:, None] % 20
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
            inputs = {
                "user": keras.Input((1,), dtype="int64", name="user"),
                "item": keras.Input((1,), dtype="int64", name="item"),
            }
            layer = kte.TPUEmbeddingLayer(
                [on_engine, on_tensor_core], output="concat", name="embed"
            )
            model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
            model.compile(optimizer="sgd", loss="mse")
        assert [t.name for t in layer.local_table_specs] == ["item"]
        assert layer.engine is not None
        data = kte.distribute_dataset(
            strategy,
            tf.data.Dataset.from_tensor_slices(
                ({"user": ids, "item": ids}, np.ones((16, 1), np.float32))
            ),
            8,
        )
        snapshots = []
        for epoch in range(3):  # 2 steps per epoch
            model.fit(data, epochs=1, verbose=0)
            snapshots.append(_engine_tables(model)["user"])
            assert int(layer.embedding_step.numpy()) == 2 * (epoch + 1)
    moved = [
        bool(np.abs(b - a).max() > 0) for a, b in zip(snapshots, snapshots[1:])
    ]
    # Steps 0-3 train (epochs 1 and 2), steps 4-5 do not (epoch 3).
    assert moved == [True, False]
