"""The engine's tables are saved and restored one host shard at a time.

On a pod each engine table and slot lives as one shard per host
(TF's sharded variable creator). A checkpoint writes each shard as a slice
of the table's full shape, on the host that holds it, and a restore reads
each slice on its host: no table passes whole through one host, and the
keys stay those of a CPU model's whole variables, which read the slices as
one tensor.
"""

import contextlib

import numpy as np
import tensorflow as tf
from tensorflow.python.checkpoint import functional_saver

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

HOSTS = 2
REPLICAS = 4


@contextlib.contextmanager
def _recorded_saves():
    """Each `SaveV2` TF builds for a checkpoint: (device, {key: slice})."""
    saves = []
    original = functional_saver.io_ops.save_v2

    def save_v2(prefix, tensor_names, shape_and_slices, tensors, name=None):
        # A constant made here takes the device TF saves this shard on.
        device = tf.constant(0).device
        saves.append((device, dict(zip(tensor_names, shape_and_slices))))
        return original(prefix, tensor_names, shape_and_slices, tensors, name)

    functional_saver.io_ops.save_v2 = save_v2
    try:
        yield saves
    finally:
        functional_saver.io_ops.save_v2 = original


@contextlib.contextmanager
def _counted_retrieves(model):
    """How often TF's mid-level object retrieves its tables from the chip."""
    mid_level = model.get_layer("embed").engine.mid_level
    original = mid_level._retrieve_variables
    calls = []

    def retrieve():
        calls.append(1)
        return original()

    mid_level._retrieve_variables = retrieve
    try:
        yield calls
    finally:
        mid_level._retrieve_variables = original


def _slices_by_key(saves):
    """`{key: [(task, slice spec), ...]}` of the recorded saves."""
    slices = {}
    for device, keys in saves:
        task = tf.DeviceSpec.from_string(device).task
        for key, spec in keys.items():
            key = key.split("/.ATTRIBUTES")[0]
            slices.setdefault(key, []).append((task, spec))
    return slices


def _assert_saved_per_host(saves, container, slots):
    """Each table and slot saved as one slice per host, on that host.

    "user" has 20 rows: 10 per host; "item" 15: 8 and 7 (TF's rule).
    """
    slices = _slices_by_key(saves)
    for table, rows, dim in (("user", (10, 10), 4), ("item", (8, 7), 3)):
        full = rows[0] + rows[1]
        for slot in slots:
            name = table if slot == "parameters" else f"{table}.S{slot}"
            (key,) = [k for k in slices if k.endswith(f"{container}/{name}")]
            assert sorted(slices[key]) == [
                (0, f"{full} {dim} 0,{rows[0]}:0,{dim}"),
                (1, f"{full} {dim} {rows[0]},{rows[1]}:0,{dim}"),
            ], (table, slot, slices)


def test_a_model_checkpoint_on_two_hosts_saves_each_host_shard_there(
    tmp_path,
):
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.fit(models.batches(strategy), epochs=1, verbose=0)
        with _recorded_saves() as saves, _counted_retrieves(model) as calls:
            path = tf.train.Checkpoint(model=model).write(str(tmp_path / "pod"))
        trained = models.engine_values(model)
    # One retrieve from the chip for the whole save, whatever the tables.
    assert len(calls) == 1
    _assert_saved_per_host(
        saves,
        "/embedding_tables",
        ("parameters", "accumulators"),
    )
    # A CPU model reads each table whole, by the same keys.
    cpu = models.build(models.OPTIMIZERS["adagrad"]())
    tf.train.Checkpoint(model=cpu).read(path).assert_existing_objects_matched()
    models.assert_values_equal(models.local_values(cpu), trained, atol=0)


def test_a_model_checkpoint_restores_each_host_shard_onto_the_chip(
    tmp_path,
):
    cpu = models.one_device("adagrad", epochs=1)
    expected = models.local_values(cpu)
    path = tf.train.Checkpoint(model=cpu).write(str(tmp_path / "cpu"))
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.fit(models.batches(strategy), epochs=1, verbose=0)
        status = tf.train.Checkpoint(model=model).read(path)
        status.assert_existing_objects_matched()
        # What the chip holds now: predict reads it, and the values TF
        # retrieves from it are the checkpoint's.
        predictions = model.predict(models.batches(strategy), verbose=0)
        models.assert_values_equal(
            models.engine_values(model), expected, atol=0
        )
    np.testing.assert_allclose(
        predictions,
        cpu.predict(models.batches(tf.distribute.get_strategy()), verbose=0),
        atol=1e-6,
    )


def test_engine_checkpoint_on_two_hosts_round_trips(tmp_path):
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        model = models.build_emulated(strategy, "adam")
        model.fit(models.batches(strategy), epochs=1, verbose=0)
        view = kte.engine_checkpoint(model)
        with _recorded_saves() as saves, _counted_retrieves(model) as calls:
            path = tf.train.Checkpoint(embedding=view).write(
                str(tmp_path / "e")
            )
        saved = models.engine_values(model)
        model.fit(models.batches(strategy), epochs=1, verbose=0)
        assert not np.allclose(
            models.engine_values(model)["user"], saved["user"]
        )
        kte.restore_tables(model, path)
        models.assert_values_equal(models.engine_values(model), saved, atol=0)
    assert len(calls) == 1
    _assert_saved_per_host(
        saves, "embedding", ("parameters", "momenta", "velocities")
    )


def test_a_model_trained_on_two_hosts_exports_in_one_call(tmp_path):
    path = str(tmp_path / "serving")
    features, _ = next(iter(models.dataset().batch(models.ROWS)))
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.fit(models.batches(strategy), epochs=2, verbose=0)
        predicted = model.predict(models.batches(strategy), verbose=0)
        kte.export_saved_model(model, path, inputs="ids", verbose=False)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    np.testing.assert_allclose(
        serve(**features)["head"].numpy(), predicted, atol=1e-6, rtol=0
    )
