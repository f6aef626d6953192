"""Stochastic gradient descent, as the TPU embedding engine runs it."""

import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing


def test_update_subtracts_learning_rate_times_gradient():
    rows, slots = kte.optimizers.SGD().update(
        tf.constant([[1.0, 2.0]]),
        {},
        tf.constant([[0.5, -1.0]]),
        tf.constant(0.1),
    )
    np.testing.assert_allclose(rows, [[0.95, 2.1]], rtol=1e-6)
    assert slots == {}


def test_update_matches_numpy():
    testing.assert_update_matches_numpy(testing.OPTIMIZER_CASES["sgd"])


def test_no_slots_and_a_zero_gradient_changes_nothing():
    assert kte.optimizers.SGD.SLOTS == ()
    assert kte.optimizers.SGD.zero_gradient_is_noop
    assert not kte.optimizers.SGD().updates_all_rows()
    twin = kte.optimizers.SGD(0.2).to_tpu()
    assert type(twin) is tf.tpu.experimental.embedding.SGD
    assert twin.learning_rate == 0.2
