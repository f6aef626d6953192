"""The engine's per-step math on one table of the emulated chip.

A dequeue combines each feature's enqueued ids into its output cells with
the table's combiner (`cells_and_scales`); sending gradients sums them per
distinct row and applies the table's optimizer once (`apply_table`, with
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
class ChipTable:
    """One table of the configuration proto, with its optimizer's slots."""

    name: str
    vocabulary_size: int
    dim: int
    parameters: Any  # OptimizationParameters proto
    kind: str
    variables: dict[str, Any]  # "parameters" and slot names -> variable


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


def apply_table(
    table: ChipTable, ids: Tensor, rows: Tensor, rates: list[Tensor]
) -> list[Any]:
    """The ops that apply `rows` (one gradient per id) to `table` once."""
    parameters = table.parameters
    rate = engine_rules.learning_rate(parameters, rates)
    unique, slot_of = tf.unique(ids)
    gradient = tf.math.unsorted_segment_sum(rows, slot_of, tf.shape(unique)[0])
    variables = table.variables
    names = ("parameters",) + engine_rules.SLOT_NAMES[table.kind]
    dense = table.kind == "adam" and parameters.adam.use_non_lazy_adam
    if dense:
        gradient = tf.scatter_nd(
            unique[:, tf.newaxis],
            gradient,
            tf.constant([table.vocabulary_size, table.dim], tf.int64),
        )
        old = {n: variables[n].read_value() for n in names}
    else:
        old = {n: tf.gather(variables[n], unique) for n in names}
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
        variables[n].scatter_update(tf.IndexedSlices(new[n], unique))
        for n in names
    ]
