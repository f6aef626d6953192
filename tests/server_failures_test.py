"""A parameter server that fails is named, with what to do; other errors
pass unchanged. (`parameter_server_test.py` kills a worker on a real
cluster.)"""

import keras
import pytest
import tensorflow as tf

from keras_tpu_embed.parameter_server.server_failures import reported_failures


def _model():
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


def test_an_unreachable_parameter_server_is_named_with_the_recovery():
    lost = tf.errors.UnavailableError(
        None, None, "Socket closed: /job:ps/replica:0/task:1 is gone"
    )
    with pytest.raises(RuntimeError, match="/job:ps/task:1") as error:
        with reported_failures(_model()):
            raise lost
    assert "restore the last checkpoint" in str(error.value)
    assert error.value.__cause__ is lost


def test_other_unavailable_errors_pass_unchanged():
    worker = tf.errors.UnavailableError(None, None, "/job:worker/task:0")
    with pytest.raises(tf.errors.UnavailableError) as error:
        with reported_failures(_model()):
            raise worker
    assert error.value is worker
