"""Ids on their way to a lookup: one canonical form, and the column's rules.

Every rule about ids that more than one stage applies lives here once: the
identity column's `default_value` mapping, the range check, pruning, and the
dense padded form of the tensor-core path.

Ids arrive dense (`-1` pads), ragged or sparse, with optional weights of the
same structure. `to_id_batch` flattens them to parallel vectors (id, weight,
example row, position in the example) that every lookup backend consumes, and
checks what can only be checked here: dtypes, ranks, and that weights share
the ids' structure exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Protocol

from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import Tensor


class _IdSource(Protocol):
    @property
    def out_of_range_id(self) -> int | None:
        """See `CategoricalColumn.out_of_range_id`."""


class LookupColumn(Protocol):
    """What the id rules read of an embedding column
    (`columns/embedding.py`; not imported here, as it imports this)."""

    @property
    def name(self) -> str:
        """The column's name."""

    @property
    def categorical_column(self) -> _IdSource:
        """Its categorical column."""

    @property
    def combiner(self) -> str:
        """The combiner: "sum", "mean" or "sqrtn"."""

    @property
    def use_safe_embedding_lookup(self) -> bool:
        """Whether non-positive weights are pruned."""

    @property
    def is_sequence(self) -> bool:
        """Whether it is a sequence column."""

    @property
    def max_sequence_length(self) -> int:
        """A sequence column's length (0: none)."""

    @property
    def tensor_core_shape(self) -> tuple[int | None, int] | None:
        """`[batch, ids_per_example]` on the tensor core, if given."""


PADDING_ID = -1
"""Dense inputs use -1 for "no id here", as `tf.feature_column` does."""


@dataclasses.dataclass(frozen=True)
class IdBatch:
    """The ids of one feature for one batch, flattened.

    Attributes:
        ids: int64 `[n]`.
        weights: float32 `[n]`, or None when the feature is unweighted.
        rows: int64 `[n]`: the example each id belongs to.
        positions: int64 `[n]`: the id's index within its example (the
            sequence position for sequence columns).
        batch_size: int64 scalar.
        row_major: Whether the entries are in (row, position) order with at
            most one per pair, as dense and ragged inputs always are (a
            Python bool, known when tracing). Sorted segment ops and the
            one-row-per-position sequence lookup rely on it; sparse inputs
            promise neither order nor uniqueness, so they go without.
    """

    ids: Tensor
    weights: Tensor | None
    rows: Tensor
    positions: Tensor
    batch_size: Tensor
    row_major: bool = False

    def keep(self, mask: Tensor) -> IdBatch:
        """The entries where `mask` is true."""
        return IdBatch(
            ids=tf.boolean_mask(self.ids, mask),
            weights=None
            if self.weights is None
            else tf.boolean_mask(self.weights, mask),
            rows=tf.boolean_mask(self.rows, mask),
            positions=tf.boolean_mask(self.positions, mask),
            batch_size=self.batch_size,
            row_major=self.row_major,
        )


def _form(value: Tensor) -> str:
    if isinstance(value, tf.SparseTensor):
        return "sparse"
    if isinstance(value, tf.RaggedTensor):
        return "ragged"
    return "dense"


def check_integer(
    subject: str, dtype: tf.DType, holding: str, fix: str = ""
) -> None:
    """Raises TypeError unless `dtype` is an integer type: `subject` (e.g.
    "Feature 'x'") must hold `holding` (e.g. "integer ids"), then `fix`."""
    if not dtype.is_integer:
        raise TypeError(
            f"{subject} must hold {holding}, got dtype {dtype.name}.{fix}"
        )


def check_numeric(subject: str, dtype: tf.DType) -> None:
    """Raises TypeError unless `dtype` is an integer or floating type."""
    if not (dtype.is_floating or dtype.is_integer):
        raise TypeError(f"{subject} must be numeric, got dtype {dtype.name}.")


def check_ids_dtype(feature: str, ids: Tensor) -> Tensor:
    check_integer(
        f"Feature '{feature}'",
        ids.dtype,
        "integer ids",
        " Map raw values to ids with kte.FeaturePreprocessor(columns) first.",
    )
    if ids.dtype != tf.int64:
        return tf.cast(ids, tf.int64)
    return ids


def checked_weights(feature: str, weights: Tensor) -> Tensor:
    """Numeric `weights` (dense, ragged or sparse) as float32, after a
    run-time check that none is NaN or inf."""
    check_numeric(f"Weight feature '{feature}'", weights.dtype)
    weights = tf.cast(weights, tf.float32)
    values = weights.values if _form(weights) != "dense" else weights
    check = tf.debugging.assert_all_finite(
        values, f"Weight feature '{feature}' holds NaN or inf values."
    )
    with tf.control_dependencies([check]):
        return tf.identity(weights) if _form(weights) == "dense" else weights


