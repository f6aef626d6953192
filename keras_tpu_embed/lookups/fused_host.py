"""The `cpu` serving lookup of all of a layer's dense-id columns at once.

Per column, `padded_host.py` launches one XLA program and, around it, host
ops for the checks and the padded/sparse choice: with many one-id columns
(26 in the Criteo-shaped W4 of `benchmarks/`) a small batch would pay for
thousands of TF ops and a program per column, where the fastest peer runs
one program. Here, when
every column of the call reads dense ids (the `inputs="ids"` export's
`[batch, n]` matrices padded with -1), all of them go through one compiled
program:

- on the host, only what XLA cannot do: the dtype and rank checks (at
  trace time), the weights' shape check, and padding of each column's
  batch up to a power of two (so XLA compiles a handful of programs),
  from a few ops for all columns at once; a width known at trace time is
  compiled as it is, an unknown one is padded to a power of two too;
- in the program: the identity columns' `default_value` mapping, the
  range check and the finite-weights check (as data, since XLA has no
  assertions), then gather, `max_norm` and combiner as `padded_host`
  computes them.

Nothing is checked less: the program computes every column's checks as
data and one `Assert` op outside it raises, naming the feature and the
largest id (or the weight feature and its count of NaN or inf values),
when one fails (`returned_checks.py`). A column wider than
`ALWAYS_PADDED_WIDTH`, or of a width unknown at trace time, is checked
per batch against `padded_host.PADDING_LIMIT`, and a batch over it takes
the per-column path and its sparse branch (a mostly -1 `[512, 10000]`
batch is compacted, not gathered whole). Calls that pass give the
per-column path's answers: the same ops on the same ids, only compiled
together (to float rounding of the sums' order where the widths differ).

Traced inside a caller's XLA program (the export's joined lookups, a
model under `jit_compile=True`: `returned_checks()` is active), the
lookups take the ids as they come, with no padding and no program of
their own: XLA compiles the caller's program for the shapes it is called
with, and the checks go to the caller.

Sequence lengths (`return_sequence_lengths`) and ragged or sparse ids keep
the per-column path (`applies` says which calls are fused).
`FusedHostLookup` is this lookup as a `lookup_interfaces.Lookup`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any
from typing import Callable
from typing import Mapping
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.lookups import dense_xla
from keras_tpu_embed.lookups import returned_checks
from keras_tpu_embed.lookups.lookup_interfaces import TableValues
from keras_tpu_embed.lookups.lookup_interfaces import refuse_training
from keras_tpu_embed.lookups.padded_host import PADDING_LIMIT
from keras_tpu_embed.lookups.padded_host import PaddedHostLookup
from keras_tpu_embed.lookups.padded_host import bucket
from keras_tpu_embed.lookups.padded_host import out_of_range_message
from keras_tpu_embed.placement.ids import PADDING_ID
from keras_tpu_embed.placement.ids import check_ids_dtype
from keras_tpu_embed.placement.ids import fit_width
from keras_tpu_embed.placement.ids import identity_default
from keras_tpu_embed.placement.ids import map_to_default
from keras_tpu_embed.placement.ids import prunes_weights
from keras_tpu_embed.tables.table_specs import TableSpec
from keras_tpu_embed.tables.table_specs import clip_rows
from keras_tpu_embed.types import Tensor

ALWAYS_PADDED_WIDTH = 64
"""Declared widths gathered as sent, with no per-batch padding check."""


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

    A `lookup_interfaces.Lookup` that serves only (no training method).
    The one program is always XLA-compiled (that is
    what it is for); `compiled` applies to the per-column path that a wide,
    mostly padded batch takes.
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
    """Every column's activation: one program when the batch allows (its
    checks asserted after it), `fallback()` (the per-column path) when a
    wide, mostly padded batch is better compacted."""
    plan = [
        (table, column, variable)
        for table, variable in zip(tables, variables)
        for column in table.columns
    ]
    columns = [column for _, column, _ in plan]
    matrices = [_matrices(column, features) for column in columns]
    handed = returned_checks.active()
    if handed is not None:
        return _in_callers_program(plan, matrices, handed, fallback)
    # Host ops, not XLA, dominate a small batch: every column's shape,
    # bucket, padding and cut come from one op each for all columns.
    shapes = tf.shape_n([m[0] for m in matrices], out_type=tf.int64)
    batches = tf.stack(shapes)[:, 0]
    sizes = bucket(batches)
    widths = [
        _width(column, inputs[0]) for column, inputs in zip(columns, matrices)
    ]
    needs_check = [
        _needs_padding_check(column, inputs[0])
        for column, inputs in zip(columns, matrices)
    ]
    fits = []
    if any(needs_check):
        for column, inputs, shape, size, check in zip(
            columns, matrices, shapes, tf.unstack(sizes), needs_check
        ):
            if check:
                fits.append(padding_fits(column, inputs[0], shape, size))
    # Each column is padded to its own batch's bucket and cut back to its
    # own batch, so columns of other batch sizes need no common one.
    extra = sizes - batches
    none = tf.zeros_like(extra)
    count = len(columns)
    row_paddings = tf.unstack(
        tf.reshape(tf.stack([none, extra, none, none], 1), [count, 2, 2])
    )
    ends = tf.unstack(tf.reshape(batches, [count, 1]))
    # Given, not defaulted: `tf.strided_slice` makes a `ones_like` op
    # of its own for each call without strides.
    start, step = tf.constant([0], tf.int64), tf.constant([1], tf.int64)

    def fused() -> dict[str, Tensor]:
        padded = [
            _pad(inputs, paddings, width, shape)
            for inputs, paddings, width, shape in zip(
                matrices, row_paddings, widths, shapes
            )
        ]
        values, (clear, first, largest) = _program(plan)(padded)
        returned_checks.assert_clear(
            returned_checks.Verdict(clear, first, largest), check_messages(plan)
        )
        return {
            column.name: cut_rows(value, start, end, step)
            for column, value, end in zip(columns, values, ends)
        }

    if not fits:
        return fused()
    chosen: dict[str, Tensor] = tf.cond(
        tf.reduce_all(tf.stack(fits)), fused, fallback
    )
    return chosen


def _in_callers_program(
    plan: Plan,
    matrices: list[list[Tensor]],
    handed: returned_checks.ReturnedChecks,
    fallback: Callable[[], dict[str, Tensor]],
) -> dict[str, Tensor]:
    """The lookups traced inside a caller's XLA program (under
    `returned_checks()`): on the ids as they come, since XLA compiles that
    program for the shapes it is called with (padding there would only
    gather padding), their checks handed to the caller. A width checked
    per batch cannot be: the caller is told (`refused`)."""
    columns = [column for _, column, _ in plan]
    if any(_needs_padding_check(c, m[0]) for c, m in zip(columns, matrices)):
        handed.refused.append(
            "a dense input wider than ALWAYS_PADDED_WIDTH or of undeclared "
            f"width, among {[c.name for c in columns]}"
        )
        return fallback()
    values, checks = _lookups(plan)(matrices)
    handed.handed.append(
        dataclasses.replace(checks, messages=check_messages(plan))
    )
    return {column.name: value for column, value in zip(columns, values)}


def cut_rows(value: Tensor, start: Tensor, end: Tensor, step: Tensor) -> Tensor:
    """`value[:end]` (`end` a `[1]` tensor), its static shape kept (the
    shape inference of a strided slice of tensor bounds loses even the
    rank)."""
    cut = tf.strided_slice(value, start, end, step)
    cut.set_shape([None] + value.shape[1:])
    return cut


def _pad(
    inputs: list[Tensor], paddings: Tensor, width: int | Tensor, shape: Tensor
) -> list[Tensor]:
    """A column's ids (and weights) padded by `paddings` (extra examples)
    and, for a width not known at trace time, to `width` (-1 ids, 0
    weights). A trace-time width is compiled as it is."""
    if not isinstance(width, int):
        columns = tf.stack([0, width - shape[1]])
        paddings = paddings + tf.stack([tf.zeros_like(columns), columns])
    padded = [
        tf.pad(x, paddings, constant_values=pad)
        for x, pad in zip(inputs, (PADDING_ID, 0.0))
    ]
    if isinstance(width, int):
        # Shape inference cannot see that `paddings` leaves it alone.
        for x in padded:
            x.set_shape([None, width])
    return padded


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


def _width(column: AnyEmbeddingColumn, ids: Tensor) -> int | Tensor:
    """The width the program is compiled for: the trace-time width as it
    is (a sequence column's is its length), else the batch's rounded up to
    a power of two (so that XLA compiles a handful of programs)."""
    if column.is_sequence:
        return int(column.max_sequence_length)
    if ids.shape[1] is not None:
        return int(ids.shape[1])
    return bucket(tf.shape(ids, out_type=tf.int64)[1])


def _needs_padding_check(column: AnyEmbeddingColumn, ids: Tensor) -> bool:
    """Whether padding a column's batch must be checked per batch.

    A declared width of at most `ALWAYS_PADDED_WIDTH` need not: at most
    that many rows per example, what a `keras.layers.Embedding` gathers
    for the same input; nor a sequence column, whose output has its
    length's slots anyway. Wider or undeclared widths are checked, so that
    a mostly -1 `[512, 10000]` batch is compacted, not gathered.
    """
    if column.is_sequence:
        return False
    static = ids.shape[1]
    return static is None or static > ALWAYS_PADDED_WIDTH


def padding_fits(
    column: AnyEmbeddingColumn, ids: Tensor, shape: Tensor, size: Any
) -> Tensor:
    """Whether a column's padded batch is worth gathering whole, as
    `PaddedHostLookup._dense_fits` decides it (for the columns
    `_needs_padding_check` names)."""
    width = _width(column, ids)
    entries = tf.math.count_nonzero(ids != PADDING_ID, dtype=tf.int64)
    fit: Tensor = size * width <= PADDING_LIMIT * tf.maximum(entries, shape[0])
    return fit


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


Plan = list[tuple[TableSpec, AnyEmbeddingColumn, TableValues]]


def check_messages(plan: Plan) -> tuple[str, ...]:
    """The messages of the program's checks, in its order: per column, its
    ids in range, then (weighted columns) its weights finite."""
    messages = []
    for table, column, _ in plan:
        messages.append(f"{out_of_range_message(table, column)} Largest id:")
        if column.weight_feature_key:
            messages.append(
                f"Weight feature '{column.weight_feature_key}' holds NaN or "
                "inf values. How many:"
            )
    return tuple(messages)


Checked = tuple[list[Tensor], returned_checks.Checks]


def _lookups(plan: Plan) -> Callable[[list[list[Tensor]]], Checked]:
    """Every column's lookup and its checks as data (`check_messages`
    gives their order), to trace inside an XLA program (`_program`, or a
    caller's under `returned_checks()`)."""

    def lookups(inputs: list[list[Tensor]]) -> Checked:
        values = []
        per_example = []  # negative where an example passes
        detailed = []  # per check: passed and its value, built on failure
        for (table, column, variable), column_inputs in zip(plan, inputs):
            ids, weights = column_inputs[0], None
            ids = tf.cast(
                map_to_default(
                    ids,
                    table.vocabulary_size,
                    identity_default(column),
                    keep_padding=True,
                ),
                tf.int64,
            )
            size = table.vocabulary_size
            per_example.append(tf.reduce_max(ids, axis=1) - size)
            detailed.append(functools.partial(_largest_below, ids, size))
            if len(column_inputs) > 1:
                weights = column_inputs[1]
                broken = tf.logical_not(tf.math.is_finite(weights))
                per_example.append(
                    tf.cast(tf.reduce_any(broken, axis=1), tf.int64) - 1
                )
                detailed.append(functools.partial(_none_of, broken))
            kept, factor = dense_xla.entry_factors(
                ids, weights, column.combiner, prunes_weights(column)
            )
            rows = clip_rows(
                dense_xla.gather_rows(variable, ids, kept), table.max_norm
            )
            if column.is_sequence:
                values.append(
                    dense_xla.per_position(
                        rows, factor, column.combiner, weights is not None
                    )
                )
            else:
                values.append(dense_xla.pooled(rows, factor, column.combiner))

        def details() -> tuple[Tensor, Tensor]:
            passed, evidence = zip(*(check() for check in detailed))
            return tf.stack(passed), tf.stack(evidence)

        worst = returned_checks.worst_of(per_example)
        return values, returned_checks.Checks(worst, details, ())

    return lookups


def _largest_below(ids: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Whether every id is below `size`, and the largest."""
    largest = tf.reduce_max(ids)
    return largest < size, largest


def _none_of(broken: Tensor) -> tuple[Tensor, Tensor]:
    """Whether no weight is NaN or inf, and how many are."""
    count = tf.math.count_nonzero(broken, dtype=tf.int64)
    return tf.equal(count, 0), count


def _program(
    plan: Plan,
) -> Callable[[list[list[Tensor]]], tuple[list[Tensor], tuple[Tensor, ...]]]:
    """`_lookups` as one XLA program returning the activations and the
    `Verdict` of their checks (three scalars) for the caller's assertion."""

    def program(
        inputs: list[list[Tensor]],
    ) -> tuple[list[Tensor], tuple[Tensor, ...]]:
        values, checks = _lookups(plan)(inputs)
        verdict = returned_checks.verdict([checks])
        return values, (verdict.clear, verdict.first, verdict.evidence)

    compiled: Callable[
        [list[list[Tensor]]], tuple[list[Tensor], tuple[Tensor, ...]]
    ]
    compiled = tf.function(program, jit_compile=True, autograph=False)
    return compiled
