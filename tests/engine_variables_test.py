"""The engine's tables, read from and written to the TPU (the STAND-IN).

A checkpoint of the engine's tables restores into the same model on CPU,
and the CPU tables into a fresh TPU model before its first step
(`lookup/engine_variables.py`).
"""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests.engine_models import BATCH
from tests.engine_models import build_model
from tests.engine_models import examples
from tests.engine_stand_in import StandInTPU


@pytest.fixture
def tpu(monkeypatch):
    return StandInTPU(monkeypatch)


def test_tables_restore_across_tpu_and_cpu_both_ways(
    tpu, tmp_path, monkeypatch
):
    with tpu.strategy.scope():
        tpu_model = build_model()
    data = kte.distribute_dataset(tpu.strategy, examples(), BATCH)
    assert tpu.built_objects == []  # the engine is built by the first step
    tpu_model.fit(data, epochs=1, verbose=0)
    [engine] = tpu.built_objects
    trained = {c.name: t.numpy() for c, t in engine.embedding_tables.items()}
    path = tf.train.Checkpoint(
        embedding=kte.engine_checkpoint(tpu_model)
    ).write(str(tmp_path / "tpu"))

    cpu_model = build_model()
    status = tf.train.Checkpoint(embedding=kte.engine_checkpoint(cpu_model))
    status.read(path).assert_existing_objects_matched()
    for table, values in trained.items():
        layer = "shared" if table == "hist_item_shared_embedding" else "embed"
        np.testing.assert_array_equal(
            cpu_model.get_layer(layer).table_variable(table).numpy(), values
        )
    cpu_model.get_layer("head").set_weights(
        tpu_model.get_layer("head").get_weights()
    )
    batches = list(examples().batch(BATCH))
    on_cpu = np.concatenate([cpu_model.predict_on_batch(x) for x, _ in batches])
    on_tpu = tpu_model.predict(data, verbose=0)
    np.testing.assert_allclose(on_tpu, on_cpu, atol=1e-6)

    # And back: CPU tables into a fresh TPU model, before its first step.
    fresh = StandInTPU(monkeypatch)
    with fresh.strategy.scope():
        second = build_model()
    tf.train.Checkpoint(embedding=kte.engine_checkpoint(second)).read(
        path
    ).assert_existing_objects_matched()
    second.get_layer("head").set_weights(
        tpu_model.get_layer("head").get_weights()
    )
    again = second.predict(
        kte.distribute_dataset(fresh.strategy, examples(), BATCH), verbose=0
    )
    np.testing.assert_allclose(again, on_cpu, atol=1e-6)