def check_rank(feature: str, value: Tensor) -> int:
    """The rank of a feature's values (raw, ids or weights): 1 or 2."""
    rank = value.shape.rank
    if rank is None:
        raise ValueError(
            f"Feature '{feature}' has unknown rank; it must be rank 1 "
            "`[batch]` or rank 2 `[batch, n]`."
        )
    if rank not in (1, 2):
        raise ValueError(
            f"Feature '{feature}' must be rank 1 `[batch]` or rank 2 "
            f"`[batch, n]`, got rank {rank} with shape {value.shape}."
        )
    return int(rank)


def as_rank_2(feature: str, value: Tensor) -> Tensor:
    """A dense or sparse `[batch]` or `[batch, n]` feature as `[batch, n]`;
    any other rank is an error naming the feature."""
    check_rank(feature, value)
    return _as_rank_2(value)


def _as_rank_2(value: Tensor) -> Tensor:
    if value.shape.rank != 1:
        return value
    if isinstance(value, tf.SparseTensor):
        return tf.sparse.reshape(value, [-1, 1])
    return value[:, tf.newaxis]


def to_id_batch(
    feature: str,
    ids: Tensor,
    weights: Tensor | None = None,
    weight_feature: str | None = None,
) -> IdBatch:
    """Flattens `ids` (and `weights`) of one feature into an `IdBatch`.

    Dense ids drop the `-1` padding entries (their weights go with them);
    ragged and sparse ids keep every entry they hold. Negative ids are kept
    here and pruned by the lookup, so sequence lengths count them as
    `tf.feature_column` does.

    Raises:
        TypeError: ids not integer, weights not numeric, or weights in
            another form (dense / ragged / sparse) than the ids.
        ValueError: a rank other than 1 or 2.
        InvalidArgumentError: at run time, weights whose shape, row lengths
            or indices differ from the ids', or NaN / inf weights.
    """
    form = _form(ids)
    ids = check_ids_dtype(feature, ids)
    rank = check_rank(feature, ids)
    weight_name = weight_feature or f"{feature} weights"
    if weights is not None:
        if _form(weights) != form:
            raise TypeError(
                f"Weight feature '{weight_name}' is {_form(weights)} but its "
                f"ids '{feature}' are {form}: give both in one form."
            )
        weights = checked_weights(weight_name, weights)
        if check_rank(weight_name, weights) != rank:
            raise ValueError(
                f"Weight feature '{weight_name}' has rank "
                f"{weights.shape.rank} but its ids '{feature}' have rank "
                f"{rank}."
            )
    mismatch = (
        f"Weight feature '{weight_name}' must have exactly the structure of "
        f"its ids '{feature}'"
    )
    if form == "sparse":
        indices = ids.indices
        batch_size = ids.dense_shape[0]
        rows = indices[:, 0]
        positions = (
            indices[:, 1] if rank == 2 else tf.zeros_like(rows, tf.int64)
        )
        values = ids.values
        weight_values = None
        if weights is not None:
            check = tf.debugging.assert_equal(
                weights.indices, indices, message=f"{mismatch} (indices)."
            )
            with tf.control_dependencies([check]):
                weight_values = tf.identity(weights.values)
        return IdBatch(values, weight_values, rows, positions, batch_size)
    if form == "ragged":
        if ids.ragged_rank != 1:
            raise ValueError(
                f"Feature '{feature}' must be a ragged `[batch, (n)]` tensor "
                f"with one ragged dimension, got ragged_rank {ids.ragged_rank}."
            )
        rows = ids.value_rowids()
        starts = tf.gather(ids.row_splits, rows)
        positions = tf.range(tf.size(rows, out_type=tf.int64)) - starts
        weight_values = None
        if weights is not None:
            check = tf.debugging.assert_equal(
                weights.row_splits,
                ids.row_splits,
                message=f"{mismatch} (row lengths).",
            )
            with tf.control_dependencies([check]):
                weight_values = tf.identity(weights.values)
        return IdBatch(
            ids.values,
            weight_values,
            tf.cast(rows, tf.int64),
            tf.cast(positions, tf.int64),
            ids.nrows(out_type=tf.int64),
            row_major=True,
        )
    ids = as_rank_2(feature, ids)
    if weights is not None:
        weights = as_rank_2(weight_name, weights)
    if weights is not None:
        if (
            ids.shape.is_fully_defined()
            and weights.shape.is_fully_defined()
            and ids.shape != weights.shape
        ):
            raise ValueError(
                f"{mismatch}: ids have shape {ids.shape}, weights "
                f"{weights.shape}."
            )
        check = tf.debugging.assert_equal(
            tf.shape(weights), tf.shape(ids), message=f"{mismatch} (shape)."
        )
        with tf.control_dependencies([check]):
            weights = tf.identity(weights)
    present = tf.not_equal(ids, PADDING_ID)
    where = tf.where(present)
    return IdBatch(
        ids=tf.boolean_mask(ids, present),
        weights=None if weights is None else tf.boolean_mask(weights, present),
        rows=where[:, 0],
        positions=where[:, 1],
        batch_size=tf.shape(ids, out_type=tf.int64)[0],
        row_major=True,
    )


