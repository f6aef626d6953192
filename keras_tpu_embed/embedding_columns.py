"""Embedding column specs: a categorical column plus the table it looks up.

`embedding_column` and `shared_embedding_columns` take exactly the arguments
of `tf.compat.v1.tpu.experimental.embedding_column` /
`shared_embedding_columns` and raise the same `ValueError`s, with messages
that name the column and the bad value.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from typing import Sequence

from keras_tpu_embed import columns as columns_lib
from keras_tpu_embed._compat import keras
from keras_tpu_embed.devices import LookupDevice
from keras_tpu_embed.devices import parse_lookup_device
from keras_tpu_embed.types import SUPPORTED_COMBINERS
from keras_tpu_embed.types import InitializerLike
from keras_tpu_embed.types import LearningRateFn


def default_initializer(dimension: int) -> keras.initializers.Initializer:
    """Truncated normal, mean 0, stddev 1/sqrt(dimension), as TF's default."""
    return keras.initializers.TruncatedNormal(
        mean=0.0, stddev=1.0 / math.sqrt(dimension)
    )


def _serialize_callable(value: Any) -> Any:
    if value is None:
        return None
    return keras.saving.serialize_keras_object(value)


def _deserialize_callable(value: Any) -> Any:
    if value is None:
        return None
    return keras.saving.deserialize_keras_object(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _EmbeddingSpec:
    categorical_column: columns_lib.CategoricalColumn
    dimension: int
    combiner: str = "mean"
    initializer: InitializerLike | None = None
    max_sequence_length: int = 0
    learning_rate_fn: LearningRateFn | None = None
    embedding_lookup_device: str | None = None
    tensor_core_shape: tuple[int | None, int] | None = None
    use_safe_embedding_lookup: bool = True

    def __post_init__(self) -> None:
        column = self.categorical_column
        if not isinstance(column, columns_lib.CategoricalColumn):
            raise TypeError(
                "`categorical_column` must be a categorical column of "
                "keras_tpu_embed, tf.feature_column or "
                "tf.compat.v1.tpu.experimental. Received: "
                f"{type(column).__name__}"
            )
        _check_dimension(self.dimension, column.name)
        if self.combiner not in SUPPORTED_COMBINERS:
            raise ValueError(
                "Invalid value for argument `combiner` of column "
                f"'{column.name}'. Expected one of {SUPPORTED_COMBINERS}. "
                f"Received: combiner={self.combiner!r}"
            )
        if self.initializer is not None and not callable(self.initializer):
            raise ValueError(
                "initializer must be callable if specified. Embedding of "
                f"column_name: {column.name}. Received: {self.initializer!r}"
            )
        if self.initializer is None:
            object.__setattr__(
                self, "initializer", default_initializer(self.dimension)
            )
        _check_max_sequence_length(column, self.max_sequence_length)
        if self.learning_rate_fn is not None and not callable(
            self.learning_rate_fn
        ):
            raise ValueError(
                f"`learning_rate_fn` of column '{column.name}' must be a "
                "function of the global step. Received: "
                f"{self.learning_rate_fn!r}"
            )
        device = parse_lookup_device(self.embedding_lookup_device)
        shape = _check_tensor_core_shape(self.tensor_core_shape, column.name)
        object.__setattr__(self, "tensor_core_shape", shape)
        # Sequence columns are padded to `max_sequence_length` already, so
        # that is their width; TF's own column asks for the shape anyway.
        if (
            device is LookupDevice.TPU_TENSOR_CORE
            and shape is None
            and not column.is_sequence
        ):
            raise ValueError(
                "Using embedding_lookup_device=tpu_tensor_core requires "
                f"tensor_core_shape to be set. Column: {column.name}"
            )

    @property
    def lookup_device(self) -> LookupDevice | None:
        """The column's `embedding_lookup_device` as a `LookupDevice`."""
        return parse_lookup_device(self.embedding_lookup_device)

    @property
    def is_sequence(self) -> bool:
        return self.categorical_column.is_sequence

    @property
    def feature_key(self) -> str:
        return self.categorical_column.feature_key

    @property
    def weight_feature_key(self) -> str | None:
        return self.categorical_column.weight_feature_key

    @property
    def vocabulary_size(self) -> int:
        return self.categorical_column.num_buckets

    @property
    def table_name(self) -> str:
        raise NotImplementedError

    def table_signature(self) -> dict[str, Any]:
        """What a table is made of; columns sharing a table must agree."""
        return {
            "vocabulary_size": self.vocabulary_size,
            "dimension": self.dimension,
            "initializer": _serialize_callable(self.initializer),
            "learning_rate_fn": _serialize_callable(self.learning_rate_fn),
        }

    def get_config(self) -> dict[str, Any]:
        config = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self)
        }
        config["categorical_column"] = keras.saving.serialize_keras_object(
            self.categorical_column
        )
        config["initializer"] = _serialize_callable(self.initializer)
        config["learning_rate_fn"] = _serialize_callable(self.learning_rate_fn)
        if self.tensor_core_shape is not None:
            config["tensor_core_shape"] = list(self.tensor_core_shape)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        config = dict(config)
        config["categorical_column"] = keras.saving.deserialize_keras_object(
            config["categorical_column"]
        )
        config["initializer"] = _deserialize_callable(config["initializer"])
        config["learning_rate_fn"] = _deserialize_callable(
            config["learning_rate_fn"]
        )
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_tpu_embed")
@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddingColumn(_EmbeddingSpec):
    """An embedding column with a table of its own. See `embedding_column`."""

    @property
    def name(self) -> str:
        return f"{self.categorical_column.name}_embedding"

    @property
    def table_name(self) -> str:
        # TF names the table variable after the categorical column.
        return self.categorical_column.name


