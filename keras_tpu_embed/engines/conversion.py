"""Columns + `EmbeddingConfig` -> `tf.tpu.experimental.embedding` configs.

This is the translation the TPU embedding engine is built from: one
`TableConfig` per table (shared columns share the object), one
`FeatureConfig` per column, each table's optimizer from
`EmbeddingConfig.optimizer` with the column's `learning_rate_fn` and the
config's `clipping_limit` folded in, and each table's initializer wrapped
so that a pod's hosts each start from their rows of the one-device table
(`initialization.EngineInitializer`). Names are the package's stable table and
column names, so checkpoints line up with `engine_checkpoint`.
"""

from __future__ import annotations

from typing import Any
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.backends.embedding_step import engine_optimizer
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.columns import to_embedding_columns
from keras_tpu_embed.columns.embedding import EmbeddingColumnLike
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.optimizers.base import protobuf_safe
from keras_tpu_embed.tables.initialization import EngineInitializer
from keras_tpu_embed.tables.table_specs import group_into_tables


def to_tpu_feature_configs(
    columns: Sequence[EmbeddingColumnLike],
    config: EmbeddingConfig | None = None,
    step: Any = None,
) -> dict[str, Any]:
    """The `tf.tpu.experimental.embedding.FeatureConfig`s of `columns`.

    Args:
        columns: Embedding columns (ours or TF's).
        config: The `EmbeddingConfig`; defaults to `EmbeddingConfig()`.
            Its `feature_to_config_dict` entries are added as they are.
        step: The global embedding step that `learning_rate_fn`s read; a
            new int64 variable at 0 when None.

    Returns:
        A dict from column name to `FeatureConfig`.

    Raises:
        ValueError: `partition_strategy="mod"`, which the mid-level API does
            not implement (it shards rows contiguously, "div"); or a
            `feature_to_config_dict` key that collides with a column name.

    Example:

    >>> item = categorical_column_with_identity("item", 100)
    >>> configs = to_tpu_feature_configs([embedding_column(item, 8)])
    >>> table = configs["item_embedding"].table
    >>> table.name, table.vocabulary_size, table.dim
    ('item', 100, 8)
    """
    config = config or EmbeddingConfig()
    if config.partition_strategy != "div":
        raise ValueError(
            "partition_strategy='mod' is not supported on TPU: "
            "tf.tpu.experimental.embedding shards table rows contiguously "
            "('div'). Use partition_strategy='div' for the TPU engine."
        )
    if step is None:
        step = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="embedding_step"
        )
    embedding = tf.tpu.experimental.embedding
    features: dict[str, Any] = {}
    for table in group_into_tables(to_embedding_columns(columns)):
        first = table.columns[0]
        _refuse_what_the_engine_ignores(first)
        table_config = embedding.TableConfig(
            vocabulary_size=table.vocabulary_size,
            dim=table.dimension,
            # Called once per host on a pod: each shard gets its rows.
            initializer=EngineInitializer(
                table.initializer,
                table=table.name,
                columns=[column.name for column in table.columns],
            ),
            optimizer=engine_optimizer(table, config, step).to_tpu(),
            combiner=first.combiner,
            name=table.name,
        )
        for column in table.columns:
            features[column.name] = embedding.FeatureConfig(
                table=table_config,
                max_sequence_length=column.max_sequence_length,
                name=column.name,
            )
    for name, feature in (config.feature_to_config_dict or {}).items():
        if name in features:
            raise ValueError(
                f"feature_to_config_dict has the key '{name}', which is "
                "already a column name; rename one of them."
            )
        if feature.table.optimizer is not None:
            # A raw TF optimizer carries the same bool that breaks the
            # engine's proto (see `optimizers.base.protobuf_safe`).
            protobuf_safe(feature.table.optimizer)
        features[name] = feature
    return features


def _refuse_what_the_engine_ignores(column: AnyEmbeddingColumn) -> None:
    """Column arguments `tf.tpu.experimental.embedding` has no field for.

    `TableConfig` (`tpu_embedding_v2_utils.py`) has no `trainable` flag:
    the engine updates every table it holds. Nor has it a `max_norm`: the
    engine combines the stored rows as they are, so a clipped column would
    train and answer unclipped.
    """
    if column.max_norm is not None:
        raise ValueError(
            f"Column '{column.name}' has max_norm={column.max_norm}, but the "
            "TPU embedding engine combines rows without clipping them. Give "
            "it embedding_lookup_device='tpu_tensor_core' (with "
            "tensor_core_shape), which clips as tf.feature_column does, or "
            "drop max_norm."
        )
    if not column.trainable:
        raise ValueError(
            f"Column '{column.name}' has trainable=False, but the TPU "
            "embedding engine trains every table it holds. Give it "
            "embedding_lookup_device='tpu_tensor_core' (with "
            "tensor_core_shape) so that the layer holds the frozen table."
        )
