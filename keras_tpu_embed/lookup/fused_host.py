"""The `cpu` serving lookup of all of a layer's dense-id columns at once.

Per column, `padded_host.py` launches one XLA program and, around it, host
ops for the checks and the padded/sparse choice: with 26 one-id columns
(the Criteo-shaped W4 of `benchmarks/`) a batch-1 call ran some 2,000 TF
ops and 26 programs, where the fastest peer ran one program. Here, when
every column of the call reads dense ids (the `inputs="ids"` export's
`[batch, n]` matrices padded with -1), all of them go through one compiled
program:

- on the host, per column, only what XLA cannot do: the dtype and rank
  checks (at trace time), the weights' shape check, and padding of batch
  and width up to powers of two (so XLA compiles a handful of programs);
- in the program: the identity columns' `default_value` mapping, the
  range check and the finite-weights check (as one flag per column, since
  XLA has no assertions), then gather, `max_norm` and combiner as
  `padded_host` computes them.

Nothing is checked less: a call whose flags are not all clear, or one
whose padded matrix would exceed `padded_host.PADDING_LIMIT` for some
column, is answered by the per-column path instead (`fallback`), which
raises the same errors as before with the same messages, or takes its
sparse branch. Calls that pass give the per-column path's answers: the
same ops on the same padded ids, only compiled together.

Sequence lengths (`return_sequence_lengths`) and ragged or sparse ids keep
the per-column path (`applies` says which calls are fused).
`FusedHostLookup` is this lookup as a `table_lookup.TableLookup`.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Mapping
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.lookup import dense_xla
from keras_tpu_embed.lookup.padded_host import PADDING_LIMIT
from keras_tpu_embed.lookup.padded_host import PaddedHostLookup
from keras_tpu_embed.lookup.padded_host import bucket
from keras_tpu_embed.lookup.table_lookup import AcrossReplicas
from keras_tpu_embed.lookup.table_lookup import ScratchVariable
from keras_tpu_embed.lookup.table_lookup import TableValues
from keras_tpu_embed.lookup.table_lookup import refuse_training
from keras_tpu_embed.lookup.tables import TableSpec
from keras_tpu_embed.lookup.tables import clip_rows
from keras_tpu_embed.preprocessing.ids import PADDING_ID
from keras_tpu_embed.preprocessing.ids import check_ids_dtype
from keras_tpu_embed.preprocessing.ids import fit_width
from keras_tpu_embed.preprocessing.ids import identity_default
from keras_tpu_embed.preprocessing.ids import map_to_default
from keras_tpu_embed.preprocessing.ids import prunes_weights
from keras_tpu_embed.types import Tensor

_STATIC_FIT_WIDTH = 2
"""Widths at which padding always fits: `bucket(b) * 2 < 4 * b`."""


def applies(
    tables: Sequence[TableSpec],
    features: dict[str, Tensor],
    return_lengths: bool,
) -> bool:
    """Whether these tables' serving call can be fused (decided at trace
    time, from the input forms alone)."""
    columns = [c for t in tables for c in t.columns]
    if not columns:
        return False
    if return_lengths and any(c.is_sequence for c in columns):
        return False
    keys = [c.feature_key for c in columns]
    keys += [c.weight_feature_key for c in columns if c.weight_feature_key]
    return all(
        not isinstance(features[k], (tf.SparseTensor, tf.RaggedTensor))
        and features[k].shape.rank in (1, 2)
        for k in keys
    )


class FusedHostLookup:
    """Every table's `cpu` serving lookup for one call, in one program
    (see module doc); for calls `applies` accepts.

    A `table_lookup.TableLookup` that serves only: asked to train, it
    raises `RuntimeError`. The one program is always XLA-compiled (that is
    what it is for); `compiled` applies to the per-column fallback.
    """

    def __init__(
        self, tables: Sequence[TableSpec], features: dict[str, Tensor]
    ) -> None:
        self.tables = list(tables)
        self._features = features
        # `applies` refuses calls that ask for sequence lengths.
        self.lengths: dict[str, Tensor] = {}

    @property
    def table_names(self) -> list[str]:
        return [table.name for table in self.tables]

    def training_rows(
        self, variables: Mapping[str, TableValues]
    ) -> dict[str, Tensor]:
        """Refused: serving only."""
        refuse_training(self.tables, "fused host serving")

    def update_arguments(
        self,
        gradients: Mapping[str, Tensor],
        updates_all_rows: bool,
        across_replicas: AcrossReplicas | None = None,
        scratch: Mapping[str, ScratchVariable] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Refused: serving only."""
        refuse_training(self.tables, "fused host serving")

    def outputs(
        self,
        variables: Mapping[str, TableValues],
        trapped_rows: Mapping[str, Tensor] | None = None,
        compiled: bool = False,
    ) -> dict[str, Tensor]:
        """Every column's activation (serving only: no rows are trapped)."""
        if trapped_rows is not None:
            refuse_training(self.tables, "fused host serving")

        def per_column() -> dict[str, Tensor]:
            values: dict[str, Tensor] = {}
            for table in self.tables:
                lookup = PaddedHostLookup(table, self._features, False)
                values.update(lookup.outputs(variables, compiled=compiled))
            return values

        return outputs(
            self.tables,
            self._features,
            [variables[table.name] for table in self.tables],
            per_column,
        )


