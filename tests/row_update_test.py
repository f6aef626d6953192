"""One embedding step on a table: `apply_update`, and many in a row.

The numpy rules (`testing.numpy_step`) are written from the engine's
documented formulas (`optimization_parameters.proto`, SparseCore optimizer
computations), not from our code; every optimizer is trained through the
layer for several steps with repeated ids, gradient clipping, weight decay, a
gradient multiplier and a learning-rate schedule, and must match to 1e-6.
"""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.optimizers import apply_update
from tests import testing

VOCAB, DIM = 9, 3
# testing.BATCHES and one batch that reads the ninth row.
BATCHES = testing.BATCHES + [[[8, 8, 1], [2, 2, -1], [1, -1, -1]]]


def schedule(step):
    return 1.0 / (1.0 + 0.5 * tf.cast(step, tf.float32))


def multiplier(step):
    return 1.0 + 0.25 * tf.cast(step, tf.float32)


@pytest.mark.parametrize("name", sorted(testing.OPTIMIZER_CASES))
def test_updates_match_numpy_over_steps(name):
    opt = testing.OPTIMIZER_CASES[name]
    config = kte.EmbeddingConfig(
        optimizer=opt, clipping_limit=0.9, gradient_multiplier_fn=multiplier
    )
    base_rate = opt.learning_rate
    column = testing.identity_column(
        vocabulary_size=VOCAB,
        learning_rate_fn=lambda step: base_rate * schedule(step),
    )
    layer = kte.TPUEmbeddingLayer([column], config=config)
    layer.build()
    initial = layer.table_variable("ids").numpy()
    upstream = np.random.default_rng(1).normal(size=(3, DIM))
    testing.train_steps(layer, BATCHES, upstream)
    w, slots = testing.numpy_training(
        opt,
        initial,
        BATCHES,
        upstream,
        learning_rate=lambda step: base_rate / (1.0 + 0.5 * step),
        multiplier=lambda step: 1.0 + 0.25 * step,
        clipping_limit=0.9,
    )

    np.testing.assert_allclose(
        layer.table_variable("ids").numpy(), w, atol=1e-6, rtol=1e-5
    )
    for slot, variable in layer.slot_variables("ids").items():
        np.testing.assert_allclose(
            variable.numpy(), slots[slot], atol=1e-6, rtol=1e-5, err_msg=slot
        )


def _table(optimizer, rows=5, dim=2, value=1.0):
    table = tf.Variable(tf.fill([rows, dim], value))
    slots = {
        slot.name: tf.Variable(
            tf.fill([rows, dim], optimizer.slot_initial_value(slot))
        )
        for slot in optimizer.SLOTS
    }
    return table, slots


def _apply(optimizer, table, slots, ids, gradient, learning_rate, **kwargs):
    return apply_update(
        optimizer,
        table,
        slots,
        unique_ids=tf.constant(ids, tf.int64),
        gradient=tf.convert_to_tensor(gradient, tf.float32),
        learning_rate=learning_rate,
        **kwargs,
    )


def test_only_the_given_rows_change():
    optimizer = kte.optimizers.Adagrad(0.5, initial_accumulator_value=1.0)
    table, slots = _table(optimizer)
    _apply(optimizer, table, slots, [1, 3], [[1.0, 1.0], [2.0, 2.0]], 0.5)
    changed = np.where(np.any(table.numpy() != 1.0, axis=1))[0]
    np.testing.assert_array_equal(changed, [1, 3])
    np.testing.assert_allclose(
        slots["accumulators"].numpy()[:, 0], [1.0, 2.0, 1.0, 5.0, 1.0]
    )


@pytest.mark.parametrize(
    "by_learning_rate, learning_rate, want",
    [(False, 1.0, [0.4, 2.0]), (True, 0.5, [0.7, 2.0])],
)
def test_clip_gradient_then_decay_then_rule_then_clip_weights(
    by_learning_rate, learning_rate, want
):
    """SGD on w = [1, 2] with g = [2, -2]: the gradient is clipped to 0.5
    first; the decay (0.1, times lr when asked) comes before the rule; the
    new weights are clipped to 2 last. Another order gives other numbers
    (decay after the rule: 0.45; no gradient clip: -1.1)."""
    optimizer = kte.optimizers.SGD(
        learning_rate,
        clipvalue=0.5,
        weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=by_learning_rate,
        clip_weight_max=2.0,
    )
    table = tf.Variable([[1.0], [2.0]])
    _apply(optimizer, table, {}, [0, 1], [[2.0], [-2.0]], learning_rate)
    np.testing.assert_allclose(table.numpy()[:, 0], want, rtol=1e-6)


