"""Rows of a table sharded over parameter servers, read and updated in
the ids' order: `quantization.gather` and `apply_update` on a
`ShardedVariable`, against the same step on one variable.

The shards here are local variables (a `ShardedVariable` needs no cluster:
`ParameterServerStrategy` makes the same object with each shard on a
server); `parameter_server_test.py` runs them on real servers.
"""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.optimizers import apply_update
from keras_tpu_embed.optimizers import compiled_rows
from keras_tpu_embed.tables import quantization
from tests import testing

ROWS, DIM = 11, 3


def sharded(values, shards=3):
    """`values` as a `ShardedVariable` of TF's "div" layout (the first
    `rows % shards` shards one row longer), as the strategy makes it."""
    sizes = [len(part) for part in np.array_split(values, shards)]
    starts = np.cumsum([0] + sizes)
    parts = [
        tf.Variable(values[start : start + size])
        for start, size in zip(starts, sizes)
    ]
    return tf.__internal__.distribute.ShardedVariable(parts)


def table():
    return np.random.default_rng(0).normal(size=(ROWS, DIM)).astype("f4")


def test_gather_keeps_the_ids_order():
    values = table()
    ids = tf.constant([10, 0, 5, 10, 3], tf.int64)
    rows = quantization.gather(sharded(values), ids)
    np.testing.assert_array_equal(rows.numpy(), values[ids.numpy()])


def _slots(optimizer, make):
    return {
        slot.name: make(
            np.full((ROWS, DIM), optimizer.slot_initial_value(slot), "f4")
        )
        for slot in optimizer.SLOTS
    }


def _step(optimizer, make, ids, gradient, padded):
    values = table()
    variable = make(values)
    slots = _slots(optimizer, make)
    arguments = {}
    if padded:
        # The host path's padding: row 0 repeated with a zero gradient.
        count = tf.size(ids, out_type=tf.int32)
        size = compiled_rows.padded_size(count)
        ids = compiled_rows.pad(ids, size)
        gradient = tf.concat(
            [gradient, tf.zeros([size - count, DIM], gradient.dtype)], 0
        )
        arguments = dict(count=count, rows=quantization.gather(variable, ids))
    apply_update(optimizer, variable, slots, ids, gradient, 0.5, **arguments)
    read = lambda v: tf.convert_to_tensor(v).numpy()  # noqa: E731
    return read(variable), {name: read(v) for name, v in slots.items()}


@pytest.mark.parametrize("padded", [False, True], ids=["exact", "padded"])
@pytest.mark.parametrize("name", sorted(testing.OPTIMIZER_CASES))
def test_a_step_on_shards_is_the_step_on_one_table(name, padded):
    optimizer = testing.OPTIMIZER_CASES[name]
    # Ids out of order and across every shard, the last row included.
    ids = tf.constant([10, 0, 7, 4], tf.int64)
    gradient = tf.constant(
        np.random.default_rng(1).normal(size=(4, DIM)), tf.float32
    )
    want, want_slots = _step(optimizer, tf.Variable, ids, gradient, padded)
    got, got_slots = _step(optimizer, sharded, ids, gradient, padded)
    np.testing.assert_allclose(got, want, atol=1e-6)
    for slot in want_slots:
        np.testing.assert_allclose(got_slots[slot], want_slots[slot], atol=1e-6)
    assert not np.array_equal(got, table())


def test_a_rule_that_moves_every_row_runs_shard_by_shard():
    optimizer = kte.optimizers.Adam(0.1, lazy_adam=False)
    ids = tf.constant([9, 1], tf.int64)
    gradient = tf.ones([2, DIM])
    want, want_slots = _step(optimizer, tf.Variable, ids, gradient, False)
    got, got_slots = _step(optimizer, sharded, ids, gradient, False)
    np.testing.assert_allclose(got, want, atol=1e-6)
    for slot in want_slots:
        np.testing.assert_allclose(got_slots[slot], want_slots[slot], atol=1e-6)
    assert not np.array_equal(got[9], table()[9])