def outputs(
    tables: Sequence[TableSpec],
    features: dict[str, Tensor],
    variables: Sequence[TableValues],
    fallback: Callable[[], dict[str, Tensor]],
) -> dict[str, Tensor]:
    """Every column's activation: one program when the batch allows,
    `fallback()` (the per-column path) when it does not or a check fails."""
    plan = [
        (table, column, variable)
        for table, variable in zip(tables, variables)
        for column in table.columns
    ]
    columns = [column for _, column, _ in plan]
    matrices = [_matrices(column, features) for column in columns]
    # One op for every column's shape: host ops, not XLA, dominate a
    # small batch, so the host side is kept to a few ops per column.
    shapes = tf.shape_n([m[0] for m in matrices], out_type=tf.int64)
    batch = shapes[0][0]
    size = bucket(batch)
    # Columns of another batch size than the first are served as sent by
    # the per-column path, as are batches padding would blow up.
    go = [tf.reduce_all(tf.equal(tf.stack(shapes)[:, 0], batch))]
    widths = []
    for column, inputs, shape in zip(columns, matrices, shapes):
        width, fit = _width(column, inputs[0], shape, size)
        widths.append(width)
        if fit is not None:
            go.append(fit)

    def fused() -> dict[str, Tensor]:
        padded = []
        paddings: dict[Any, Tensor] = {}
        for inputs, shape, width in zip(matrices, shapes, widths):
            sent = inputs[0].shape[1]
            static = isinstance(width, int) and sent is not None
            key = (width, sent) if static else id(inputs[0])
            if key not in paddings:
                paddings[key] = tf.stack(
                    [[0, size - batch], tf.stack([0, width - shape[1]])]
                )
            padded.append(
                [
                    tf.pad(x, paddings[key], constant_values=pad)
                    for x, pad in zip(inputs, (PADDING_ID, 0.0))
                ]
            )
        values, clear = _program(plan)(padded)
        served = {
            column.name: value[:batch] for column, value in zip(columns, values)
        }
        answer: dict[str, Tensor] = tf.cond(clear, lambda: served, fallback)
        return answer

    chosen: dict[str, Tensor] = tf.cond(
        tf.reduce_all(tf.stack(go)), fused, fallback
    )
    return chosen


