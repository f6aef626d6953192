"""`SharedTPUEmbedding`: one embedding table looked up by several features.

A `TPUEmbeddingLayer` whose columns all share one table; it can also build
those columns itself from categorical columns and a `dimension`.
"""

from __future__ import annotations

from typing import Any
from typing import Sequence

from keras_tpu_embed._compat import tf_feature_column_v2
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.columns import CategoricalColumn
from keras_tpu_embed.columns import SharedEmbeddingColumn
from keras_tpu_embed.columns import shared_embedding_columns
from keras_tpu_embed.columns import to_embedding_columns
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.layers import TPUEmbeddingLayer
from keras_tpu_embed.serialization import serializable


@serializable
class SharedTPUEmbedding(TPUEmbeddingLayer):
    """One embedding table looked up by several features.

    Build it from the output of `shared_embedding_columns`, or from
    categorical columns plus `dimension` (then `combiner`,
    `max_sequence_lengths` and `shared_embedding_collection_name` are passed
    to `shared_embedding_columns`).

    Args:
        columns: Shared embedding columns of one table, or categorical
            columns when `dimension` is given.
        config: As `TPUEmbeddingLayer`.
        serving_lookup_device: As `TPUEmbeddingLayer`.
        output: As `TPUEmbeddingLayer`.
        return_sequence_lengths: As `TPUEmbeddingLayer`.
        dimension: Builds the shared columns from categorical `columns`.
        combiner: With `dimension`.
        max_sequence_lengths: With `dimension`.
        shared_embedding_collection_name: With `dimension`.
        **kwargs: Base `keras.layers.Layer` arguments.

    Example:

    >>> item = categorical_column_with_identity("item_id", 100)
    >>> hist = sequence_categorical_column_with_identity("history", 100)
    >>> layer = SharedTPUEmbedding([item, hist], dimension=8,
    ...                            max_sequence_lengths=[0, 5])
    >>> out = layer({"item_id": tf.constant([3, 4]),
    ...              "history": tf.constant([[1, 2, -1], [4, -1, -1]])})
    >>> out["history_shared_embedding"].shape
    TensorShape([2, 5, 8])
    """

    def __init__(
        self,
        # `tf.feature_column` forms are converted (`to_embedding_columns`).
        columns: Sequence[
            AnyEmbeddingColumn
            | CategoricalColumn
            | tf_feature_column_v2.fc_types.FeatureColumn
        ],
        config: EmbeddingConfig | None = None,
        serving_lookup_device: str | None = None,
        output: str = "dict",
        return_sequence_lengths: bool = False,
        dimension: int | None = None,
        combiner: str = "mean",
        max_sequence_lengths: Sequence[int] | None = None,
        shared_embedding_collection_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        if dimension is not None:
            columns = shared_embedding_columns(
                columns,
                dimension,
                combiner=combiner,
                max_sequence_lengths=max_sequence_lengths,
                shared_embedding_collection_name=(
                    shared_embedding_collection_name
                ),
            )
        converted: list[AnyEmbeddingColumn] = to_embedding_columns(columns)
        if not all(isinstance(c, SharedEmbeddingColumn) for c in converted):
            raise TypeError(
                "SharedTPUEmbedding takes the output of "
                "shared_embedding_columns, or categorical columns with "
                "`dimension`. Use TPUEmbeddingLayer for unshared columns."
            )
        tables = sorted({c.table_name for c in converted})
        if len(tables) != 1:
            raise ValueError(
                "SharedTPUEmbedding holds one shared table; its columns name "
                f"the tables {tables}. Use one layer per table or "
                "TPUEmbeddingLayer."
            )
        super().__init__(
            converted,
            config=config,
            serving_lookup_device=serving_lookup_device,
            output=output,
            return_sequence_lengths=return_sequence_lengths,
            **kwargs,
        )
