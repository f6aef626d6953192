"""SparseCore tables: stacked and sharded on the TPU, whole on CPU.

`TPUEmbeddingV2` (`tpu_embedding_v3.py`) stacks tables of one width and
optimizer into one variable per stack and spreads its rows over every
SparseCore of the system. TF documents where a row goes
(`tpu_embedding_v3_utils.map_indices_in_shard`): row `r` of a table lives on
SparseCore `(r % n + rotation) % n` of the `n`, at row
`offset + r // n` of that core's shard, where the table's `offset` in the
shard and its `rotation` are in its `SparseCoreTableLayout`. The stacked
variable is the `n` shards one after the other, `total_rows_per_sparse_core_
shard` rows each, with every table padded to the stack's width
(`unsharded_padded_shape`). Slots have the layout of their table.

So each SparseCore holds a table's rows `first, first + n, ...` (`first =
(core - rotation) % n`) one after the other: `core_rows` says where, per
SparseCore, which is all that creating, saving or restoring one shard at a
time needs. In a checkpoint a table is saved as TF's "internal layout"
without the rotation (`tpu_embedding_v3_utils.shard_table`): `[n, rows per
core, padded width]`, entry `[c, i]` being row `c + i * n` of the padded
table, so that SparseCore `core` holds exactly `[first]` of it.

`unstack_table` takes one table out of a stacked value with TF's own
`unshuffle_from_sc_to_cpu` and `remove_padding_from_sc` (what TF's
checkpoint adapter runs to restore a SparseCore checkpoint on CPU);
`restack_table` writes a whole CPU table back into its rows, leaving the
other tables of the stack and the padding as they are. keras-rs
un-shards an unstacked table the same way
(`DistributedEmbedding._sparsecore_get_embedding_tables`).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol
from typing import Sequence

import numpy as np
import numpy.typing as npt

from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_nest
from keras_tpu_embed._compat import tf_tpu_embedding_v3_utils
from keras_tpu_embed._tf_private import sparsecore_clone_feature_config
from keras_tpu_embed._tf_private import sparsecore_stack_tables
from keras_tpu_embed.types import Tensor


class TableLayout(Protocol):
    """What this module reads of TF's `SparseCoreTableLayout` (a proto in
    `tpu_embedding_v3_utils`): where one table sits in its stack."""

    @property
    def table_name(self) -> str: ...

    @property
    def stacked_table_name(self) -> str: ...

    @property
    def num_sparse_cores(self) -> int: ...

    @property
    def num_partitions(self) -> int: ...

    @property
    def total_rows_per_sparse_core_shard(self) -> int: ...

    @property
    def sparse_core_shard_row_offset(self) -> int: ...

    @property
    def sparse_core_shard_rotation(self) -> int: ...

    @property
    def unsharded_shape(self) -> Sequence[int]: ...

    @property
    def unsharded_padded_shape(self) -> Sequence[int]: ...


StackedValue = Tensor
"""A stacked variable's value: a `tf.Tensor` or a numpy array."""


@dataclasses.dataclass(frozen=True)
class CoreRows:
    """The rows of one table that one SparseCore holds.

    Attributes:
        core: The SparseCore, `0 <= core < num_sparse_cores`.
        shard: The shard of the stacked variable (one per TPU chip,
            `variable.values[shard]`) that holds the SparseCore.
        shard_row: Where the table's rows start in that shard.
        first: The padded table's row held first; the SparseCore holds rows
            `first + i * num_sparse_cores` for `i < count`, at `shard_row + i`.
        count: How many (`rows_per_core`).
    """

    core: int
    shard: int
    shard_row: int
    first: int
    count: int


def rows_per_core(layout: TableLayout) -> int:
    """How many rows of the padded table each SparseCore holds."""
    return int(layout.unsharded_padded_shape[0]) // layout.num_sparse_cores


def core_rows(layout: TableLayout) -> list[CoreRows]:
    """Where each SparseCore holds its rows of the table, by SparseCore.

    `map_indices_in_shard` read the other way round: row `r` is on
    SparseCore `(r % n + rotation) % n` at `offset + r // n` of that core's
    `total_rows_per_sparse_core_shard` rows; the stacked variable has one
    shard per TPU chip (`num_partitions`), each holding its chip's
    SparseCores one after the other.
    """
    cores = layout.num_sparse_cores
    per_shard = cores // layout.num_partitions
    count = rows_per_core(layout)
    core_size = layout.total_rows_per_sparse_core_shard
    return [
        CoreRows(
            core=core,
            shard=core // per_shard,
            shard_row=(core % per_shard) * core_size
            + layout.sparse_core_shard_row_offset,
            first=(core - layout.sparse_core_shard_rotation) % cores,
            count=count,
        )
        for core in range(cores)
    ]


