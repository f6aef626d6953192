"""Embedding column specs: a categorical column plus the table it looks up.

`embedding_column` and `shared_embedding_columns` take exactly the arguments
of `tf.compat.v1.tpu.experimental.embedding_column` /
`shared_embedding_columns` and raise the same `ValueError`s, with messages
that name the column and the bad value.
"""

from __future__ import annotations

from typing import Any
from typing import Sequence

from keras_tpu_embed.columns.categorical_base import CategoricalColumn
from keras_tpu_embed.columns.embedding import EmbeddingColumn
from keras_tpu_embed.columns.embedding import SharedEmbeddingColumn
from keras_tpu_embed.columns.embedding import check_dimension
from keras_tpu_embed.columns.embedding import default_initializer
from keras_tpu_embed.columns.tf_categorical import to_categorical_column
from keras_tpu_embed.types import InitializerLike
from keras_tpu_embed.types import LearningRateFn


def embedding_column(
    categorical_column: Any,
    dimension: int,
    combiner: str = "mean",
    initializer: InitializerLike | None = None,
    max_sequence_length: int = 0,
    learning_rate_fn: LearningRateFn | None = None,
    embedding_lookup_device: str | None = None,
    tensor_core_shape: Sequence[int | None] | None = None,
    use_safe_embedding_lookup: bool = True,
    *,
    trainable: bool = True,
    max_norm: float | None = None,
    ckpt_to_load_from: str | None = None,
    tensor_name_in_ckpt: str | None = None,
) -> EmbeddingColumn:
    """An embedding table looked up by one categorical column.

    Args:
        categorical_column: A categorical column of this package, of
            `tf.feature_column` or of `tf.compat.v1.tpu.experimental`.
        dimension: Width of the embedding, > 0.
        combiner: `"mean"`, `"sum"` or `"sqrtn"`: how the ids of one example
            are reduced (non-sequence columns).
        initializer: Callable initializing the table; defaults to a truncated
            normal with mean 0 and stddev `1/sqrt(dimension)`.
        max_sequence_length: Positive for sequence columns (longer sequences
            are truncated, shorter ones zero-padded), 0 otherwise.
        learning_rate_fn: Function of the global embedding step returning
            this table's learning rate; overrides the optimizer's rate.
        embedding_lookup_device: `None`, `"cpu"`, `"tpu_tensor_core"` or
            `"tpu_embedding_core"`: where lookups run. `None` is the TPU
            embedding engine when training under `TPUStrategy` on a TPU
            with one, the default device elsewhere, and the host CPU in a
            serving export; `"tpu_tensor_core"` is a dense lookup compiled
            with XLA in training and serving; `"cpu"` is for serving only
            (an error when training under `TPUStrategy`).
        tensor_core_shape: `[batch, ids_per_example]` for
            `"tpu_tensor_core"`; the batch may be `None` or -1. Longer rows
            are truncated. Sequence columns may leave it out: their width
            is `max_sequence_length`.
        use_safe_embedding_lookup: Prune invalid ids and, for `"mean"` and
            `"sqrtn"`, non-positive weights, as
            `tf.nn.safe_embedding_lookup_sparse` does.
        trainable: `tf.feature_column.embedding_column`'s flag: False
            freezes the table (never updated, no optimizer slots). Not
            available on the TPU embedding engine.
        max_norm: `tf.feature_column.embedding_column`'s clipping: each
            looked-up row is scaled down to this L2 norm, if larger, before
            the combiner (host, tensor-core and serving lookups; not
            available on the TPU embedding engine).
        ckpt_to_load_from: A checkpoint (path or prefix) to start the table
            from, with `tensor_name_in_ckpt`, the name of a
            `[vocabulary_size, dimension]` tensor in it. Read when the
            layer is built; a missing tensor or another shape is an error.

    Returns:
        An `EmbeddingColumn` named `<categorical column name>_embedding`.

    Raises:
        ValueError: if `dimension` is not > 0, `initializer` is not callable,
            `max_sequence_length` does not fit the column, the device is
            unknown, or `tpu_tensor_core` comes without a 2-element
            `tensor_core_shape` for a non-sequence column.

    Example:

    >>> item = categorical_column_with_identity("item_id", 1000)
    >>> col = embedding_column(item, dimension=16)
    >>> col.name, col.table_name
    ('item_id_embedding', 'item_id')
    """
    return EmbeddingColumn(
        categorical_column=to_categorical_column(categorical_column),
        dimension=dimension,
        combiner=combiner,
        initializer=initializer,
        max_sequence_length=max_sequence_length,
        learning_rate_fn=learning_rate_fn,
        embedding_lookup_device=embedding_lookup_device,
        tensor_core_shape=tensor_core_shape,  # type: ignore[arg-type]
        use_safe_embedding_lookup=use_safe_embedding_lookup,
        trainable=trainable,
        max_norm=max_norm,
        ckpt_to_load_from=ckpt_to_load_from,
        tensor_name_in_ckpt=tensor_name_in_ckpt,
    )


def _unwrapped_type(column: CategoricalColumn) -> type:
    return type(column.base)


