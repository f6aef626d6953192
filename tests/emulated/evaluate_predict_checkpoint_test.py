"""evaluate, predict and checkpoints of a model trained under emulation.

One Adagrad model is trained under `emulated_tpu(2)` (the engine, V1) and
one on one device, on the same global batches; then, still under the
emulation, evaluate and predict must equal one device, and the engine's
tables reach a CPU model through
`tf.train.Checkpoint(embedding=kte.engine_checkpoint(model))`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models


@pytest.fixture(scope="module")
def trained():
    expected = models.trained_one_device("adagrad")
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.fit(models.batches(strategy), epochs=2, verbose=0)
        yield strategy, model, expected


def test_evaluate_equals_one_device(trained):
    strategy, model, expected = trained
    loss = model.evaluate(models.batches(strategy), verbose=0)
    wanted = expected.evaluate(
        models.batches(tf.distribute.get_strategy()), verbose=0
    )
    np.testing.assert_allclose(loss, wanted, rtol=1e-5)
    # Evaluation does not train: the engine's tables did not move.
    assert int(model.get_layer("embed").embedding_step.numpy()) == 8
    models.assert_values_equal(
        models.engine_values(model), models.local_values(expected)
    )


def test_predict_equals_one_device_in_input_order(trained):
    strategy, model, expected = trained
    predictions = model.predict(models.batches(strategy), verbose=0)
    wanted = expected.predict(
        models.batches(tf.distribute.get_strategy()), verbose=0
    )
    assert predictions.shape == (models.ROWS, 1)
    np.testing.assert_allclose(predictions, wanted, atol=1e-5, rtol=0)


def test_engine_checkpoint_restores_into_a_cpu_model(trained, tmp_path):
    strategy, model, expected = trained
    path = tf.train.Checkpoint(embedding=kte.engine_checkpoint(model)).write(
        str(tmp_path / "engine")
    )
    # A fresh one-device model, initialized differently.
    keras.utils.set_random_seed(7)
    cpu = models.build(models.OPTIMIZERS["adagrad"]())
    assert not np.allclose(
        models.local_values(cpu)["user"], models.local_values(expected)["user"]
    )
    status = tf.train.Checkpoint(embedding=kte.engine_checkpoint(cpu)).read(
        path
    )
    status.assert_existing_objects_matched()
    models.assert_values_equal(
        models.local_values(cpu), models.engine_values(model)
    )
    models.assert_values_equal(
        models.local_values(cpu), models.local_values(expected)
    )