def _matrices(
    column: AnyEmbeddingColumn, features: dict[str, Tensor]
) -> list[Tensor]:
    """A column's ids (and weights) as `[batch, n]` matrices, a sequence
    column's fit to `max_sequence_length`."""
    ids = check_ids_dtype(column.feature_key, features[column.feature_key])
    ids = ids[:, tf.newaxis] if ids.shape.rank == 1 else ids
    inputs = [ids]
    if column.weight_feature_key:
        key = column.weight_feature_key
        inputs.append(_weights(column, key, features, ids))
    if column.is_sequence:
        length = column.max_sequence_length
        pads = (PADDING_ID, 0.0)
        inputs = [fit_width(x, length, pad) for x, pad in zip(inputs, pads)]
    return inputs


def _width(
    column: AnyEmbeddingColumn, ids: Tensor, shape: Tensor, size: Tensor
) -> tuple[int | Tensor, Tensor | None]:
    """The padded width (a Python int when the width is static) and
    whether padding fits (None when it always does)."""
    static = ids.shape[1]
    if column.is_sequence:
        return int(column.max_sequence_length), None
    width: int | Tensor
    if static is None:
        width = bucket(shape[1])
    else:
        width = 1 << max(int(static) - 1, 0).bit_length()
    if static is not None and static <= _STATIC_FIT_WIDTH:
        return width, None
    # As `PaddedHostLookup._dense_fits`: entries are the non-padding ids
    # of the batch as sent.
    entries = tf.math.count_nonzero(ids != PADDING_ID, dtype=tf.int64)
    fit = size * width <= PADDING_LIMIT * tf.maximum(entries, shape[0])
    return width, fit


def _weights(
    column: AnyEmbeddingColumn,
    key: str,
    features: dict[str, Tensor],
    ids: Tensor,
) -> Tensor:
    """The column's weights (feature `key`) as a float32 matrix, after the
    dtype, rank and shape checks `ids.to_id_batch` makes (its finite check
    is in the program)."""
    weights = features[key]
    if not (weights.dtype.is_floating or weights.dtype.is_integer):
        raise TypeError(
            f"Weight feature '{key}' must be numeric, got dtype "
            f"{weights.dtype.name}."
        )
    weights = tf.cast(weights, tf.float32)
    weights = weights[:, tf.newaxis] if weights.shape.rank == 1 else weights
    check = tf.debugging.assert_equal(
        tf.shape(weights),
        tf.shape(ids),
        message=(
            f"Weight feature '{key}' must have exactly the structure of its "
            f"ids '{column.feature_key}' (shape)."
        ),
    )
    with tf.control_dependencies([check]):
        return tf.identity(weights)


def _program(
    plan: list[tuple[TableSpec, AnyEmbeddingColumn, TableValues]],
) -> Callable[[list[list[Tensor]]], tuple[list[Tensor], Tensor]]:
    """One XLA computation: every column's lookup and one flag, true when
    every id is in range and every weight finite."""

    def program(inputs: list[list[Tensor]]) -> tuple[list[Tensor], Tensor]:
        values = []
        clear = []
        for (table, column, variable), column_inputs in zip(plan, inputs):
            ids, weights = column_inputs[0], None
            if len(column_inputs) > 1:
                weights = column_inputs[1]
                clear.append(tf.reduce_all(tf.math.is_finite(weights)))
            ids = map_to_default(
                ids,
                table.vocabulary_size,
                identity_default(column),
                keep_padding=True,
            )
            clear.append(tf.reduce_all(ids < table.vocabulary_size))
            kept, factor = dense_xla.entry_factors(
                ids, weights, column.combiner, prunes_weights(column)
            )
            rows = clip_rows(
                dense_xla.gather_rows(variable, ids, kept), table.max_norm
            )
            if column.is_sequence:
                values.append(
                    dense_xla.per_position(rows, factor, column.combiner)
                )
            else:
                values.append(dense_xla.pooled(rows, factor, column.combiner))
        return values, tf.reduce_all(tf.stack(clear))

    compiled: Callable[[list[list[Tensor]]], tuple[list[Tensor], Tensor]]
    compiled = tf.function(program, jit_compile=True, autograph=False)
    return compiled