def shared_embedding_columns(
    categorical_columns: Sequence[Any],
    dimension: int,
    combiner: str = "mean",
    initializer: InitializerLike | None = None,
    shared_embedding_collection_name: str | None = None,
    max_sequence_lengths: Sequence[int] | None = None,
    learning_rate_fn: LearningRateFn | None = None,
    embedding_lookup_device: str | None = None,
    tensor_core_shape: Sequence[int | None] | None = None,
    use_safe_embedding_lookup: bool = True,
    *,
    trainable: bool = True,
    max_norm: float | None = None,
    ckpt_to_load_from: str | None = None,
    tensor_name_in_ckpt: str | None = None,
) -> list[SharedEmbeddingColumn]:
    """Embedding columns that look up one shared table.

    Args:
        categorical_columns: Categorical columns of one type (weighted or
            sequence forms of that type allowed) with the same number of
            buckets.
        dimension: Width of the embedding, > 0.
        combiner: `"mean"`, `"sum"` or `"sqrtn"`.
        initializer: Callable initializing the table; defaults to a truncated
            normal with mean 0 and stddev `1/sqrt(dimension)`.
        shared_embedding_collection_name: Name of the shared table; defaults
            to the sorted column names joined by `_` plus
            `_shared_embedding`.
        max_sequence_lengths: One per column: positive for sequence columns,
            0 for the others. `None` or empty means all 0.
        learning_rate_fn: Function of the global step giving the table's
            learning rate.
        embedding_lookup_device: As for `embedding_column`.
        tensor_core_shape: As for `embedding_column`.
        use_safe_embedding_lookup: As for `embedding_column`.
        trainable: As for `embedding_column`.
        max_norm: As for `embedding_column`.
        ckpt_to_load_from: As for `embedding_column`.
        tensor_name_in_ckpt: As for `embedding_column`.

    Returns:
        A list of `SharedEmbeddingColumn`, in the order of
        `categorical_columns`, each named
        `<categorical column name>_shared_embedding`.

    Raises:
        ValueError: as `embedding_column`, and if the columns differ in type
            or number of buckets, or `max_sequence_lengths` has another
            length than `categorical_columns`.

    Example:

    >>> item = categorical_column_with_identity("item_id", 1000)
    >>> hist = sequence_categorical_column_with_identity("history", 1000)
    >>> cols = shared_embedding_columns([item, hist], 8,
    ...                                 max_sequence_lengths=[0, 20])
    >>> [c.name for c in cols], cols[0].table_name
    (['item_id_shared_embedding', 'history_shared_embedding'], \
'history_item_id_shared_embedding')
    """
    if not categorical_columns:
        raise ValueError(
            "`categorical_columns` must hold at least one column. "
            f"Received: {categorical_columns!r}"
        )
    converted = [to_categorical_column(c) for c in categorical_columns]
    if not max_sequence_lengths:
        max_sequence_lengths = [0] * len(converted)
    if len(max_sequence_lengths) != len(converted):
        raise ValueError(
            "max_sequence_lengths and categorical_columns must be of the same "
            f"length. len(max_sequence_lengths)={len(max_sequence_lengths)} "
            f"len(categorical_columns)={len(converted)}."
        )
    check_dimension(dimension, ", ".join(c.name for c in converted))
    if initializer is not None and not callable(initializer):
        raise ValueError(
            "initializer must be callable if specified. "
            f"Received: {initializer!r}"
        )
    if initializer is None:
        # One object for the whole table, so that every column agrees on it.
        initializer = default_initializer(dimension)
    ordered = sorted(converted, key=lambda c: c.name)
    first = ordered[0]
    for other in ordered[1:]:
        if _unwrapped_type(other) is not _unwrapped_type(first):
            raise ValueError(
                "To use shared_embedding_column, all categorical_columns must "
                "have the same type, or be weighted_categorical_column or "
                f"sequence column of the same type. Given column: "
                f"{first.name} of type: {_unwrapped_type(first).__name__} "
                f"does not match given column: {other.name} of type: "
                f"{_unwrapped_type(other).__name__}"
            )
        if other.num_buckets != first.num_buckets:
            raise ValueError(
                "To use shared_embedding_column, all categorical_columns must "
                "have the same number of buckets. Given column: "
                f"{first.name} with buckets: {first.num_buckets} does not "
                f"match column: {other.name} with buckets: "
                f"{other.num_buckets}"
            )
    if not shared_embedding_collection_name:
        shared_embedding_collection_name = (
            "_".join(c.name for c in ordered) + "_shared_embedding"
        )
    # What every column of the table shares; each adds its own categorical
    # column and sequence length.
    shared_arguments: dict[str, Any] = dict(
        dimension=dimension,
        combiner=combiner,
        initializer=initializer,
        shared_embedding_collection_name=shared_embedding_collection_name,
        learning_rate_fn=learning_rate_fn,
        embedding_lookup_device=embedding_lookup_device,
        tensor_core_shape=tensor_core_shape,
        use_safe_embedding_lookup=use_safe_embedding_lookup,
        trainable=trainable,
        max_norm=max_norm,
        ckpt_to_load_from=ckpt_to_load_from,
        tensor_name_in_ckpt=tensor_name_in_ckpt,
    )
    return [
        SharedEmbeddingColumn(
            categorical_column=column,
            max_sequence_length=length,
            **shared_arguments,
        )
        for column, length in zip(converted, max_sequence_lengths)
    ]
