"""The `cpu` serving lookup: padded ids, one compiled gather + combine.

`cpu` serving means the lookup runs on the host, not that it must use
sparse kernels. Each column's ids become a dense `[batch, width]` matrix
padded with -1 and go through one XLA-compiled gather and combiner, the
tensor-core path's math (`dense_xla.py`), measured about 2x faster on CPU
than the sparse segment ops. Nothing is truncated: the width is the
batch's longest row (a sequence column's is `max_sequence_length`, past
which the sparse path drops entries too). Batch and width are rounded up
to powers of two, so XLA compiles a handful of programs, not one per shape.

Dense ids (already `[batch, n]`, -1 padded) are padded further as they
are. Ragged and sparse ids are laid out in a matrix first; what cannot be
padded runs the sparse lookup (`sparse.py`) instead, chosen per batch at
run time:
- a batch whose padded matrix would hold more than `PADDING_LIMIT` cells per
  entry (or per example, if more): one very long row among short ones;
- a `tf.SparseTensor` whose entries are not in strictly increasing
  (example, position) order: unsorted or repeated positions, which the
  sparse path combines but one padded slot per position cannot hold.
Both give the same answer (to float rounding of the sums' order).
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import Mapping

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.lookups import dense_xla
from keras_tpu_embed.lookups import sparse
from keras_tpu_embed.lookups.lookup_interfaces import TableValues
from keras_tpu_embed.lookups.lookup_interfaces import refuse_training
from keras_tpu_embed.placement.ids import PADDING_ID
from keras_tpu_embed.placement.ids import IdBatch
from keras_tpu_embed.placement.ids import check_ids_dtype
from keras_tpu_embed.placement.ids import fit_width
from keras_tpu_embed.placement.ids import identity_default
from keras_tpu_embed.placement.ids import ids_below
from keras_tpu_embed.placement.ids import map_to_default
from keras_tpu_embed.placement.ids import prepare_for_lookup
from keras_tpu_embed.placement.ids import prunes_weights
from keras_tpu_embed.tables import quantization
from keras_tpu_embed.tables.table_specs import TableSpec
from keras_tpu_embed.tables.table_specs import clip_rows
from keras_tpu_embed.types import Tensor

PADDING_LIMIT = 4
"""Padded cells allowed per entry before a batch takes the sparse path.

