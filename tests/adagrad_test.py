"""Adagrad and Adagrad with momentum, as the TPU embedding engine runs them."""

import math

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: kte.optimizers.Adagrad(initial_accumulator_value=0),
            "initial_accumulator_value",
        ),
        (lambda: kte.optimizers.AdagradMomentum(exponent=0), "exponent"),
        (lambda: kte.optimizers.AdagradMomentum(epsilon=-1.0), "epsilon"),
    ],
)
def test_invalid_arguments(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_adagrad_update_by_hand():
    rows, slots = kte.optimizers.Adagrad().update(
        tf.constant([[1.0]]),
        {"accumulators": tf.constant([[0.5]])},
        tf.constant([[0.5]]),
        tf.constant(0.1),
    )
    np.testing.assert_allclose(slots["accumulators"], [[0.75]])
    np.testing.assert_allclose(
        rows, [[1.0 - 0.1 * 0.5 / math.sqrt(0.75)]], rtol=1e-6
    )


@pytest.mark.parametrize(
    "name", ["adagrad", "adagrad_momentum", "adagrad_momentum_nesterov"]
)
def test_update_matches_numpy(name):
    testing.assert_update_matches_numpy(testing.OPTIMIZER_CASES[name])


def test_slots_and_zero_gradients():
    assert [s.name for s in kte.optimizers.Adagrad.SLOTS] == ["accumulators"]
    assert [s.name for s in kte.optimizers.AdagradMomentum.SLOTS] == [
        "accumulators",
        "momenta",
    ]
    # The momentum keeps moving a row whose gradient is zero.
    assert kte.optimizers.Adagrad.zero_gradient_is_noop
    assert not kte.optimizers.AdagradMomentum.zero_gradient_is_noop
