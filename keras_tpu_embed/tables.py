"""Tables: which columns read which embedding table.

An `EmbeddingColumn` owns its table; `SharedEmbeddingColumn`s with one
`shared_embedding_collection_name` read one table. This module groups columns
into `TableSpec`s and checks that columns sharing a table agree on it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.columns import SharedEmbeddingColumn
from keras_tpu_embed.types import InitializerLike
from keras_tpu_embed.types import LearningRateFn
from keras_tpu_embed.types import Tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class TableSpec:
    """One embedding table and the columns that look it up."""

    name: str
    vocabulary_size: int
    dimension: int
    initializer: InitializerLike
    learning_rate_fn: LearningRateFn | None
    columns: tuple[AnyEmbeddingColumn, ...]
    # False: never updated and without optimizer slots.
    trainable: bool = True
    # Rows are clipped to this L2 norm before combining (None: no clipping).
    max_norm: float | None = None


def group_into_tables(
    columns: Sequence[AnyEmbeddingColumn],
) -> list[TableSpec]:
    """Groups columns by table, in order of first appearance.

    Raises:
        ValueError: if two columns name one table but disagree on its
            vocabulary size, dimension, initializer or learning-rate function,
            or an unshared column's table name collides with another table.
    """
    by_name: dict[str, list[AnyEmbeddingColumn]] = {}
    for column in columns:
        by_name.setdefault(column.table_name, []).append(column)
    tables = []
    for name, members in by_name.items():
        first = members[0]
        signature = json.dumps(first.table_signature(), sort_keys=True)
        for other in members[1:]:
            if not (
                isinstance(first, SharedEmbeddingColumn)
                and isinstance(other, SharedEmbeddingColumn)
            ):
                raise ValueError(
                    f"Columns '{first.name}' and '{other.name}' both name the "
                    f"table '{name}', but only shared_embedding_columns may "
                    "share a table. Give one of them another categorical "
                    "column name or shared_embedding_collection_name."
                )
            if json.dumps(other.table_signature(), sort_keys=True) != (
                signature
            ):
                raise ValueError(
                    f"Columns '{first.name}' and '{other.name}' share the "
                    f"table '{name}' but disagree on it: "
                    f"{first.table_signature()} vs "
                    f"{other.table_signature()}. Build them in one "
                    "shared_embedding_columns call."
                )
        tables.append(
            TableSpec(
                name=name,
                vocabulary_size=first.vocabulary_size,
                dimension=first.dimension,
                initializer=first.initializer,  # type: ignore[arg-type]
                learning_rate_fn=first.learning_rate_fn,
                columns=tuple(members),
                trainable=first.trainable,
                max_norm=first.max_norm,
            )
        )
    return tables


def clip_rows(rows: Tensor, max_norm: float | None) -> Tensor:
    """`rows` `[..., dim]`, each scaled down to L2 norm `max_norm` if larger.

    The legacy semantics of `max_norm`: `embedding_ops.embedding_lookup`
    (`tensorflow/python/ops/embedding_ops.py`, `_clip`) clips every gathered
    row with `clip_by_norm` before `embedding_lookup_sparse` combines them.
    Rows of zeros (padding) stay zero and have a finite gradient.
    """
    if max_norm is None:
        return rows
    return tf.clip_by_norm(rows, max_norm, axes=[-1])