@pytest.mark.parametrize("guard", [True, False])
def test_guard_skips_a_step_that_would_move_rows(guard):
    """FTRL moves a row on a zero gradient; a false guard skips the step."""
    optimizer = kte.optimizers.FTRL(0.5, l1_regularization_strength=0.1)
    table, slots = _table(optimizer)
    _apply(
        optimizer,
        table,
        slots,
        [2],
        tf.zeros([1, 2]),
        0.5,
        guard=tf.constant(guard),
    )
    moved = np.any(table.numpy() != 1.0, axis=1)
    np.testing.assert_array_equal(moved, [False, False, guard, False, False])


def test_dense_rules_sum_repeated_ids():
    optimizer = kte.optimizers.Adam(0.1, lazy_adam=False)
    gradients = tf.constant([[0.5, -1.0], [0.25, 2.0]])
    repeated, repeated_slots = _table(optimizer)
    _apply(optimizer, repeated, repeated_slots, [2, 2], gradients, 0.1)
    summed, summed_slots = _table(optimizer)
    _apply(
        optimizer,
        summed,
        summed_slots,
        [2],
        tf.reduce_sum(gradients, axis=0, keepdims=True),
        0.1,
    )
    np.testing.assert_allclose(repeated.numpy(), summed.numpy(), rtol=1e-6)
    for name, variable in summed_slots.items():
        np.testing.assert_allclose(
            repeated_slots[name].numpy(), variable.numpy(), rtol=1e-6
        )


def _nan_gradient_step(layer, jit_compile=False):
    """A training step whose loss is finite (0) but whose gradient is NaN:
    d/dx sqrt(x - x) is inf - inf."""

    def step():
        with tf.GradientTape() as tape:
            out = layer({"i": tf.constant([[1, 2]])}, training=True)
            loss = tf.reduce_sum(tf.sqrt(out["i_embedding"] * 0.0))
        tape.gradient(loss, layer.trainable_weights)
        return loss

    if jit_compile:
        return tf.function(step, jit_compile=True)()
    return step()


def _nan_layer(device=None, **config):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("i", 5),
        2,
        embedding_lookup_device=device,
        tensor_core_shape=None if device is None else [None, 2],
    )
    layer = kte.TPUEmbeddingLayer(
        [column],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.1), **config),
    )
    layer.build()
    return layer


def test_non_finite_gradient_raises_naming_table_and_step():
    layer = _nan_layer()
    before = layer.table_variable("i").numpy()
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"table \\?'i\\?'.*step"
    ):
        _nan_gradient_step(layer)
    np.testing.assert_array_equal(layer.table_variable("i").numpy(), before)


def test_non_finite_gradient_never_written_under_xla():
    """XLA drops assertions: there the table's update is skipped instead."""
    layer = _nan_layer("tpu_tensor_core")
    before = layer.table_variable("i").numpy()
    _nan_gradient_step(layer, jit_compile=True)
    np.testing.assert_array_equal(layer.table_variable("i").numpy(), before)
    assert kte.validate_tables(layer) == {}


def test_non_finite_updates_can_be_allowed():
    layer = _nan_layer(non_finite_updates="allow")
    _nan_gradient_step(layer)
    assert kte.validate_tables(layer) == {"i": [1, 2]}


@pytest.mark.parametrize("jit_compile", [False, True])
def test_all_finite_is_exact_when_the_sum_overflows(jit_compile):
    from keras_tpu_embed.optimizers.row_update import all_finite

    check = tf.function(all_finite, jit_compile=jit_compile)
    big = np.float32(3e38)
    cases = {
        (1.0, 2.0, -3.0): True,
        (big, big, 1.0): True,  # finite terms, a sum that overflows
        (-big, -big, 1.0): True,
        (1.0, np.nan, 2.0): False,
        (np.inf, 1.0, 1.0): False,
        (np.inf, -np.inf, 1.0): False,
        (big, big, -np.inf): False,
    }
    for values, want in cases.items():
        got = bool(check(tf.constant([values, values], tf.float32)))
        assert got is want, values
