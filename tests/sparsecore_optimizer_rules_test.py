"""The per-row rules of the emulated SparseCore against TF's own kernels.

Where the SparseCore's rule and a TF training kernel are the same maths
(Adam with no bias correction: beta powers of 0; FTRL with `beta` 0),
the rule must give the kernel's rows and slots.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu.ops import gen_xla_ops

from keras_tpu_embed.testing import sparsecore_optimizer_rules as rules

RATE = 0.3


def _rows():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(3, 4)).astype(np.float32)
    gradient = rng.normal(size=(3, 4)).astype(np.float32)
    positive = rng.uniform(0.1, 1.0, size=(3, 4)).astype(np.float32)
    return table, gradient, positive


def _rule(kind, gradient, slots, hp):
    rule, _ = rules.OPTIMIZER_RULES[kind]
    out = rule(
        tf.constant(gradient),
        [tf.constant(slot) for slot in slots],
        tf.constant(RATE),
        hp,
    )
    return [value.numpy() for value in out]


def test_sgd_is_tf_gradient_descent():
    table, gradient, _ = _rows()
    var = tf.Variable(table)
    tf.raw_ops.ResourceApplyGradientDescent(
        var=var.handle, alpha=tf.constant(RATE), delta=gradient
    )
    (got,) = _rule("sgd", gradient, [table], {})
    np.testing.assert_allclose(got, var.numpy(), rtol=1e-6)


def test_adagrad_is_tf_adagrad_without_epsilon():
    table, gradient, accumulator = _rows()
    var, acc = tf.Variable(table), tf.Variable(accumulator)
    tf.raw_ops.ResourceApplyAdagradV2(
        var=var.handle,
        accum=acc.handle,
        lr=tf.constant(RATE),
        epsilon=tf.constant(0.0),
        grad=gradient,
    )
    got = _rule("adagrad", gradient, [table, accumulator], {})
    np.testing.assert_allclose(got[0], var.numpy(), rtol=1e-5)
    np.testing.assert_allclose(got[1], acc.numpy(), rtol=1e-6)


def test_adam_is_tf_adam_without_bias_correction():
    table, gradient, velocity = _rows()
    momenta = gradient[::-1].copy()
    var, m, v = tf.Variable(table), tf.Variable(momenta), tf.Variable(velocity)
    tf.raw_ops.ResourceApplyAdam(
        var=var.handle,
        m=m.handle,
        v=v.handle,
        beta1_power=tf.constant(0.0),
        beta2_power=tf.constant(0.0),
        lr=tf.constant(RATE),
        beta1=tf.constant(0.9),
        beta2=tf.constant(0.99),
        epsilon=tf.constant(1e-3),
        grad=gradient,
    )
    hp = dict(beta1=0.9, beta2=0.99, epsilon=1e-3, use_sum_inside_sqrt=False)
    got = _rule("adam", gradient, [table, momenta, velocity], hp)
    for value, want in zip(got, (var, m, v)):
        np.testing.assert_allclose(value, want.numpy(), rtol=1e-5)


@pytest.mark.parametrize("by_rate", [False, True])
def test_ftrl_is_tf_ftrl_with_beta_zero(by_rate):
    table, gradient, accumulator = _rows()
    linear = gradient[::-1].copy()
    var, acc, lin = (tf.Variable(x) for x in (table, accumulator, linear))
    tf.raw_ops.ResourceApplyFtrlV2(
        var=var.handle,
        accum=acc.handle,
        linear=lin.handle,
        grad=gradient,
        lr=tf.constant(RATE),
        l1=tf.constant(0.05),
        l2=tf.constant(0.1),
        l2_shrinkage=tf.constant(0.0),
        lr_power=tf.constant(-0.5),
        multiply_linear_by_lr=by_rate,
    )
    hp = dict(
        learning_rate_power=-0.5,
        l1_regularization_strength=0.05,
        l2_regularization_strength=0.1,
        beta=0.0,
        multiply_linear_by_learning_rate=by_rate,
    )
    got = _rule("ftrl", gradient, [table, accumulator, linear], hp)
    for value, want in zip(got, (var, acc, lin)):
        np.testing.assert_allclose(value, want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(rules.OPTIMIZER_RULES))
def test_slot_names_are_the_ops_arguments_in_order(kind):
    op = getattr(
        gen_xla_ops,
        f"xla_sparse_dense_matmul_grad_with_{kind}_and_static_buffer_size",
    )
    names = list(inspect.signature(op).parameters)
    after_table = names[names.index("embedding_table") + 1 :]
    _, slots = rules.OPTIMIZER_RULES[kind]
    assert tuple(after_table[: len(slots)]) == slots
    assert after_table[len(slots)] == "num_minibatches_per_physical_sparse_core"


def test_clip_rows_bounds_the_table():
    got = rules.clip_rows(tf.constant([-2.0, 0.5, 3.0]), -1.0, 1.0)
    np.testing.assert_array_equal(got.numpy(), [-1.0, 0.5, 1.0])
