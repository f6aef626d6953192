"""Rows of tables sharded over parameter servers: read and updated in id
order, each shard's rows where the shard lives.

`tf.gather` on a `ShardedVariable` is its `sparse_read`, which returns the
rows grouped by shard, not in the ids' order (`sharded_variable.py`): ids
`[9, 0]` of a 10-row table on 2 servers came back as rows `[0, 9]`. TF's
`tf.nn.embedding_lookup` of the shard list with its "div" layout gathers
each shard's ids on that shard's device and stitches them back in order
(`embedding_ops.py`, `_embedding_lookup_and_transform`). Updates write
each shard's rows with `ShardedVariable.scatter_update`, which splits the
ids by the same layout. The optimizer's rule runs on the gathered rows
only, where the step runs; the rules that move every row (`Adam(
lazy_adam=False)`) run shard by shard on the servers, so no step reads a
whole table onto a worker.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Mapping

from keras_tpu_embed._compat import tf
from keras_tpu_embed.parameter_server.sharded_tables import sharded_value
from keras_tpu_embed.parameter_server.sharded_tables import shards_of
from keras_tpu_embed.types import ShardedTableValue
from keras_tpu_embed.types import Tensor

Rule = Callable[
    [Tensor, Mapping[str, Tensor], Tensor, Tensor],
    tuple[Tensor, dict[str, Tensor]],
]
"""An optimizer's step on gathered rows: `(rows, slots, gradient, lr)` to
`(new_rows, new_slots)` (`optimizers/row_update.py`)."""


def gather(table: ShardedTableValue, ids: Tensor) -> Tensor:
    """`table`'s rows at `ids`, in the ids' order, each gathered on the
    server that holds it.

    Args:
        table: A `ShardedVariable` (or a Keras variable holding one).
        ids: Row ids of any shape.

    Returns:
        `ids.shape + [dim]` rows.
    """
    return tf.nn.embedding_lookup(shards_of(table), ids)


def sparse_update(
    rule: Rule,
    table: ShardedTableValue,
    slots: Mapping[str, Any],
    unique_ids: Tensor,
    gradient: Tensor,
    learning_rate: Tensor,
    count: Tensor | None = None,
    rows: Tensor | None = None,
) -> list[Any]:
    """One step of `rule` on the rows at `unique_ids` of a sharded table.

    Args:
        rule: The step on gathered rows.
        table: The table's `ShardedVariable`.
        slots: Its slots' `ShardedVariable`s, by slot name.
        unique_ids: Distinct row ids; with `count`, only the first `count`
            are rows, the rest padding (`optimizers/compiled_rows.py`).
        gradient: Each row's summed gradient.
        learning_rate: A scalar.
        count: How many of `unique_ids` are real.
        rows: The table's rows at `unique_ids` (padded like them), when
            the forward pass gathered them already: not read again.

    Returns:
        The scatter ops.
    """
    if count is not None:
        # The padding repeats row 0 with a zero gradient: a rule that moves
        # rows on a zero gradient must not see it.
        unique_ids, gradient = unique_ids[:count], gradient[:count]
        rows = None if rows is None else rows[:count]
    if rows is None:
        rows = gather(table, unique_ids)
    old = {name: gather(slot, unique_ids) for name, slot in slots.items()}
    new_rows, new_slots = rule(
        rows, old, gradient, tf.cast(learning_rate, rows.dtype)
    )
    ops = [
        sharded_value(table).scatter_update(
            tf.IndexedSlices(new_rows, unique_ids)
        )
    ]
    for name, slot in slots.items():
        ops.append(
            sharded_value(slot).scatter_update(
                tf.IndexedSlices(new_slots[name], unique_ids)
            )
        )
    return ops


def dense_update(
    rule: Rule,
    table: ShardedTableValue,
    slots: Mapping[str, Any],
    unique_ids: Tensor,
    gradient: Tensor,
    learning_rate: Tensor,
) -> list[Any]:
    """One step of a rule that moves every row, shard by shard, each on
    the server that holds the shard (zero gradient for untouched rows).

    Args:
        rule: The step on whole shards.
        table: The table's `ShardedVariable`.
        slots: Its slots' `ShardedVariable`s, by slot name.
        unique_ids: Distinct row ids (no padding).
        gradient: Each row's summed, clipped gradient.
        learning_rate: A scalar.

    Returns:
        The assign ops.
    """
    slot_shards = {name: shards_of(slot) for name, slot in slots.items()}
    ops = []
    start = 0
    for index, shard in enumerate(shards_of(table)):
        size = int(shard.shape[0])
        inside = tf.logical_and(unique_ids >= start, unique_ids < start + size)
        local = tf.boolean_mask(unique_ids, inside) - start
        with tf.device(shard.device):
            shard_gradient = tf.scatter_nd(
                local[:, tf.newaxis],
                tf.boolean_mask(gradient, inside),
                tf.shape(shard, tf.int64),
            )
            rows = shard.read_value()
            old = {
                name: shards[index].read_value()
                for name, shards in slot_shards.items()
            }
            new_rows, new_slots = rule(
                rows, old, shard_gradient, tf.cast(learning_rate, rows.dtype)
            )
            ops.append(shard.assign(new_rows))
            ops += [
                slot_shards[name][index].assign(value)
                for name, value in new_slots.items()
            ]
        start += size
    return ops
