"""One engine step against the recording STAND-IN (not a TPU).

One named enqueue of every feature of every layer per step, its dequeue
inside the gradient trap, one `apply_gradients` with each layer's learning
rate and gradient multiplier, the step counted once, and TF's enqueue
errors turned into ones that say what to do (`lookup/engine_step.py`).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests.engine_models import BATCH
from tests.engine_models import FEATURES
from tests.engine_models import N
from tests.engine_models import build_model
from tests.engine_models import engine_columns
from tests.engine_models import examples
from tests.engine_models import single_table_model
from tests.engine_models import user_examples
from tests.engine_stand_in import RecordingTPUEmbedding
from tests.engine_stand_in import StandInTPU


@pytest.fixture
def tpu(monkeypatch):
    return StandInTPU(monkeypatch)


def test_fit_evaluate_predict_drive_one_engine(tpu):
    with tpu.strategy.scope():
        model = build_model()
    data = kte.distribute_dataset(tpu.strategy, examples(), BATCH)
    model.fit(data, epochs=2, verbose=0)
    [engine] = tpu.built_objects
    # One named enqueue of every feature of both layers, its dequeue and
    # one apply_gradients, traced once and run once per step (4 per epoch).
    assert engine.events == [
        ("enqueue", "keras_tpu_embed_step_1", tuple(FEATURES)),
        ("dequeue", "keras_tpu_embed_step_1", ()),
        ("apply_gradients", "keras_tpu_embed_step_1", ()),
    ]
    assert {k: int(v) for k, v in engine.runs.items()} == {
        "enqueue": 8,
        "dequeue": 8,
        "apply_gradients": 8,
    }
    model.evaluate(data, verbose=0)
    predictions = model.predict(data, verbose=0)
    assert predictions.shape == (N, 1)
    assert {k: int(v) for k, v in engine.runs.items()} == {
        "enqueue": 16,
        "dequeue": 16,
        "apply_gradients": 8,  # evaluate and predict send no gradients
    }
    for layer in (model.get_layer("embed"), model.get_layer("shared")):
        assert layer.engine.mid_level is engine
        assert int(layer.embedding_step.numpy()) == 8
        assert layer.local_table_specs == []


def test_evaluate_with_another_batch_size_says_why_and_what_to_do(tpu):
    with tpu.strategy.scope():
        model = build_model()
    model.fit(
        kte.distribute_dataset(tpu.strategy, examples(), BATCH),
        epochs=1,
        verbose=0,
    )
    smaller = kte.distribute_dataset(tpu.strategy, examples(), BATCH // 2)
    for run in (model.evaluate, model.predict):
        with pytest.raises(
            ValueError,
            match=r"per-replica batch of 8 .* this step feeds 4\b.* same "
            r"global_batch_size",
        ):
            run(smaller, verbose=0)


def test_dense_batch_by_one_ids_give_batch_by_dim(tpu):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4
    )
    with tpu.strategy.scope():
        layer = kte.TPUEmbeddingLayer([column])
        inputs = {"user": keras.Input((1,), dtype="int64", name="user")}
        model = keras.Model(inputs, layer(inputs)["user_embedding"])
    ids = tf.constant([[3], [5], [7]], tf.int64)
    out = model.predict(
        kte.distribute_dataset(
            tpu.strategy,
            tf.data.Dataset.from_tensor_slices({"user": ids}),
            3,
        ),
        verbose=0,
    )
    # TF's dequeue gives [batch, dim] for [batch, 1] ids (the stand-in uses
    # TF's shape logic); the layer passes it through unchanged.
    assert out.shape == (3, 4)
    cpu = kte.TPUEmbeddingLayer([column])({"user": ids})["user_embedding"]
    assert cpu.shape == (3, 4)


def test_dense_ids_of_a_sequence_feature_are_refused_at_trace_time(tpu):
    # TF's engine would combine them into [batch, dim] (one id per example).
    column = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("hist", 20),
        4,
        max_sequence_length=3,
    )
    with tpu.strategy.scope():
        layer = kte.TPUEmbeddingLayer([column])
        inputs = {"hist": keras.Input((1,), dtype="int64", name="hist")}
        model = keras.Model(inputs, layer(inputs)["hist_embedding"])
    data = kte.distribute_dataset(
        tpu.strategy,
        tf.data.Dataset.from_tensor_slices(
            {"hist": tf.constant([[3], [5], [7]], tf.int64)}
        ),
        3,
    )
    with pytest.raises(ValueError, match="'hist_embedding' reaches the TPU"):
        model.predict(data, verbose=0)


def test_a_second_engine_object_fails_with_advice(tpu):
    with tpu.strategy.scope():
        columns, _ = engine_columns()
        theirs = RecordingTPUEmbedding(kte.to_tpu_feature_configs(columns))
        theirs.build()
        model = build_model()
    data = kte.distribute_dataset(tpu.strategy, examples(), BATCH)
    with pytest.raises(RuntimeError, match="do not build your own"):
        model.fit(data, epochs=1, verbose=0)


@pytest.mark.parametrize(
    "column_kwargs, config_kwargs, moves",
    [
        ({}, {}, True),
        ({"learning_rate_fn": lambda step: 0.0}, {}, False),
        ({}, {"gradient_multiplier_fn": lambda step: 0.0}, False),
    ],
)
def test_learning_rate_and_multiplier_reach_the_engine(
    tpu, column_kwargs, config_kwargs, moves
):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4, **column_kwargs
    )
    config = kte.EmbeddingConfig(
        optimizer=kte.optimizers.SGD(0.5), **config_kwargs
    )
    with tpu.strategy.scope():
        model = single_table_model(column, config)
    data = kte.distribute_dataset(tpu.strategy, user_examples(), 8)
    model.fit(data, epochs=1, verbose=0)  # builds the engine
    [engine] = tpu.built_objects
    [table] = engine.embedding_tables.values()
    before = table.numpy()
    model.fit(data, epochs=1, verbose=0)
    assert (np.abs(table.numpy() - before).max() > 0) == moves


def test_a_layer_with_engine_and_local_tables_counts_one_step_per_step(tpu):
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
    with tpu.strategy.scope():
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
    ids = np.arange(16, dtype=np.int64)[:, None] % 20
    data = kte.distribute_dataset(
        tpu.strategy,
        tf.data.Dataset.from_tensor_slices(
            ({"user": ids, "item": ids}, np.ones((16, 1), np.float32))
        ),
        8,
    )
    snapshots = []
    for epoch in range(3):  # 2 steps per epoch
        model.fit(data, epochs=1, verbose=0)
        [engine] = tpu.built_objects
        [table] = engine.embedding_tables.values()
        snapshots.append(table.numpy())
        assert int(layer.embedding_step.numpy()) == 2 * (epoch + 1)
    moved = [
        bool(np.abs(b - a).max() > 0) for a, b in zip(snapshots, snapshots[1:])
    ]
    # Steps 0-3 train (epochs 1 and 2), steps 4-5 do not (epoch 3).
    assert moved == [True, False]
