"""The host ops of the emulated SparseCore, as TF ops.

Each function stands in for the `gen_xla_ops` op of its name, with that
op's arguments, and runs the numpy kernel of `sparsecore_kernels.py` in a
`tf.numpy_function` with the op's output dtypes and static shapes; the
last two cut the buffers to their unpadded sizes, then pass them on, as
TF's ops do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keras_tpu_embed._compat import tf
from keras_tpu_embed.testing import sparsecore_kernels as kernels
from keras_tpu_embed.types import Tensor

# The op names `EmulatedSparseCore.install` replaces with these functions.
HOST_OPS = (
    "convert_to_list_of_sparse_core_coo_tensors",
    "sort_list_of_sparse_core_coo_tensors",
    "get_stats_from_list_of_sparse_core_coo_tensors",
    "convert_to_sparse_core_csr_wrapped_coo_tensor",
    "tpu_copy_with_dynamic_shape",
    "tpu_annotate_tensors_with_dynamic_shape",
)


def convert_to_list_of_sparse_core_coo_tensors(
    indices_or_row_splits: Tensor,
    values: Tensor,
    weights: Tensor,
    sample_count: int,
    num_sc_per_chip: int,
    row_offset: int,
    col_offset: int,
    col_shift: int,
    num_sc_shards: int,
    stacked_table_sample_count: int,
    combiner: str,
    name: str | None = None,
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    def kernel(*arrays: kernels.Array) -> list[kernels.Array]:
        per_sc = kernels.coo_from_feature(
            *arrays,
            sample_count=sample_count,
            num_sc_per_chip=num_sc_per_chip,
            row_offset=row_offset,
            col_offset=col_offset,
            col_shift=col_shift,
            num_sc_shards=num_sc_shards,
            stacked_table_sample_count=stacked_table_sample_count,
            combiner=combiner,
        )
        return [a for part in zip(*per_sc) for a in part]

    outputs = tf.numpy_function(
        kernel,
        [indices_or_row_splits, values, weights],
        [tf.int32] * (2 * num_sc_per_chip) + [tf.float32] * num_sc_per_chip,
        stateful=False,
    )
    for output in outputs:
        output.set_shape([None])
    s = num_sc_per_chip
    return (
        list(outputs[:s]),
        list(outputs[s : 2 * s]),
        list(outputs[2 * s :]),
    )


def _sort_or_stats(
    row_ids_list: list[Tensor],
    col_ids_list: list[Tensor],
    gains_list: list[Tensor],
    stats: bool,
    **attrs: Any,
) -> list[Tensor]:
    count = len(row_ids_list)

    def kernel(*arrays: kernels.Array) -> list[kernels.Array]:
        sorted_coo = kernels.sort_coo(
            list(arrays[:count]),
            list(arrays[count : 2 * count]),
            list(arrays[2 * count :]),
            **attrs,
        )
        if stats:
            return [
                np.array(sorted_coo.max_ids, np.int32),
                np.array(sorted_coo.max_unique_ids, np.int32),
            ]
        return [
            sorted_coo.rows,
            sorted_coo.cols,
            sorted_coo.gains,
            sorted_coo.id_counts,
        ]

    types = [tf.int32] * 2 if stats else [tf.int32] * 2 + [tf.float32, tf.int32]
    outputs = tf.numpy_function(
        kernel,
        list(row_ids_list) + list(col_ids_list) + list(gains_list),
        types,
        stateful=False,
    )
    shapes: list[list[int | None]] = (
        [[], []] if stats else [[None], [None], [None], [None]]
    )
    for output, shape in zip(outputs, shapes):
        output.set_shape(shape)
    return list(outputs)


def sort_list_of_sparse_core_coo_tensors(
    row_ids_list: list[Tensor],
    col_ids_list: list[Tensor],
    gains_list: list[Tensor],
    sample_count_list: list[int],
    col_offset_list: list[int],
    num_replica: int,
    table_vocab_size: int,
    feature_width: int,
    num_sc_per_chip: int,
    max_ids_per_sparse_core: int,
    max_unique_ids_per_sparse_core: int,
    table_name: str,
    name: str | None = None,
) -> list[Tensor]:
    return _sort_or_stats(
        row_ids_list,
        col_ids_list,
        gains_list,
        stats=False,
        sample_count_list=list(sample_count_list),
        col_offset_list=list(col_offset_list),
        num_replica=num_replica,
        num_sc_per_chip=num_sc_per_chip,
        table_vocab_size=table_vocab_size,
        max_ids_per_sparse_core=max_ids_per_sparse_core,
        max_unique_ids_per_sparse_core=max_unique_ids_per_sparse_core,
        table_name=table_name,
    )


def get_stats_from_list_of_sparse_core_coo_tensors(
    row_ids_list: list[Tensor],
    col_ids_list: list[Tensor],
    gains_list: list[Tensor],
    sample_count_list: list[int],
    col_offset_list: list[int],
    num_replica: int,
    table_vocab_size: int,
    feature_width: int,
    num_sc_per_chip: int,
    table_name: str,
    name: str | None = None,
) -> list[Tensor]:
    return _sort_or_stats(
        row_ids_list,
        col_ids_list,
        gains_list,
        stats=True,
        sample_count_list=list(sample_count_list),
        col_offset_list=list(col_offset_list),
        num_replica=num_replica,
        num_sc_per_chip=num_sc_per_chip,
        table_vocab_size=table_vocab_size,
        max_ids_per_sparse_core=None,
        max_unique_ids_per_sparse_core=None,
        table_name=table_name,
    )


def convert_to_sparse_core_csr_wrapped_coo_tensor(
    sorted_row_ids_list: list[Tensor],
    sorted_col_ids_list: list[Tensor],
    sorted_gains_list: list[Tensor],
    id_counts_list: list[Tensor],
    splits: Tensor,
    sample_count_per_sc: int,
    num_replica: int,
    max_minibatches_per_sc: int,
    max_ids_per_chip_per_sample: int,
    table_vocab_size: int,
    feature_width: int,
    table_name: str,
    allow_id_dropping: bool,
    name: str | None = None,
) -> list[Tensor]:
    count = len(sorted_row_ids_list)

    def kernel(*arrays: kernels.Array) -> tuple[kernels.Array, ...]:
        if np.any(arrays[-1] != 0):
            raise kernels.SparseCoreError(
                "minibatch splits were asked for: minibatching is not emulated."
            )
        return kernels.csr_wrap(
            list(arrays[:count]),
            list(arrays[count : 2 * count]),
            list(arrays[2 * count : 3 * count]),
            list(arrays[3 * count : 4 * count]),
            sample_count_per_sc=sample_count_per_sc,
            num_replica=num_replica,
            num_sc_per_chip=count,
            max_minibatches_per_sc=max_minibatches_per_sc,
            max_ids_per_chip_per_sample=max_ids_per_chip_per_sample,
            allow_id_dropping=allow_id_dropping,
            table_name=table_name,
        )

    outputs = tf.numpy_function(
        kernel,
        list(sorted_row_ids_list)
        + list(sorted_col_ids_list)
        + list(sorted_gains_list)
        + list(id_counts_list)
        + [splits],
        [tf.int32, tf.int32, tf.int32, tf.float32] + [tf.int32] * 3,
        stateful=False,
    )
    shards = num_replica * count
    max_ids = max_ids_per_chip_per_sample * sample_count_per_sc * count
    pointers = (
        max_minibatches_per_sc
        * count
        * kernels.round_up(shards, kernels.PAD_SIZE)
    )
    for output, shape in zip(
        outputs, [[pointers]] + [[max_ids]] * 3 + [[]] * 3
    ):
        output.set_shape(shape)
    return list(outputs)


def tpu_copy_with_dynamic_shape(
    tensors: list[Tensor],
    unpadded_sizes: list[Tensor],
    name: str | None = None,
) -> list[Tensor]:
    return [tensor[:size] for tensor, size in zip(tensors, unpadded_sizes)]


def tpu_annotate_tensors_with_dynamic_shape(
    tensors: list[Tensor], name: str | None = None
) -> list[Tensor]:
    return [tf.identity(tensor) for tensor in tensors]
