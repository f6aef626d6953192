"""The engine's per-step math on one table of the emulated chip.

A table lives as one shard of rows per host (`ChipShard`, on that host's
device). A dequeue gathers each id's row from the shard that holds it
(`gather_rows`: each gather runs on the shard's host, and only the
gathered rows travel, as over the TPU interconnect) and combines them into
the feature's output cells with the table's combiner (`cells_and_scales`);
sending gradients sums them per distinct row and applies the table's
optimizer once, each shard's rows on its host (`apply_table`, with
`engine_rules.step`). `emulated_chip.py` holds the tables and calls these
from TF's op stand-ins.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_tpu_embed._compat import tf
from keras_tpu_embed.testing import engine_rules
from keras_tpu_embed.types import Tensor


@dataclasses.dataclass
class ChipShard:
    """Rows `[start, start + rows)` of a table, with their slots, held on
    `host` (that host's share of the chip's memory)."""

    host: str
    start: int
    rows: int
    variables: dict[str, Any]  # "parameters" and slot names -> variable


@dataclasses.dataclass
class ChipTable:
    """One table of the configuration proto, with its optimizer's slots,
    as one shard per host."""

    name: str
    vocabulary_size: int
    dim: int
    parameters: Any  # OptimizationParameters proto
    kind: str
    num_shards: int
    shards: dict[int, ChipShard] = dataclasses.field(default_factory=dict)

    @property
    def slot_names(self) -> tuple[str, ...]:
        """`"parameters"`, then the optimizer's slots (TF's op order)."""
        return ("parameters",) + engine_rules.SLOT_NAMES[self.kind]

    def held_shards(self) -> list[ChipShard]:
        """The shards that hold rows, in row order.

        Raises:
            RuntimeError: a host's shard was never loaded (TF loads every
                shard right after configuring the engine).
        """
        missing = [
            shard_id
            for shard_id in range(self.num_shards)
            if shard_id not in self.shards
        ]
        if missing:
            raise RuntimeError(
                f"emulated chip: table '{self.name}' has no shard for hosts "
                f"{missing}: the chip's memory is filled by TF's load ops, "
                "one per host, which TPUEmbedding runs right after "
                "configuring the engine."
            )
        shards = [self.shards[i] for i in range(self.num_shards)]
        return [shard for shard in shards if shard.rows]


@dataclasses.dataclass
class Enqueued:
    """One replica's enqueued ids of one step, then its dequeue's cells."""

    ids: list[Tensor]
    positions: list[Tensor | None]  # sample indices or row splits
    kinds: list[str]  # "dense", "sparse", "ragged"
    weights: list[Tensor | None]
    combiners: list[str]
    cells: list[Tensor] = dataclasses.field(default_factory=list)
    scales: list[Tensor] = dataclasses.field(default_factory=list)


def cells_in(shape: list[int]) -> int:
    """The number of output cells of a feature of `shape`."""
    total = 1
    for size in shape:
        total *= size
    return total


def checked_ids(ids: Tensor, table: ChipTable) -> Tensor:
    """`ids`, after a run-time check that each is a row of `table`."""
    in_range = tf.reduce_all(
        tf.logical_and(ids >= 0, ids < table.vocabulary_size)
    )
    check = tf.debugging.Assert(
        in_range,
        [
            f"emulated chip: an id outside [0, {table.vocabulary_size}) "
            f"reached table '{table.name}'; the engine has no rule for it",
        ],
    )
    with tf.control_dependencies([check]):
        return tf.identity(ids)


def cells_and_scales(
    batch: Enqueued, index: int, shape: list[int], combiner: str
) -> tuple[Tensor, Tensor]:
    """Each id's output cell (flat) and its weight over the normalizer.

    Ids past a sequence feature's length are truncated: their weight is 0.
    """
    ids = batch.ids[index]
    count = tf.shape(ids, out_type=tf.int64)[0]
    kind = batch.kinds[index]
    positions = batch.positions[index]
    sequence = len(shape) > 1
    length = shape[-1] if sequence else 1
    if kind == "dense":
        cells = tf.range(count)
    elif kind == "sparse":
        indices = tf.cast(positions, tf.int64)
        if sequence:
            cells = indices[:, 0] * length + indices[:, 1]
            cells = tf.where(indices[:, 1] < length, cells, -1)
        else:
            cells = indices[:, 0]
    else:
        splits = tf.cast(positions, tf.int64)
        rows = tf.ragged.row_splits_to_segment_ids(splits, out_type=tf.int64)
        if sequence:
            position = tf.range(count) - tf.gather(splits, rows)
            cells = tf.where(position < length, rows * length + position, -1)
        else:
            cells = rows
    weights = batch.weights[index]
    weights = tf.ones([count]) if weights is None else weights
    weights = tf.where(cells >= 0, weights, 0.0)
    num_cells = cells_in(shape)
    safe_cells = tf.maximum(cells, 0)
    if combiner == "sum":
        scale = weights
    elif combiner == "mean":
        total = tf.math.unsorted_segment_sum(weights, safe_cells, num_cells)
        scale = tf.math.divide_no_nan(weights, tf.gather(total, safe_cells))
    else:
        total = tf.math.unsorted_segment_sum(
            weights * weights, safe_cells, num_cells
        )
        scale = tf.math.divide_no_nan(
            weights, tf.sqrt(tf.gather(total, safe_cells))
        )
    return safe_cells, scale


def _by_shard(
    shards: list[ChipShard], ids: Tensor, values: list[Tensor]
) -> list[tuple[ChipShard, Tensor, list[Tensor]]]:
    """Per shard: its ids among `ids` (counted from the shard's first
    row), with the matching rows of each of `values`."""
    starts = tf.constant([shard.start for shard in shards], tf.int64)
    which = tf.searchsorted(starts, ids, side="right", out_type=tf.int32) - 1
    local = ids - tf.gather(starts, which)
    count = len(shards)
    local_parts = tf.dynamic_partition(local, which, count)
    value_parts = [tf.dynamic_partition(v, which, count) for v in values]
    return [
        (shard, local_parts[i], [parts[i] for parts in value_parts])
        for i, shard in enumerate(shards)
    ]


def gather_rows(table: ChipTable, ids: Tensor) -> Tensor:
    """The rows of `ids` (checked ids of `table`), each gathered on the
    host of the shard that holds it; only the gathered rows leave it."""
    shards = table.held_shards()
    positions = tf.range(tf.size(ids))
    parts = _by_shard(shards, ids, [positions])
    gathered = []
    for shard, local, _ in parts:
        with tf.device(shard.host):
            gathered.append(tf.gather(shard.variables["parameters"], local))
    return tf.dynamic_stitch([p for _, _, (p,) in parts], gathered)


def apply_table(
    table: ChipTable, ids: Tensor, rows: Tensor, rates: list[Tensor]
) -> list[Any]:
    """The ops that apply `rows` (one gradient per id) to `table` once,
    each shard's distinct rows on the shard's host."""
    rate = engine_rules.learning_rate(table.parameters, rates)
    unique, slot_of = tf.unique(ids)
    gradient = tf.math.unsorted_segment_sum(rows, slot_of, tf.shape(unique)[0])
    parts = _by_shard(table.held_shards(), unique, [gradient])
    updates = []
    for shard, local, (shard_gradient,) in parts:
        with tf.device(shard.host):
            updates += _apply_shard(table, shard, local, shard_gradient, rate)
    return updates


def _apply_shard(
    table: ChipTable,
    shard: ChipShard,
    ids: Tensor,
    gradient: Tensor,
    rate: Tensor,
) -> list[Any]:
    """One shard's update: `ids` are distinct, counted in the shard."""
    parameters = table.parameters
    variables = shard.variables
    names = table.slot_names
    dense = table.kind == "adam" and parameters.adam.use_non_lazy_adam
    if dense:
        gradient = tf.scatter_nd(
            ids[:, tf.newaxis],
            gradient,
            tf.constant([shard.rows, table.dim], tf.int64),
        )
        old = {n: variables[n].read_value() for n in names}
    else:
        old = {n: tf.gather(variables[n], ids) for n in names}
    new_rows, new_slots = engine_rules.step(
        parameters,
        old["parameters"],
        {n: old[n] for n in names[1:]},
        gradient,
        rate,
    )
    new = {"parameters": new_rows, **new_slots}
    if dense:
        return [variables[n].assign(new[n]) for n in names]
    return [
        variables[n].scatter_update(tf.IndexedSlices(new[n], ids))
        for n in names
    ]
