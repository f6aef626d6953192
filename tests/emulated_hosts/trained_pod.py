"""The Adagrad model of `tests/emulated/models.py` trained once on the pod.

Tracing a Keras `fit` under TF's TPUStrategy and TPUEmbedding on the pod
costs tens of CPU seconds, and `chip_shards_test.py` and
`engine_shards_test.py` each trained this same model (seeded, so the
same values) to check a different thing of it: what the chip holds, a
checkpoint saved per host, a checkpoint restored onto the chip, an export.
`pod_test.py`'s fit of it for two epochs, compared with one device, is
the same training too. `train_adagrad_pod` trains it once and records all
of them, in the order that keeps each check as strict as it was alone:
the fit of two epochs first, from the seeded initial values; every save
the first read of the chip after a training step (so a save that failed
to read the chip would write stale values); the restore last.
"""

import contextlib
import types
import warnings

import numpy as np
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as keras_tf_trainer
from tensorflow.python.checkpoint import functional_saver

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

HOSTS = 2
REPLICAS = 4


@contextlib.contextmanager
def recorded_saves():
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
def counted_retrieves(model):
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


def distinct_rows(strategy):
    """32 examples, no two with the same ids: any permutation would show."""
    rows = np.arange(32, dtype=np.int64)[:, None]
    examples = tf.data.Dataset.from_tensor_slices(
        ({"user": rows % 20, "item": rows % 15}, np.zeros((32, 1), "float32"))
    )
    return kte.distribute_dataset(strategy, examples, models.GLOBAL_BATCH)


def _chip_shards(strategy):
    """What the emulated chip holds of each table, per host shard: its
    host, rows, and each slot's variable device and values."""
    held = {}
    for table in strategy.emulated_chip.tables:
        held[table.name] = [
            types.SimpleNamespace(
                host=shard.host,
                rows=shard.rows,
                devices={
                    slot: variable.device
                    for slot, variable in shard.variables.items()
                },
                values={
                    slot: variable.numpy()
                    for slot, variable in shard.variables.items()
                },
            )
            for _, shard in sorted(table.shards.items())
        ]
    return held


def _cpu_checkpoint(directory):
    """The reference the restore reads: one device, one epoch, saved."""
    cpu = models.one_device("adagrad", epochs=1)
    path = tf.train.Checkpoint(model=cpu).write(str(directory / "cpu"))
    predictions = cpu.predict(
        models.batches(tf.distribute.get_strategy()), verbose=0
    )
    return path, models.local_values(cpu), predictions


def fit_two_epochs(strategy, model):
    """`pod_test.py`'s fit: two epochs, no steps per epoch (Keras counts
    them), its warnings recorded; then the tables, step, head and the
    predictions of `distinct_rows`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(models.batches(strategy), epochs=2, verbose=0)
    return types.SimpleNamespace(
        multi_host=keras_tf_trainer._is_tpu_multi_host(strategy),
        on_the_engine=model.get_layer("embed").engine is not None,
        warnings=[str(w.message) for w in caught],
        values=models.table_values(model),
        step=int(model.get_layer("embed").embedding_step.numpy()),
        head=model.get_layer("head").get_weights(),
        predictions=model.predict(distinct_rows(strategy), verbose=0),
    )


def train_adagrad_pod(directory):
    """Trains the Adagrad model on the pod and records, in this order:

    1. `fit(epochs=2)` as `pod_test.py` checks it (`fit_two_epochs`);
    2. after a third epoch, a `tf.train.Checkpoint(model=...)` written
       with its `SaveV2` calls and chip retrieves recorded, then the values
       TF retrieves from the chip and what the chip holds per host shard;
    3. after a fourth epoch, `predict` and `kte.export_saved_model`;
    4. the one-device checkpoint read into the model, then `predict` and
       the values TF retrieves from the chip.
    """
    cpu_path, cpu_values, cpu_predictions = _cpu_checkpoint(directory)
    export_path = str(directory / "serving")
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        model = models.build_emulated(strategy, "adagrad")
        two_epochs = fit_two_epochs(strategy, model)

        model.fit(models.batches(strategy), epochs=1, verbose=0)
        with recorded_saves() as saves, counted_retrieves(model) as calls:
            saved_path = tf.train.Checkpoint(model=model).write(
                str(directory / "pod")
            )
        saved_values = models.engine_values(model)
        chip_shards = _chip_shards(strategy)

        model.fit(models.batches(strategy), epochs=1, verbose=0)
        exported_predictions = model.predict(
            models.batches(strategy), verbose=0
        )
        kte.export_saved_model(model, export_path, inputs="ids", verbose=False)

        # Its `assert_existing_objects_matched` is the restore test's.
        restore_status = tf.train.Checkpoint(model=model).read(cpu_path)
        restored_predictions = model.predict(
            models.batches(strategy), verbose=0
        )
        restored_values = models.engine_values(model)
    return types.SimpleNamespace(
        two_epochs=two_epochs,
        saves=saves,
        save_retrieves=len(calls),
        saved_path=saved_path,
        saved_values=saved_values,
        chip_shards=chip_shards,
        exported_predictions=exported_predictions,
        export_path=export_path,
        restore_status=restore_status,
        cpu_values=cpu_values,
        cpu_predictions=cpu_predictions,
        restored_predictions=restored_predictions,
        restored_values=restored_values,
    )