def checkpoint_shape(layout: TableLayout) -> list[int]:
    """A table's shape in a checkpoint written on SparseCore:
    `[num_sparse_cores, rows_per_core, padded width]` (see the module)."""
    return [
        layout.num_sparse_cores,
        rows_per_core(layout),
        int(layout.unsharded_padded_shape[1]),
    ]


def stacking_layouts(
    feature_configs: dict[str, tf.tpu.experimental.embedding.FeatureConfig],
    partitions: int,
    cores_per_partition: int,
) -> dict[str, TableLayout]:
    """`{table name: SparseCoreTableLayout}` as `TPUEmbeddingV2` stacks them.

    Runs TF's own stacking on copies of `feature_configs` (each with its
    `output_shape` set), for `partitions` TPU chips (replicas) of
    `cores_per_partition` SparseCores each.
    """
    features = sparsecore_clone_feature_config(feature_configs)
    tables = list({id(f.table): f.table for f in features.values()}.values())
    stacking = sparsecore_stack_tables(
        tables,
        tf_nest.flatten_with_joined_string_paths(features),
        partitions,
        cores_per_partition,
        None,
    )
    return dict(stacking.table_to_layout)


def _check_stacked(stacked: StackedValue, layout: TableLayout) -> None:
    rows = layout.num_sparse_cores * layout.total_rows_per_sparse_core_shard
    expected = [rows, layout.unsharded_padded_shape[1]]
    if list(stacked.shape) != expected:
        raise ValueError(
            f"The stacked table '{layout.stacked_table_name}' holding "
            f"'{layout.table_name}' has shape {list(stacked.shape)}; its "
            f"SparseCore layout says {expected}."
        )


def unstack_table(stacked: StackedValue, layout: TableLayout) -> np.ndarray:
    """One table, `[vocabulary_size, dim]`, out of its stacked value.

    Args:
        stacked: The whole stacked variable's value (every shard, in order).
        layout: The table's `SparseCoreTableLayout`.
    """
    _check_stacked(stacked, layout)
    utils = tf_tpu_embedding_v3_utils
    padded = utils.unshuffle_from_sc_to_cpu(
        tf.convert_to_tensor(stacked),
        num_sparse_cores=layout.num_sparse_cores,
        offset_in_shard=layout.sparse_core_shard_row_offset,
        size_in_shard=layout.unsharded_padded_shape[0]
        // layout.num_sparse_cores,
        shard_rotation=layout.sparse_core_shard_rotation,
    )
    table = utils.remove_padding_from_sc(padded, tuple(layout.unsharded_shape))
    return np.asarray(table.numpy())


def restack_table(
    stacked: StackedValue, table: npt.ArrayLike, layout: TableLayout
) -> np.ndarray:
    """A copy of `stacked` with `table`'s rows written where they live.

    Args:
        stacked: The whole stacked variable's value.
        table: The table, `[vocabulary_size, dim]` (the CPU layout).
        layout: The table's `SparseCoreTableLayout`.

    Raises:
        ValueError: `table` or `stacked` has another shape than the layout.
    """
    _check_stacked(stacked, layout)
    shape = list(layout.unsharded_shape)
    table = np.asarray(table)
    if list(table.shape) != shape:
        raise ValueError(
            f"Cannot write table '{layout.table_name}' of shape "
            f"{shape} on SparseCore from a value of shape "
            f"{list(table.shape)}."
        )
    cores = layout.num_sparse_cores
    rows = np.arange(shape[0])
    # `map_indices_in_shard`: the core and the row within its shard.
    core = (rows % cores + layout.sparse_core_shard_rotation) % cores
    position = layout.sparse_core_shard_row_offset + rows // cores
    result = np.array(stacked, dtype=np.float32, copy=True)
    result[
        core * layout.total_rows_per_sparse_core_shard + position, : shape[1]
    ] = table
    return result