Rounding batch and width up to powers of two alone can give 4 cells per
entry for a batch of equal rows; beyond that, padding costs more than the
sparse ops save.
"""


_POWERS_OF_TWO = [1 << n for n in range(63)]


def bucket(size: Tensor) -> Tensor:
    """The smallest power of two `>= size` (1 for 0), int64, elementwise.

    One search in a table of powers: a served call's host ops are most of
    a small batch's time, and the arithmetic way (log, round, shift, fix)
    is some ten scalar ops.
    """
    size = tf.cast(size, tf.int64)
    powers = tf.constant(_POWERS_OF_TWO, tf.int64)
    index = tf.searchsorted(powers, tf.reshape(size, [-1]), side="left")
    return tf.reshape(tf.gather(powers, index), tf.shape(size))


class PaddedHostLookup:
    """One table's `cpu` serving lookup for one call (see module doc).

    A `lookup_interfaces.Lookup` that serves only (no training method).
    """

    def __init__(
        self,
        table: TableSpec,
        features: dict[str, Tensor],
        return_lengths: bool,
    ) -> None:
        self.table = table
        self._features = features
        # Also the checks of ids and weights, whichever path then runs.
        self._batches, self.lengths = sparse.read_batches(
            table, features, return_lengths
        )

    @property
    def table_names(self) -> list[str]:
        return [self.table.name]

    def outputs(
        self,
        variables: Mapping[str, TableValues],
        trapped_rows: Mapping[str, Tensor] | None = None,
        compiled: bool = False,
    ) -> dict[str, Tensor]:
        """Activations per column (serving only: no rows are trapped)."""
        if trapped_rows is not None:
            refuse_training([self.table], "host serving")
        variable = variables[self.table.name]
        return {
            column.name: self._column(variable, column, compiled)
            for column in self.table.columns
        }

    def _column(
        self, variable: TableValues, column: AnyEmbeddingColumn, compiled: bool
    ) -> Tensor:
        if _is_dense(self._features[column.feature_key]):
            if column.is_sequence:
                return self._dense_column(variable, column, compiled)
            # Padded as sent, a mostly -1 batch ([512, 10000]) gathers
            # every cell: gigabytes. Compacted like sparse ids unless the
            # batch as sent is within the padding limit.
            return tf.cond(
                self._dense_fits(column),
                lambda: self._dense_column(variable, column, compiled),
                lambda: self._compacted_column(variable, column, compiled),
            )
        return self._compacted_column(variable, column, compiled)

    def _dense_fits(self, column: AnyEmbeddingColumn) -> Tensor:
        """Whether dense ids padded as sent are within `PADDING_LIMIT`."""
        ids = _as_matrix(self._features[column.feature_key])
        shape = tf.shape(ids, out_type=tf.int64)
        entries = tf.size(self._batches[column.name].ids, out_type=tf.int64)
        return bucket(shape[0]) * bucket(
            shape[1]
        ) <= PADDING_LIMIT * tf.maximum(entries, shape[0])

    def _compacted_column(
        self, variable: TableValues, column: AnyEmbeddingColumn, compiled: bool
    ) -> Tensor:
        table = self.table
        batch = self._batches[column.name]
        ids = _valid_ids(batch.ids, table, column, keep_padding=False)
        batch = dataclasses.replace(batch, ids=ids)
        length = column.max_sequence_length if column.is_sequence else 0
        rows, slots, width, fits = _layout(batch, length)

        def padded() -> Tensor:
            size = bucket(batch.batch_size)
            index = tf.stack([rows, slots], axis=1)
            cells = tf.stack([size, width + (1 if length else 0)])
            dense_ids = tf.tensor_scatter_nd_update(
                tf.fill(cells, tf.constant(PADDING_ID, tf.int64)), index, ids
            )
            inputs = [dense_ids]
            if batch.weights is not None:
                inputs.append(
                    tf.tensor_scatter_nd_update(
                        tf.zeros(cells, tf.float32), index, batch.weights
                    )
                )
            if length:
                # Positions past the sequence length were parked in the
                # last column; the sparse path drops them too.
                inputs = [x[:, :length] for x in inputs]
            device = _device_part(table, column, variable, compiled)
            return device(*inputs)[: batch.batch_size]

        def unpadded() -> Tensor:
            return _sparse_column(variable, table, column, batch)

        return tf.cond(fits, padded, unpadded)

    def _dense_column(
        self, variable: TableValues, column: AnyEmbeddingColumn, compiled: bool
    ) -> Tensor:
        """Ids already dense, padded with -1: padded further to powers of
        two, never compacted (they are the batch as it was sent)."""
        table = self.table
        ids = _as_matrix(
            check_ids_dtype(
                column.feature_key, self._features[column.feature_key]
            )
        )
        ids = _valid_ids(ids, table, column, keep_padding=True)
        inputs: list[tuple[Tensor, Any]] = [(ids, PADDING_ID)]
        if column.weight_feature_key:
            weights = self._features[column.weight_feature_key]
            inputs.append((_as_matrix(tf.cast(weights, tf.float32)), 0.0))
        length = column.max_sequence_length if column.is_sequence else 0
        if length:
            inputs = [(fit_width(x, length, pad), pad) for x, pad in inputs]
        shape = tf.shape(ids, out_type=tf.int64)
        size = bucket(shape[0])
        width = length or bucket(tf.shape(inputs[0][0], out_type=tf.int64)[1])
        padded = [
            tf.pad(
                x,
                [[0, size - shape[0]], [0, width - tf.shape(x, tf.int64)[1]]],
                constant_values=pad,
            )
            for x, pad in inputs
        ]
        device = _device_part(table, column, variable, compiled)
        return device(*padded)[: shape[0]]


def _is_dense(value: Any) -> bool:
    return not isinstance(value, (tf.SparseTensor, tf.RaggedTensor))


def _as_matrix(value: Tensor) -> Tensor:
    return value[:, tf.newaxis] if value.shape.rank == 1 else value


def _layout(
    batch: IdBatch, length: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each entry's padded cell, the padded width, and whether it fits.

    A pooled column puts an example's entries side by side (their order
    does not change a sum); a sequence column keeps each at its position,
    positions from `length` on parked in one extra column.
    """
    n = tf.size(batch.ids, out_type=tf.int64)
    rows = batch.rows
    if length:
        slots = tf.minimum(batch.positions, length)
        width = tf.constant(length, tf.int64)
    else:
        counts = tf.math.unsorted_segment_sum(
            tf.ones_like(rows), rows, batch.batch_size
        )
        starts = tf.cumsum(counts, exclusive=True)
        slots = tf.range(n) - tf.gather(starts, rows)
        width = bucket(tf.reduce_max(tf.concat([counts, [0]], 0)))
    fits = worth_padding(bucket(batch.batch_size) * width, n, batch, length)
    if not batch.row_major:
        # Strictly increasing (example, position) keys: sorted, no repeats.
        span = tf.reduce_max(tf.concat([batch.positions, [0]], 0)) + 1
        keys = rows * span + batch.positions
        fits = tf.logical_and(fits, tf.reduce_all(keys[1:] > keys[:-1]))
    return rows, slots, width, fits


