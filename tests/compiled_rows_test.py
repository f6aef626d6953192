"""The compiled row step on padded rows equals the plain TF ops' step."""

import numpy as np
import pytest
import tensorflow as tf

from keras_tpu_embed.optimizers import apply_update
from keras_tpu_embed.optimizers import compiled_rows
from keras_tpu_embed.optimizers.row_update import refuse_non_finite
from tests import testing

VOCAB, DIM = 50, 3


def _variables(optimizer, seed):
    rng = np.random.default_rng(seed)
    table = tf.Variable(rng.normal(size=(VOCAB, DIM)).astype(np.float32))
    slots = {
        slot.name: tf.Variable(
            (
                optimizer.slot_initial_value(slot)
                + rng.uniform(0.1, 1.0, (VOCAB, DIM))
            ).astype(np.float32)
        )
        for slot in optimizer.SLOTS
    }
    return table, slots


LAZY = sorted(
    name
    for name, optimizer in testing.OPTIMIZER_CASES.items()
    if not optimizer.updates_all_rows()
)


@pytest.mark.parametrize("name", LAZY)
def test_padded_compiled_step_equals_the_plain_step(name):
    optimizer = testing.OPTIMIZER_CASES[name]
    rng = np.random.default_rng(1)
    plain_table, plain_slots = _variables(optimizer, 0)
    fast_table, fast_slots = _variables(optimizer, 0)
    for count in (1, 7, 23):
        ids = tf.constant(
            rng.choice(VOCAB, size=count, replace=False), tf.int64
        )
        gradient = tf.constant(rng.normal(size=(count, DIM)).astype(np.float32))
        apply_update(
            optimizer,
            plain_table,
            plain_slots,
            unique_ids=ids,
            gradient=gradient,
            learning_rate=tf.constant(0.3),
        )
        size = compiled_rows.padded_size(tf.size(ids))
        padded_ids = compiled_rows.pad(ids, size)
        padding = size - count
        # What the sparse lookup hands over: padded rows from the forward
        # gather and a gradient that is zero on the padding.
        apply_update(
            optimizer,
            fast_table,
            fast_slots,
            unique_ids=padded_ids,
            gradient=tf.pad(gradient, [[0, padding], [0, 0]]),
            learning_rate=tf.constant(0.3),
            rows=tf.gather(fast_table, padded_ids),
            count=tf.size(ids),
        )
        np.testing.assert_allclose(
            fast_table.numpy(), plain_table.numpy(), atol=1e-6, rtol=1e-5
        )
        for slot, variable in plain_slots.items():
            np.testing.assert_allclose(
                fast_slots[slot].numpy(),
                variable.numpy(),
                atol=1e-6,
                rtol=1e-5,
                err_msg=slot,
            )


def test_padding_changes_no_row_outside_the_count():
    optimizer = testing.OPTIMIZER_CASES["ftrl"]  # moves on a zero gradient
    table, slots = _variables(optimizer, 0)
    before = table.numpy().copy()
    ids = compiled_rows.pad(tf.constant([5, 9], tf.int64), 8)
    apply_update(
        optimizer,
        table,
        slots,
        unique_ids=ids,
        gradient=tf.pad(tf.ones([2, DIM]), [[0, 6], [0, 0]]),
        learning_rate=tf.constant(0.3),
        rows=tf.gather(table, ids),
        count=tf.constant(2),
    )
    changed = np.where(np.any(table.numpy() != before, axis=1))[0]
    np.testing.assert_array_equal(changed, [5, 9])


def test_padded_sizes_bound_waste_and_compilations():
    counts = np.arange(0, 300_000, 7)
    sizes = compiled_rows.padded_size(tf.constant(counts, tf.int32)).numpy()
    assert np.all(sizes >= counts)
    assert sizes[0] == 0
    # Less than 1/16 more rows than needed, or than 64 for small counts.
    assert np.all(sizes - counts < np.maximum(counts / 16, 64))
    # A batch's distinct rows vary by a few percent: few shapes to compile.
    band = (counts >= 95_000) & (counts <= 100_000)
    assert len(set(sizes[band])) <= 2


def _refused_step(optimizer, table, slots, gradient, compiled):
    ids = tf.constant([5, 9], tf.int64)
    arguments = {"unique_ids": ids, "gradient": gradient}
    if compiled:
        size = compiled_rows.padded_size(tf.size(ids))
        ids = compiled_rows.pad(ids, size)
        arguments = {
            "unique_ids": ids,
            "gradient": tf.pad(gradient, [[0, size - 2], [0, 0]]),
            "rows": tf.gather(table, ids),
            "count": tf.constant(2),
        }
    arguments = refuse_non_finite(arguments, "t", tf.constant(3, tf.int64))
    return apply_update(
        optimizer, table, slots, learning_rate=tf.constant(0.3), **arguments
    )


@pytest.mark.parametrize("name", ["adagrad", "ftrl"])
def test_compiled_step_refuses_non_finite_gradients_as_the_plain_one(name):
    """Finite: the same step as the plain refusal's; NaN: both raise naming
    the table and step, and leave every row and slot as it was."""
    optimizer = testing.OPTIMIZER_CASES[name]
    finite = tf.constant([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]])
    results = []
    for compiled in (False, True):
        table, slots = _variables(optimizer, 0)
        _refused_step(optimizer, table, slots, finite, compiled)
        results.append([table.numpy()] + [v.numpy() for v in slots.values()])
    for plain, fast in zip(*results):
        np.testing.assert_allclose(fast, plain, atol=1e-6, rtol=1e-5)
    nan = tf.tensor_scatter_nd_update(finite, [[1, 2]], [np.nan])
    for compiled in (False, True):
        table, slots = _variables(optimizer, 0)
        before = [table.numpy()] + [v.numpy() for v in slots.values()]
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=r"table 't'.*step"
        ):
            _refused_step(optimizer, table, slots, nan, compiled)
        after = [table.numpy()] + [v.numpy() for v in slots.values()]
        for b, a in zip(before, after):
            np.testing.assert_array_equal(a, b)