@keras.saving.register_keras_serializable(package="keras_tpu_embed")
@dataclasses.dataclass(frozen=True, kw_only=True)
class SharedEmbeddingColumn(_EmbeddingSpec):
    """One feature of a shared table. See `shared_embedding_columns`."""

    shared_embedding_collection_name: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.shared_embedding_collection_name:
            raise ValueError(
                "`shared_embedding_collection_name` of a shared column must "
                "name its table; build shared columns with "
                "`shared_embedding_columns`."
            )

    @property
    def name(self) -> str:
        return f"{self.categorical_column.name}_shared_embedding"

    @property
    def table_name(self) -> str:
        return self.shared_embedding_collection_name


AnyEmbeddingColumn = EmbeddingColumn | SharedEmbeddingColumn


def _check_dimension(dimension: Any, name: str) -> None:
    if (
        dimension is None
        or not isinstance(dimension, int)
        or isinstance(dimension, bool)
        or dimension < 1
    ):
        raise ValueError(
            f"Invalid dimension {dimension!r} for column {name}: `dimension` "
            "must be a positive integer."
        )


def _check_max_sequence_length(
    column: columns_lib.CategoricalColumn, max_sequence_length: Any
) -> None:
    if not isinstance(max_sequence_length, int) or max_sequence_length < 0:
        raise ValueError(
            f"max_sequence_length of column {column.name} must be a "
            f"non-negative integer. Got {max_sequence_length!r}."
        )
    if column.is_sequence and max_sequence_length < 1:
        raise ValueError(
            "max_sequence_length must be greater than 0 for sequence columns. "
            f"Got max_sequence_length={max_sequence_length} for sequence "
            f"column {column.name}."
        )
    if not column.is_sequence and max_sequence_length != 0:
        raise ValueError(
            f"Non zero max_seq_length={max_sequence_length} specified for non "
            f"sequence column {column.name}."
        )


def _check_tensor_core_shape(
    shape: Any, name: str
) -> tuple[int | None, int] | None:
    if not shape:
        return None
    if len(shape) != 2:
        raise ValueError(
            f"tensor_core_shape must be size 2. Got {list(shape)} for column "
            f"{name}."
        )
    batch, width = shape
    if (
        batch is not None
        and batch != -1
        and (not isinstance(batch, int) or batch < 1)
    ):
        raise ValueError(
            f"The batch dimension of tensor_core_shape of column {name} must "
            f"be None, -1 or a positive integer. Got {list(shape)}."
        )
    if not isinstance(width, int) or width < 1:
        raise ValueError(
            f"The second dimension of tensor_core_shape of column {name} must "
            f"be a positive integer. Got {list(shape)}."
        )
    return (None if batch in (None, -1) else batch, width)


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
    from keras_tpu_embed.column_conversion import to_categorical_column

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
    )


def _unwrapped_type(column: columns_lib.CategoricalColumn) -> type:
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
    from keras_tpu_embed.column_conversion import to_categorical_column

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
    _check_dimension(dimension, ", ".join(c.name for c in converted))
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
    return [
        SharedEmbeddingColumn(
            categorical_column=column,
            dimension=dimension,
            combiner=combiner,
            initializer=initializer,
            shared_embedding_collection_name=shared_embedding_collection_name,
            max_sequence_length=length,
            learning_rate_fn=learning_rate_fn,
            embedding_lookup_device=embedding_lookup_device,
            tensor_core_shape=tensor_core_shape,  # type: ignore[arg-type]
            use_safe_embedding_lookup=use_safe_embedding_lookup,
        )
        for column, length in zip(converted, max_sequence_lengths)
    ]
