"""`CheckpointCallback`: a TF checkpoint per epoch that restores the
model's weights and its optimizer's state. (`parameter_server_test.py`
saves one on parameter servers and restores it on one device.)"""

import keras
import numpy as np
import tensorflow as tf

from keras_tpu_embed.parameter_server import CheckpointCallback


def _model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def test_each_epoch_is_saved_and_restores_weights_and_optimizer(tmp_path):
    model = _model()
    x, y = np.ones((4, 2), "f4"), np.ones((4, 1), "f4")
    model.fit(
        x, y, epochs=3, verbose=0, callbacks=[CheckpointCallback(tmp_path, 2)]
    )
    latest = tf.train.latest_checkpoint(tmp_path)
    assert latest.endswith("ckpt-3")
    assert (
        len(tf.train.get_checkpoint_state(tmp_path).all_model_checkpoint_paths)
        == 2
    )
    other = _model()
    other.optimizer.build(other.trainable_variables)
    tf.train.Checkpoint(model=other, optimizer=other.optimizer).restore(
        latest
    ).assert_existing_objects_matched()
    for a, b in zip(other.weights, model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(other.optimizer.iterations.numpy()) == 3