def prepare_for_lookup(
    batch: IdBatch,
    *,
    feature: str,
    table: str,
    vocabulary_size: int,
    identity_default: int | None,
    prune_weights: bool,
    max_sequence_length: int,
) -> IdBatch:
    """Applies the column's id rules; returns only the ids to look up.

    In order: identity columns map ids outside `[0, vocabulary_size)` to
    their `default_value` (see `map_to_default`); any other id
    `>= vocabulary_size` raises, naming the feature, table, value and
    valid range (gathers on GPU and TPU would return zeros or garbage
    silently, so the check is explicit); negative ids are pruned, as
    `safe_embedding_lookup_sparse` prunes them; weights <= 0 are pruned
    when `prune_weights`; sequence positions past `max_sequence_length`
    are dropped.
    """
    ids = map_to_default(batch.ids, vocabulary_size, identity_default)
    ids = ids_below(
        ids,
        vocabulary_size,
        f"Feature '{feature}' (table '{table}') has ids outside the valid "
        f"range [0, {vocabulary_size}); set a default_value on an identity "
        "column to map them.",
    )
    batch = dataclasses.replace(batch, ids=ids)
    keep = ids >= 0
    if prune_weights and batch.weights is not None:
        keep = tf.logical_and(keep, batch.weights > 0)
    if max_sequence_length:
        keep = tf.logical_and(keep, batch.positions < max_sequence_length)
    return batch.keep(keep)


def ids_below(ids: Tensor, limit: int, message: str) -> Tensor:
    """`ids`, after a run-time check that none is `>= limit`.

    The error carries `message` and the first offending ids.
    """
    too_large = ids >= limit
    check = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(too_large)),
        [message, "Offending ids:", tf.boolean_mask(ids, too_large)[:10]],
        summarize=10,
    )
    with tf.control_dependencies([check]):
        return tf.identity(ids)


def map_to_default(
    ids: Tensor,
    vocabulary_size: int,
    default: int | None,
    keep_padding: bool = False,
) -> Tensor:
    """Identity columns: ids outside `[0, vocabulary_size)` become `default`.

    Negative ids included, as `IdentityCategoricalColumn.
    _transform_input_tensor` (tensorflow/python/feature_column/
    feature_column_v2.py) maps them. With `keep_padding`, for dense inputs
    that still hold their `-1` padding, `-1` stays padding: the legacy
    column drops it before the mapping (`_to_sparse_input_and_drop_ignore_
    values`).
    """
    if default is None:
        return ids
    outside = tf.logical_or(ids < 0, ids >= vocabulary_size)
    if keep_padding:
        outside = tf.logical_and(outside, tf.not_equal(ids, PADDING_ID))
    return tf.where(outside, tf.constant(default, ids.dtype), ids)


def identity_default(column: LookupColumn) -> int | None:
    """The id that out-of-range ids map to, for identity columns."""
    return column.categorical_column.out_of_range_id


def prunes_weights(column: LookupColumn) -> bool:
    """Whether non-positive weights are pruned (safe mean / sqrtn)."""
    return bool(column.use_safe_embedding_lookup and column.combiner != "sum")


def fit_width(dense: Tensor, width: int, pad: Any) -> Tensor:
    """`dense` `[batch, n]` truncated or padded with `pad` to `width`."""
    dense = _as_rank_2(dense)
    n = dense.shape[1]
    if n is not None and n >= width:
        return dense[:, :width]
    if n is not None:
        return tf.pad(dense, [[0, 0], [0, width - n]], constant_values=pad)
    # Unknown width: not static, so only for the host side of serving.
    dense = dense[:, :width]
    missing = width - tf.shape(dense)[1]
    return tf.pad(dense, [[0, 0], [0, missing]], constant_values=pad)


def densify(values: Tensor, width: int, pad: Any) -> Tensor:
    """Any input form as a dense `[batch, width]` matrix (host side)."""
    if isinstance(values, tf.SparseTensor):
        values = tf.sparse.to_dense(_as_rank_2(values), default_value=pad)
    elif isinstance(values, tf.RaggedTensor):
        values = values.to_tensor(default_value=pad)
    return fit_width(values, width, pad)


def width_of(column: LookupColumn) -> int:
    """Ids per example on the tensor core: the sequence length, else
    `tensor_core_shape[1]`."""
    if column.is_sequence:
        return int(column.max_sequence_length)
    if column.tensor_core_shape is None:
        raise ValueError(
            f"Column '{column.name}' has no tensor_core_shape, so it cannot be "
            "looked up on 'tpu_tensor_core'. Give it tensor_core_shape="
            "[None, ids_per_example]."
        )
    return int(column.tensor_core_shape[1])
