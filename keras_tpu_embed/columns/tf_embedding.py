"""Converts `tf.feature_column` and TPU embedding columns to our specs.

Existing feature-column code migrates without edits: wherever a column of
this package is accepted, a column built with `tf.feature_column.*`,
`tf.compat.v1.tpu.experimental.embedding_column` or
`shared_embedding_columns` is accepted too and converted here, once.
"""

from __future__ import annotations

from typing import Any
from typing import Iterable

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf_feature_column_v2 as fc
from keras_tpu_embed._compat import tf_init_ops
from keras_tpu_embed._tf_private import TFTPUEmbeddingColumn
from keras_tpu_embed._tf_private import TFTPUSharedEmbeddingColumn
from keras_tpu_embed._tf_private import TPUColumnArguments
from keras_tpu_embed._tf_private import shared_column_creator_arguments
from keras_tpu_embed._tf_private import tpu_column_arguments
from keras_tpu_embed.columns import embedding as embedding_lib
from keras_tpu_embed.columns.categorical_base import CategoricalColumn
from keras_tpu_embed.columns.tf_categorical import to_categorical_column
from keras_tpu_embed.types import InitializerLike
from keras_tpu_embed.types import TFFeatureColumn


def _initializer(
    initializer: InitializerLike | None,
) -> InitializerLike | None:
    """Maps TF's default truncated normal to its serializable Keras twin."""
    if type(initializer) is not tf_init_ops.TruncatedNormal:
        return initializer
    default: Any = initializer  # TF's own class: mypy sees no fields
    twin: InitializerLike = keras.initializers.TruncatedNormal(
        mean=default.mean, stddev=default.stddev, seed=default.seed
    )
    return twin


def _device_name(arguments: TPUColumnArguments) -> str | None:
    device = arguments.embedding_lookup_device
    return None if device is None else device.name.lower()


def _convert_embedding_column(
    column: TFFeatureColumn,
) -> embedding_lib.AnyEmbeddingColumn:
    if isinstance(column, TFTPUSharedEmbeddingColumn):
        creator = column.shared_embedding_column_creator
        arguments = tpu_column_arguments(column)
        return embedding_lib.SharedEmbeddingColumn(
            categorical_column=to_categorical_column(column.categorical_column),
            dimension=creator.dimension,
            combiner=column.combiner,
            initializer=_initializer(arguments.initializer),
            shared_embedding_collection_name=(
                arguments.shared_embedding_collection_name
            ),
            max_sequence_length=arguments.max_sequence_length,
            learning_rate_fn=arguments.learning_rate_fn,
            embedding_lookup_device=_device_name(arguments),
            tensor_core_shape=arguments.tensor_core_shape,
            use_safe_embedding_lookup=column.use_safe_embedding_lookup,
        )
    if isinstance(column, TFTPUEmbeddingColumn):
        arguments = tpu_column_arguments(column)
        return embedding_lib.EmbeddingColumn(
            categorical_column=to_categorical_column(column.categorical_column),
            dimension=column.dimension,
            combiner=column.combiner,
            initializer=_initializer(column.initializer),
            max_sequence_length=arguments.max_sequence_length,
            learning_rate_fn=arguments.learning_rate_fn,
            embedding_lookup_device=_device_name(arguments),
            tensor_core_shape=arguments.tensor_core_shape,
            use_safe_embedding_lookup=column.use_safe_embedding_lookup,
        )
    if isinstance(column, fc.SharedEmbeddingColumn):
        creator = shared_column_creator_arguments(
            column.shared_embedding_column_creator
        )
        categorical = to_categorical_column(column.categorical_column)
        return embedding_lib.SharedEmbeddingColumn(
            categorical_column=categorical,
            dimension=creator.dimension,
            combiner=column.combiner,
            initializer=_initializer(creator.initializer),
            shared_embedding_collection_name=creator.name,
            # tf.feature_column has no sequence length of its own; the TPU
            # convention of padding to a length needs one, so it is refused.
            max_sequence_length=_require_no_sequence(categorical),
            use_safe_embedding_lookup=column.use_safe_embedding_lookup,
            trainable=creator.trainable,
            max_norm=column.max_norm,
            ckpt_to_load_from=creator.ckpt_to_load_from,
            tensor_name_in_ckpt=creator.tensor_name_in_ckpt,
        )
    if isinstance(column, fc.EmbeddingColumn):
        categorical = to_categorical_column(column.categorical_column)
        return embedding_lib.EmbeddingColumn(
            categorical_column=categorical,
            dimension=column.dimension,
            combiner=column.combiner,
            initializer=_initializer(column.initializer),
            max_sequence_length=_require_no_sequence(categorical),
            use_safe_embedding_lookup=column.use_safe_embedding_lookup,
            trainable=bool(column.trainable),
            max_norm=column.max_norm,
            ckpt_to_load_from=column.ckpt_to_load_from,
            tensor_name_in_ckpt=column.tensor_name_in_ckpt,
        )
    raise TypeError(
        "Expected an embedding column (keras_tpu_embed.embedding_column, "
        "shared_embedding_columns, tf.feature_column.embedding_column or "
        "tf.compat.v1.tpu.experimental.embedding_column). Received: "
        f"{type(column).__name__} {getattr(column, 'name', column)!r}"
    )


def _require_no_sequence(column: CategoricalColumn) -> int:
    if column.is_sequence:
        raise ValueError(
            f"Sequence column '{column.name}' comes from "
            "tf.feature_column.embedding_column, which has no "
            "max_sequence_length. Build it with kte.embedding_column(..., "
            "max_sequence_length=N) or "
            "tf.compat.v1.tpu.experimental.embedding_column."
        )
    return 0


def to_embedding_column(
    column: embedding_lib.EmbeddingColumnLike,
) -> embedding_lib.AnyEmbeddingColumn:
    """Returns `column` as an embedding column of this package."""
    if isinstance(
        column,
        (embedding_lib.EmbeddingColumn, embedding_lib.SharedEmbeddingColumn),
    ):
        return column
    return _convert_embedding_column(column)


def to_embedding_columns(
    columns: Iterable[embedding_lib.EmbeddingColumnLike],
) -> list[embedding_lib.AnyEmbeddingColumn]:
    """Converts a list of embedding columns, refusing duplicate names."""
    if isinstance(columns, (str, bytes)) or not isinstance(columns, Iterable):
        raise TypeError(
            "`columns` must be a list of embedding columns. "
            f"Received: {columns!r}"
        )
    converted = [to_embedding_column(c) for c in columns]
    if not converted:
        raise ValueError("`columns` must hold at least one embedding column.")
    seen: set[str] = set()
    for column in converted:
        if column.name in seen:
            raise ValueError(
                f"Column '{column.name}' appears twice in `columns`."
            )
        seen.add(column.name)
    return converted
