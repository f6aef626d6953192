"""Lookup statistics per table, from a sample of the input pipeline.

TPUEstimator's `profile_data_directory` kept statistics of how many ids each
feature looks up, which the TPU engine uses to size its buffers. This module
computes them from a few batches of preprocessed input and keeps one small
JSON file per table (`profile_files.py`); an existing file is reused rather
than recomputed. On SparseCore TPUs, a layer whose `EmbeddingConfig` names
the directory sizes the buffers of columns fed ragged ids from their
`max_ids_per_example` there.

For each table: per feature the average and maximum number of ids per
example, and how the table's ids spread over `num_shards` shards under the
configured partition strategy (`"div"`: contiguous row ranges; `"mod"`: row
`i` on shard `i % num_shards`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any
from typing import Sequence

import numpy as np

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import to_embedding_columns
from keras_tpu_embed.columns.embedding import EmbeddingColumnLike
from keras_tpu_embed.config import SUPPORTED_PARTITION_STRATEGIES
from keras_tpu_embed.engines.sparsecore.profile_files import profile_path
from keras_tpu_embed.layers import TPUEmbeddingLayer
from keras_tpu_embed.placement.ids import to_id_batch
from keras_tpu_embed.tables.table_specs import group_into_tables


def shard_of(
    ids: Any, vocabulary_size: int, num_shards: int, strategy: str
) -> Any:
    """The shard of each row id under `strategy` ("div" or "mod")."""
    if strategy == "mod":
        return ids % num_shards
    rows_per_shard = math.ceil(vocabulary_size / num_shards)
    return ids // rows_per_shard


def profile_lookups(
    dataset: tf.data.Dataset,
    columns: Sequence[EmbeddingColumnLike] | TPUEmbeddingLayer,
    directory: str | None = None,
    num_batches: int = 10,
    num_shards: int = 8,
    partition_strategy: str | None = None,
    overwrite: bool = False,
) -> dict[str, dict[str, Any]]:
    """Computes (or reuses) per-table lookup statistics; returns them.

    Args:
        dataset: Yields the preprocessor's output (a dict of ids / weights),
            or `(features, labels)` pairs of it.
        columns: The embedding columns whose tables to profile, or an
            embedding layer: then `directory` and `partition_strategy`
            default to its `EmbeddingConfig`'s `profile_data_directory` and
            `partition_strategy`.
        directory: Where the JSON files go (created if needed).
        num_batches: How many batches to sample.
        num_shards: Number of shards to report the spread over.
        partition_strategy: `"div"` (the default) or `"mod"`.
        overwrite: Recompute even when a table's file exists.

    Returns:
        The statistics, keyed by table name.

    Example:

    >>> import tempfile
    >>> item = categorical_column_with_identity("item", 100)
    >>> ids = tf.constant([[1, 2], [3, -1]])
    >>> ds = tf.data.Dataset.from_tensors({"item": ids})
    >>> stats = profile_lookups(ds, [embedding_column(item, 4)],
    ...                         tempfile.mkdtemp(), num_shards=2)
    >>> stats["item"]["features"]["item"]["mean_ids_per_example"]
    1.5
    """

    if isinstance(columns, TPUEmbeddingLayer):
        directory = directory or columns.config.profile_data_directory
        partition_strategy = (
            partition_strategy or columns.config.partition_strategy
        )
        columns = columns.columns
    partition_strategy = partition_strategy or "div"
    if not directory:
        raise ValueError(
            "`directory` is required (or pass a layer whose EmbeddingConfig "
            "sets `profile_data_directory`)."
        )
    if partition_strategy not in SUPPORTED_PARTITION_STRATEGIES:
        raise ValueError(
            "Invalid value for argument `partition_strategy`. Expected one of "
            f"{SUPPORTED_PARTITION_STRATEGIES}. Received: "
            f"partition_strategy={partition_strategy!r}"
        )
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(
            f"`num_shards` must be a positive integer. Received: {num_shards!r}"
        )
    tables = group_into_tables(to_embedding_columns(columns))
    os.makedirs(directory, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    todo = []
    for table in tables:
        path = profile_path(directory, table.name)
        if os.path.exists(path) and not overwrite:
            with open(path) as handle:
                results[table.name] = json.load(handle)
        else:
            todo.append(table)
    if not todo:
        return results

    counts: dict[str, list[np.ndarray]] = {}
    shard_hits = {t.name: np.zeros(num_shards, np.int64) for t in todo}
    for element in dataset.take(num_batches):
        features = element[0] if isinstance(element, tuple) else element
        for table in todo:
            for column in table.columns:
                batch = to_id_batch(
                    column.feature_key, features[column.feature_key]
                )
                ids = batch.ids.numpy()
                valid = ids >= 0
                per_example = np.bincount(
                    batch.rows.numpy()[valid],
                    minlength=int(batch.batch_size.numpy()),
                )
                counts.setdefault(column.name, []).append(per_example)
                shards = shard_of(
                    ids[valid],
                    table.vocabulary_size,
                    num_shards,
                    partition_strategy,
                )
                shard_hits[table.name] += np.bincount(
                    shards, minlength=num_shards
                )[:num_shards]
    for table in todo:
        features = {}
        for column in table.columns:
            per_example = np.concatenate(counts.get(column.name, [np.zeros(0)]))
            features[column.feature_key] = {
                "column": column.name,
                "examples": int(per_example.size),
                "mean_ids_per_example": float(per_example.mean())
                if per_example.size
                else 0.0,
                "max_ids_per_example": int(per_example.max())
                if per_example.size
                else 0,
            }
        hits = shard_hits[table.name]
        total = int(hits.sum())
        stats = {
            "table": table.name,
            "vocabulary_size": table.vocabulary_size,
            "dimension": table.dimension,
            "partition_strategy": partition_strategy,
            "num_shards": num_shards,
            "features": features,
            "ids_per_shard": hits.tolist(),
            # max shard load over mean load: 1.0 is a perfect spread.
            "shard_imbalance": float(hits.max() / (total / num_shards))
            if total
            else 0.0,
        }
        with open(profile_path(directory, table.name), "w") as handle:
            json.dump(stats, handle, indent=2, sort_keys=True)
        results[table.name] = stats
    return results
