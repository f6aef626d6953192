"""Columns + `EmbeddingConfig` -> `tf.tpu.experimental.embedding` configs.

This is the translation the TPU embedding engine is built from: one
`TableConfig` per table (shared columns share the object), one
`FeatureConfig` per column, each table's optimizer from
`EmbeddingConfig.optimizer` with the column's `learning_rate_fn` and the
config's `clipping_limit` folded in. Names are the package's stable table and
column names, so checkpoints line up with `engine_checkpoint`.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import to_embedding_columns
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.optimizers import EmbeddingOptimizer
from keras_tpu_embed.tables import TableSpec
from keras_tpu_embed.tables import group_into_tables


def _tighter(
    a: tuple[float | None, float | None], b: tuple[float | None, float | None]
) -> tuple[float | None, float | None]:
    lows = [x for x in (a[0], b[0]) if x is not None]
    highs = [x for x in (a[1], b[1]) if x is not None]
    return (max(lows) if lows else None, min(highs) if highs else None)


def table_optimizer(
    table: TableSpec, config: EmbeddingConfig, step: Any
) -> EmbeddingOptimizer:
    """The table's optimizer as the engine must see it.

    A column's `learning_rate_fn` becomes the optimizer's dynamic learning
    rate (a callable reading `step`); `clipping_limit` becomes `clipvalue`
    (intersected with the optimizer's own clip, if any).
    """
    optimizer = config.optimizer
    changes: dict[str, Any] = {}
    if table.learning_rate_fn is not None:
        learning_rate_fn = table.learning_rate_fn
        changes["learning_rate"] = lambda: learning_rate_fn(step)
    if config.clipping_limit is not None:
        limit = float(config.clipping_limit)
        changes["clipvalue"] = _tighter(
            optimizer.gradient_clip_bounds, (-limit, limit)
        )
    return dataclasses.replace(optimizer, **changes) if changes else optimizer


def to_tpu_feature_configs(
    columns: Sequence[Any],
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
        table_config = embedding.TableConfig(
            vocabulary_size=table.vocabulary_size,
            dim=table.dimension,
            initializer=table.initializer,
            optimizer=table_optimizer(table, config, step).to_tpu(),
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
        features[name] = feature
    return features
