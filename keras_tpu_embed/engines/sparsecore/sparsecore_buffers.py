"""How many ids each SparseCore must hold in one step, per stacked table.

`TPUEmbeddingV2` preprocesses ids into buffers of a static size per
stacked table and SparseCore: `SparseCoreEmbeddingConfig.max_ids_per_table`
and `max_unique_ids_per_table`, keyed by the names TF's stacking gives
(`tpu_embedding_v3.py`, `_update_sparse_core_buffer_size_after_table_
stacking`). A stack missing from them gets `DEFAULT_MAX_IDS_PER_TABLE`
(256), and with `allow_id_dropping=False` a step whose ids overflow fails
("Sparse core N gets M ids while the max ids per sparse core is set to be
256"), through a config the layer's users never see. A per-replica batch
of 512 with a 20-long history already overflows it.

So the layer sizes the buffers itself, at the first step, when the
per-replica batch and the inputs' static shapes are known. One SparseCore
reads `ceil(samples / SparseCores per chip)` samples of each feature (TF
splits a feature's samples evenly over the chip's SparseCores) and sends
each id to one SparseCore of the system; in the worst case all of them to
the same one. So a stack's bound is, over its features, the sum of those
samples times the feature's ids per sample: the width of dense or sparse
ids, 1 for a sequence feature (fed one sample per position). Its distinct
ids are also bounded by the rows one SparseCore holds of the stack. Neither
is ever below TF's default, which is known to work on the chip.

A third limit is per chip: `max_ids_per_chip_per_sample` (64) times a
stack's samples bounds the ids a chip sends for the stack in one step
(TF's `_get_csr_wrapped_coo_from_sorted_coo_tensor`). So the
layer gives it the stack's ids per chip over its samples, counting the 8
slots TF aligns each SparseCore's ids for each destination to, when that
is over 64.

Ragged ids have no static width: their columns must say their most ids per
example in `EmbeddingConfig.max_ids_per_example`, or have it in a profile
of `kte.profile_lookups` in `EmbeddingConfig.profile_data_directory` (a
maximum over sampled batches, as TF's own statistics are), or the first
step says so, naming them.

Apart from a profile's maximum, these are worst-case bounds, not
measurements: how large a buffer the chip's memory takes has not been
tried on a TPU (none is available here).
"""

from __future__ import annotations

import math
from typing import Iterable
from typing import Mapping
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.engines.sparsecore.profile_files import profiled_max_ids
from keras_tpu_embed.tables.sparsecore_layout import stacking_layouts
from keras_tpu_embed.types import Tensor

_EMBEDDING = tf.tpu.experimental.embedding
_PAD = 8
"""The host kernels' `xla_pad_size`: the CSR buffers' segments align to it."""


def tf_default_buffer() -> int:
    """TF's size for a stack it is given none for (256 in TF 2.21)."""
    default: int = (
        tf.tpu.experimental.embedding.TPUEmbeddingV2.DEFAULT_MAX_IDS_PER_TABLE
    )
    return default


def check_declared_columns(
    layer_description: str,
    config: EmbeddingConfig,
    columns: Sequence[AnyEmbeddingColumn],
) -> None:
    """Raises if `config.max_ids_per_example` names a column the layer
    does not have: its bound would size nothing."""
    declared = config.max_ids_per_example or {}
    # Raw `feature_to_config_dict` features are fed by their own names.
    names = {column.name for column in columns}
    names |= set(config.feature_to_config_dict or {})
    unknown = sorted(set(declared) - names)
    if unknown:
        raise ValueError(
            f"{layer_description}: EmbeddingConfig(max_ids_per_example=...) "
            f"names {unknown}, which are not columns of this layer. Its "
            f"keys are column names (or raw feature_to_config_dict "
            f"names): {sorted(names)}."
        )


def ids_per_sample(
    value: Tensor, feature: tf.tpu.experimental.embedding.FeatureConfig
) -> int | None:
    """The most ids one sample of `feature` holds, from `value`'s static
    shape; None when the shape does not say (ragged, or sparse of unknown
    width)."""
    if feature.max_sequence_length > 0:
        return 1
    shape = value.shape
    if shape.rank is None:
        return None
    width = 1
    for size in shape.as_list()[1:]:
        if size is None:
            return None
        width *= size
    return width


def _samples(feature: tf.tpu.experimental.embedding.FeatureConfig) -> int:
    return math.prod(feature.output_shape)


