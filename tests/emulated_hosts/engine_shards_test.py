"""The engine's tables are saved and restored one host shard at a time.

On a pod each engine table and slot lives as one shard per host
(TF's sharded variable creator). A checkpoint writes each shard as a slice
of the table's full shape, on the host that holds it, and a restore reads
each slice on its host: no table passes whole through one host, and the
keys stay those of a CPU model's whole variables, which read the slices as
one tensor.
"""

import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models
from tests.emulated_hosts.trained_pod import HOSTS
from tests.emulated_hosts.trained_pod import REPLICAS
from tests.emulated_hosts.trained_pod import counted_retrieves
from tests.emulated_hosts.trained_pod import recorded_saves


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


# The Adagrad tests check one training on the pod, `adagrad_pod`
# (`trained_pod.py`, shared with `chip_shards_test.py`): a fit costs tens of
# CPU seconds there.


def test_a_model_checkpoint_on_two_hosts_saves_each_host_shard_there(
    adagrad_pod,
):
    # One retrieve from the chip for the whole save, whatever the tables.
    assert adagrad_pod.save_retrieves == 1
    _assert_saved_per_host(
        adagrad_pod.saves,
        "/embedding_tables",
        ("parameters", "accumulators"),
    )
    # A CPU model reads each table whole, by the same keys.
    cpu = models.build(models.OPTIMIZERS["adagrad"]())
    tf.train.Checkpoint(model=cpu).read(
        adagrad_pod.saved_path
    ).assert_existing_objects_matched()
    models.assert_values_equal(
        models.local_values(cpu), adagrad_pod.saved_values, atol=0
    )


def test_a_model_checkpoint_restores_each_host_shard_onto_the_chip(
    adagrad_pod,
):
    # A one-device checkpoint read into the trained pod model.
    adagrad_pod.restore_status.assert_existing_objects_matched()
    # What the chip holds now: predict reads it, and the values TF
    # retrieves from it are the checkpoint's.
    models.assert_values_equal(
        adagrad_pod.restored_values, adagrad_pod.cpu_values, atol=0
    )
    np.testing.assert_allclose(
        adagrad_pod.restored_predictions,
        adagrad_pod.cpu_predictions,
        atol=1e-6,
    )


def test_engine_checkpoint_on_two_hosts_round_trips(tmp_path):
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        model = models.build_emulated(strategy, "adam")
        model.fit(models.batches(strategy), epochs=1, verbose=0)
        view = kte.engine_checkpoint(model)
        with recorded_saves() as saves, counted_retrieves(model) as calls:
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


def test_a_model_trained_on_two_hosts_exports_in_one_call(adagrad_pod):
    # Exported right after predict (`trained_pod.py`).
    features, _ = next(iter(models.dataset().batch(models.ROWS)))
    serve = tf.saved_model.load(adagrad_pod.export_path).signatures[
        "serving_default"
    ]
    np.testing.assert_allclose(
        serve(**features)["head"].numpy(),
        adagrad_pod.exported_predictions,
        atol=1e-6,
        rtol=0,
    )