def worth_padding(
    cells: Tensor, entries: Tensor, batch: IdBatch, length: int
) -> Tensor:
    """Whether `cells` padded cells are worth it for `entries` entries.

    A sequence column's output has `length` slots per example anyway, so
    padding its ids to them costs nothing more.
    """
    if length:
        return tf.constant(True)
    return cells <= PADDING_LIMIT * tf.maximum(entries, batch.batch_size)


def _valid_ids(
    ids: Tensor,
    table: TableSpec,
    column: AnyEmbeddingColumn,
    keep_padding: bool,
) -> Tensor:
    """`ids` mapped by the column's `default_value`, then checked in range."""
    ids = map_to_default(
        ids,
        table.vocabulary_size,
        identity_default(column),
        keep_padding=keep_padding,
    )
    return ids_below(
        ids, table.vocabulary_size, out_of_range_message(table, column)
    )


def out_of_range_message(table: TableSpec, column: AnyEmbeddingColumn) -> str:
    """What a column's ids outside its table say, on every serving path."""
    return (
        f"Feature '{column.feature_key}' (table '{table.name}') has ids "
        f"outside the valid range [0, {table.vocabulary_size}); set a "
        "default_value on an identity column to map them."
    )


def _device_part(
    table: TableSpec,
    column: AnyEmbeddingColumn,
    variable: TableValues,
    compiled: bool,
) -> Callable[..., Tensor]:
    """Gather + combine of dense `[batch, width]` ids (and weights), one
    XLA computation when `compiled`."""
    combiner = column.combiner
    safe = prunes_weights(column)

    def device(ids: Tensor, weights: Tensor | None = None) -> Tensor:
        kept, factor = dense_xla.entry_factors(ids, weights, combiner, safe)
        rows = clip_rows(
            dense_xla.gather_rows(variable, ids, kept), table.max_norm
        )
        if column.is_sequence:
            weighted = weights is not None
            return dense_xla.per_position(rows, factor, combiner, weighted)
        return dense_xla.pooled(rows, factor, combiner)

    if compiled:
        compiled_device: Callable[..., Tensor]
        compiled_device = tf.function(device, jit_compile=True, autograph=False)
        return compiled_device
    return device


def _sparse_column(
    variable: TableValues,
    table: TableSpec,
    column: AnyEmbeddingColumn,
    batch: IdBatch,
) -> Tensor:
    """The sparse serving lookup of one column (`SparseTableLookup`'s)."""
    batch = prepare_for_lookup(
        batch,
        feature=column.feature_key,
        table=table.name,
        vocabulary_size=table.vocabulary_size,
        identity_default=None,
        prune_weights=prunes_weights(column),
        max_sequence_length=column.max_sequence_length,
    )
    source = clip_rows(quantization.gather(variable, batch.ids), table.max_norm)
    index = tf.range(tf.size(batch.ids))
    if column.is_sequence:
        return sparse.sequence(
            source, index, batch, column.combiner, column.max_sequence_length
        )
    return sparse.pooled(source, index, batch, column.combiner)
