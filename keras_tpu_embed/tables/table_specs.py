"""Tables: which columns read which embedding table.

An `EmbeddingColumn` owns its table; `SharedEmbeddingColumn`s with one
`shared_embedding_collection_name` read one table. This module groups columns
into `TableSpec`s and checks that columns sharing a table agree on it. What
a table adds to plain rows is here too: its first value from a checkpoint
(`CheckpointInitializer`) and the `max_norm` clip (`clip_rows`).
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Sequence

from keras_tpu_embed._compat import keras
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
            if not first.agrees_on_table(other):
                raise ValueError(
                    f"Columns '{first.name}' and '{other.name}' share the "
                    f"table '{name}' but disagree on it: "
                    f"{first.table_signature()} vs "
                    f"{other.table_signature()}. Build them in one "
                    "shared_embedding_columns call."
                )
        initializer: InitializerLike = first.initializer  # type: ignore[assignment]
        if first.ckpt_to_load_from is not None:
            initializer = CheckpointInitializer(
                first.ckpt_to_load_from,
                str(first.tensor_name_in_ckpt),
                table=name,
            )
        tables.append(
            TableSpec(
                name=name,
                vocabulary_size=first.vocabulary_size,
                dimension=first.dimension,
                initializer=initializer,
                learning_rate_fn=first.learning_rate_fn,
                columns=tuple(members),
                trainable=first.trainable,
                max_norm=first.max_norm,
            )
        )
    return tables


class CheckpointInitializer(keras.initializers.Initializer):  # type: ignore[misc]
    """A table's initial value read from a checkpoint tensor.

    What `ckpt_to_load_from` / `tensor_name_in_ckpt` mean for
    `tf.feature_column.embedding_column`: its variable is initialized from
    that tensor (`feature_column_v2.py`, `EmbeddingColumn.create_state`,
    through `checkpoint_utils.init_from_checkpoint`). Any checkpoint
    `tf.train.load_checkpoint` reads works, name-based (TF1) or
    object-based (whose keys end in `/.ATTRIBUTES/VARIABLE_VALUE`).

    Args:
        checkpoint: Path or prefix of the checkpoint.
        tensor_name: Key of the tensor in it.
        table: The table's name, for error messages.
    """

    def __init__(self, checkpoint: str, tensor_name: str, table: str) -> None:
        self.checkpoint = checkpoint
        self.tensor_name = tensor_name
        self.table = table

    def __call__(self, shape: Any, dtype: Any = None) -> Tensor:
        # Read by a restore op, not held as a constant: inside a trace (the
        # engine creates its tables in the first step's) a constant would
        # be a copy in the graph, which holds at most 2 GB.
        return self.table_rows(shape, 0, int(shape[0]), dtype)

    def table_rows(
        self, shape: Any, start: int, count: int, dtype: Any = None
    ) -> Tensor:
        """Rows `[start, start + count)` of the table, read alone.

        What a TPU pod host asks for (`initialization.EngineInitializer`):
        its shard of the table, read from the checkpoint without the rest.
        """
        reader = self._checked_reader(shape)
        rows, dimension = (int(d) for d in shape)
        stored = reader.get_variable_to_dtype_map()[self.tensor_name]
        prefix = self.checkpoint
        if tf.io.gfile.isdir(prefix):
            prefix = tf.train.latest_checkpoint(prefix)
        (value,) = tf.raw_ops.RestoreV2(
            prefix=prefix,
            tensor_names=[self.tensor_name],
            shape_and_slices=[f"{rows} {dimension} {start},{count}:-"],
            dtypes=[stored],
        )
        return tf.cast(value, dtype or "float32")

    def _checked_reader(self, shape: Any) -> Any:
        where = (
            f"table '{self.table}' (ckpt_to_load_from={self.checkpoint!r}, "
            f"tensor_name_in_ckpt={self.tensor_name!r})"
        )
        try:
            reader = tf.train.load_checkpoint(self.checkpoint)
        except (ValueError, tf.errors.OpError) as error:
            raise ValueError(
                f"Cannot read the checkpoint {self.checkpoint} to initialize "
                f"{where}: {error}. Check ckpt_to_load_from."
            ) from error
        shapes = reader.get_variable_to_shape_map()
        if self.tensor_name not in shapes:
            raise ValueError(
                f"Checkpoint {self.checkpoint} has no tensor "
                f"'{self.tensor_name}' to initialize {where}. Its tensors of "
                f"rank 2: {sorted(n for n, s in shapes.items() if len(s) == 2)}"
            )
        want = [int(d) for d in shape]
        found = list(shapes[self.tensor_name])
        if found != want:
            raise ValueError(
                f"Tensor '{self.tensor_name}' of checkpoint {self.checkpoint} "
                f"has shape {found}, but {where} has shape {want} "
                "([vocabulary_size, dimension]). Point tensor_name_in_ckpt at "
                "the table's tensor, or give the column the checkpoint's "
                "vocabulary and dimension."
            )
        return reader

    def get_config(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "tensor_name": self.tensor_name,
            "table": self.table,
        }


def clip_rows(rows: Tensor, max_norm: float | None) -> Tensor:
    """`rows` `[..., dim]`, each scaled down to L2 norm `max_norm` if larger.

    The legacy semantics of `max_norm`: `embedding_ops.embedding_lookup`
    (`tensorflow/python/ops/embedding_ops.py`, `_clip`) clips every gathered
    row with `clip_by_norm` before `embedding_lookup_sparse` combines them.
    Rows of zeros (padding) stay zero and have a finite gradient.

    Computed as `rows * (max_norm / norm)` for the rows over the limit and
    `rows` for the others, not as `clip_by_norm`'s `rows * max_norm /
    max(norm, max_norm)`: that product overflows to inf for a large
    `max_norm` (`1e37` with values above ~34) although no row needs
    clipping.
    """
    if max_norm is None:
        return rows
    squares = tf.reduce_sum(rows * rows, axis=-1, keepdims=True)
    # clip_by_norm's guard: the root's gradient at 0 is inf.
    positive = squares > 0
    norm = tf.where(
        positive, tf.sqrt(tf.where(positive, squares, 1.0)), squares
    )
    over = norm > max_norm
    factor = tf.where(over, max_norm / tf.where(over, norm, 1.0), 1.0)
    return rows * factor
