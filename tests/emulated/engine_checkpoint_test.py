"""Finding 4: `tf.train.Checkpoint(embedding=kte.engine_checkpoint(model))`
on the engine reads the TPU when it saves and writes the TPU when it
restores, whoever wrote the file.

TF runs its retrieve-before-save and load-after-restore hooks only for the
mid-level object itself, and the load only for files a mid-level object
wrote (`tpu_embedding_v2.py`, the "TPUEmbeddingCallback" saver). A view of
the mid-level object's host copies saved their stale values, and a file
written on CPU never reached the TPU after its first step.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models
from tests.emulated.save_paths_test import _mixed_model


def _values_in(path, names):
    """`<table>` / `<table>/<slot>` as written in the checkpoint."""
    return {
        name: tf.train.load_variable(
            path,
            f"embedding/{name.replace('/', '.S')}/.ATTRIBUTES/VARIABLE_VALUE",
        )
        for name in names
    }


def test_a_cpu_checkpoint_read_after_the_first_step_reaches_the_tpu(
    tmp_path,
):
    cpu = models.trained_one_device("adagrad", epochs=1)
    path = tf.train.Checkpoint(embedding=kte.engine_checkpoint(cpu)).write(
        str(tmp_path / "cpu")
    )
    with emulated_tpu(2) as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.fit(models.batches(strategy), steps_per_epoch=1, verbose=0)
        before = models.engine_values(model)
        tf.train.Checkpoint(embedding=kte.engine_checkpoint(model)).read(
            path
        ).assert_existing_objects_matched()
        after = models.engine_values(model)
    expected = models.local_values(cpu)
    assert not np.allclose(before["user"], expected["user"])
    models.assert_values_equal(after, expected)


def test_a_mixed_model_checkpoints_the_tables_on_the_tpu(tmp_path):
    with emulated_tpu(2) as strategy:
        keras.utils.set_random_seed(models.SEED)
        with strategy.scope():
            model = _mixed_model(kte.optimizers.Adagrad(0.1))
        model.fit(models.batches(strategy), steps_per_epoch=1, verbose=0)
        first = models.engine_values(model)
        model.fit(models.batches(strategy), steps_per_epoch=3, verbose=0)
        # No read of the engine in between: the host copies are as TF left
        # them after the first read.
        path = tf.train.Checkpoint(
            embedding=kte.engine_checkpoint(model)
        ).write(str(tmp_path / "mixed"))
        trained = models.engine_values(model)
    assert not np.allclose(first["user"], trained["user"])
    models.assert_values_equal(_values_in(path, trained), trained)


def test_a_checkpoint_before_the_first_step_is_refused(tmp_path):
    """TF creates the engine's tables at the first step: a save before it
    wrote a checkpoint without them."""
    with emulated_tpu(2) as strategy:
        model = models.build_emulated(strategy, "adagrad")
        checkpoint = tf.train.Checkpoint(embedding=kte.engine_checkpoint(model))
        with pytest.raises(ValueError, match="first step"):
            checkpoint.write(str(tmp_path / "early"))
