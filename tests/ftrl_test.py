"""Follow-the-regularized-leader, as the TPU embedding engine runs it."""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: kte.optimizers.FTRL(learning_rate_power=0.5),
            "learning_rate_power",
        ),
        (
            lambda: kte.optimizers.FTRL(l1_regularization_strength=-1.0),
            "l1_regularization_strength",
        ),
    ],
)
def test_invalid_arguments(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("name", ["ftrl", "ftrl_linear_by_lr"])
def test_update_matches_numpy(name):
    testing.assert_update_matches_numpy(testing.OPTIMIZER_CASES[name])


@pytest.mark.parametrize("linear_by_learning_rate", [False, True])
def test_strong_l1_makes_weights_exactly_zero(linear_by_learning_rate):
    optimizer = kte.optimizers.FTRL(
        0.5,
        l1_regularization_strength=10.0,
        multiply_linear_by_learning_rate=linear_by_learning_rate,
    )
    rows, slots = optimizer.update(
        tf.constant([[0.3, -0.2]]),
        {
            "accumulators": tf.constant([[0.1, 0.1]]),
            "linears": tf.constant([[0.0, 0.0]]),
        },
        tf.constant([[0.4, -0.6]]),
        tf.constant(0.5),
    )
    np.testing.assert_array_equal(rows, [[0.0, 0.0]])
    np.testing.assert_allclose(slots["accumulators"], [[0.26, 0.46]])