def buffer_sizes(
    feature_configs: Mapping[str, tf.tpu.experimental.embedding.FeatureConfig],
    inputs: Mapping[str, Tensor],
    declared: Mapping[str, int],
    replicas: int,
    sparse_cores_per_chip: int,
    profiled: Mapping[str, int] | None = None,
) -> tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig:
    """The SparseCore config whose buffers hold any step of these shapes.

    Args:
        feature_configs: The engine's features, by name, each with its
            per-replica `output_shape` set.
        inputs: One step's per-replica ids, by feature name.
        declared: Most ids per example, by feature name
            (`EmbeddingConfig.max_ids_per_example`); these win over the
            static width.
        replicas: TPU chips in the strategy.
        sparse_cores_per_chip: From the TPU's hardware feature.
        profiled: Most ids per example seen by `kte.profile_lookups`, by
            feature name; read only where neither `declared` nor the
            input's shape says.

    Raises:
        ValueError: a feature whose ids per example neither its shape nor
            `declared` says, naming each.
    """
    layouts = stacking_layouts(
        dict(feature_configs), replicas, sparse_cores_per_chip
    )
    max_ids: dict[str, int] = {}
    rows_per_sparse_core: dict[str, int] = {}
    chip_ids: dict[str, int] = {}
    chip_samples: dict[str, int] = {}
    unbounded = []
    for name, feature in feature_configs.items():
        layout = layouts[feature.table.name]
        stack = layout.stacked_table_name
        width = declared.get(name)
        if width is None:
            width = ids_per_sample(inputs[name], feature)
        if width is None:
            width = (profiled or {}).get(name)
        if width is None:
            unbounded.append(name)
            continue
        samples = _samples(feature)
        chip_ids[stack] = chip_ids.get(stack, 0) + samples * width
        chip_samples[stack] = chip_samples.get(stack, 0) + samples
        per_core = math.ceil(samples / sparse_cores_per_chip)
        max_ids[stack] = max_ids.get(stack, 0) + per_core * width
        rows_per_sparse_core[stack] = layout.total_rows_per_sparse_core_shard
    if unbounded:
        raise ValueError(
            "The SparseCore embedding engine sizes its buffers at the first "
            "step from each column's most ids per example, which the "
            f"inputs of columns {sorted(unbounded)} do not say (ragged ids, "
            "or sparse ids of unknown width). Give it: "
            "EmbeddingConfig(max_ids_per_example={"
            + ", ".join(f"{name!r}: ..." for name in sorted(unbounded))
            + "}), or profile them with kte.profile_lookups(dataset, layer) "
            "into EmbeddingConfig(profile_data_directory=...), or feed them "
            "dense [batch, n] (padded with -1) or sparse of a static width."
        )
    floor = tf_default_buffer()
    # Each SparseCore's ids for each destination start on a multiple of
    # `_PAD` slots, wasting up to `_PAD - 1` per pair.
    padding = sparse_cores_per_chip**2 * replicas * (_PAD - 1)
    per_sample = max(
        [
            math.ceil((chip_ids[s] + padding) / chip_samples[s] / _PAD) * _PAD
            for s in chip_ids
        ],
        default=0,
    )
    return tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig(
        disable_table_stacking=False,
        allow_id_dropping=False,
        max_ids_per_chip_per_sample=max(
            per_sample,
            _EMBEDDING.SparseCoreEmbeddingConfig.max_ids_per_chip_per_sample,
        ),
        max_ids_per_table={s: max(n, floor) for s, n in max_ids.items()},
        max_unique_ids_per_table={
            s: max(min(n, rows_per_sparse_core[s]), floor)
            for s, n in max_ids.items()
        },
    )


def profiled_ids(
    configs: Iterable[tuple[EmbeddingConfig, Iterable[str]]],
    feature_configs: Mapping[str, tf.tpu.experimental.embedding.FeatureConfig],
) -> dict[str, int]:
    """`max_ids_per_example` from the profiles in each layer's
    `profile_data_directory`, by column name (each table's file read
    once)."""
    profiled: dict[str, int] = {}
    for config, names in configs:
        directory = config.profile_data_directory
        if not directory:
            continue
        tables = {
            feature_configs[n].table.name for n in names if n in feature_configs
        }
        for table in sorted(tables):
            found = profiled_max_ids(directory, table)
            profiled.update({n: found[n] for n in names if n in found})
    return profiled


def declared_ids(
    configs: Iterable[tuple[EmbeddingConfig, Iterable[str]]],
) -> dict[str, int]:
    """`max_ids_per_example` of every layer on the engine, by column name
    (each column is in one layer)."""
    declared: dict[str, int] = {}
    for config, names in configs:
        bounds = config.max_ids_per_example or {}
        declared.update({n: bounds[n] for n in names if n in bounds})
    return declared
