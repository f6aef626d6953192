"""The host kernels of the emulated SparseCore, in numpy.

The semantics of TF's own host kernels in
`tensorflow/core/tpu/kernels/sparse_core_preprocess_ops.cc`, re-implemented
on arrays: one feature's ids to per-SparseCore COO triples
(`coo_from_feature`), the ids of one stacked table sorted and grouped by the
SparseCore that holds their row (`sort_coo`), packed into the static CSR
buffers of the step (`csr_wrap`), and those buffers read back on the chip
(`decode_csr`). `sparsecore_host_ops.py` runs them as TF ops;
`emulated_sparsecore.py` says where each sits in `TPUEmbeddingV2`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from keras_tpu_embed._compat import tf

Array = npt.NDArray[Any]

# What the host kernels write into the unused tail of a padded segment
# (`kXlaPadValue`); the chip never reads it, and neither do we.
PAD_VALUE = np.iinfo(np.int32).max
# Segments and row pointers are padded to this many entries (the host
# kernels' `xla_pad_size`).
PAD_SIZE = 8


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


class SparseCoreError(ValueError):
    """An input the SparseCore kernels refuse, as the chip's ops do."""


def coo_from_feature(
    indices_or_row_splits: Array,
    values: Array,
    weights: Array,
    *,
    sample_count: int,
    num_sc_per_chip: int,
    row_offset: int,
    col_offset: int,
    col_shift: int,
    num_sc_shards: int,
    stacked_table_sample_count: int,
    combiner: str,
) -> list[tuple[Array, Array, Array]]:
    """`ConvertToListOfSparseCoreCooTensors`: per SparseCore (rows, cols,
    gains) of one feature."""
    if not _is_power_of_two(num_sc_shards):
        raise SparseCoreError(
            f"num_sc_shards {num_sc_shards} is not a power of two."
        )
    if sample_count % num_sc_per_chip:
        raise SparseCoreError(
            f"sample_count {sample_count} is not divisible by the "
            f"{num_sc_per_chip} SparseCores per chip."
        )
    if combiner not in ("sum", "mean", "sqrtn"):
        raise SparseCoreError(
            f"combiner {combiner!r} is not one of 'sum', 'mean', 'sqrtn'."
        )
    values = values.reshape(-1).astype(np.int64)
    count = values.shape[0]
    if weights.ndim == 0:
        weights = np.full([count], weights, np.float32)
    elif weights.shape != (count,):
        raise SparseCoreError(
            f"{count} values but {weights.shape[0]} weights were given."
        )
    if np.any(values < 0):
        raise SparseCoreError(
            f"a negative id {int(values.min())} was fed to the SparseCore."
        )
    positions = indices_or_row_splits
    if positions.ndim == 1 and positions.size == 0:
        if count not in (0, sample_count):
            raise SparseCoreError(
                f"a dense input has {count} values for {sample_count} samples."
            )
        rows = np.arange(count, dtype=np.int64)
    elif positions.ndim == 2:
        rows = positions[:, 0].astype(np.int64)
        if np.any(np.diff(rows) < 0):
            raise SparseCoreError(
                "the indices of a SparseTensor input are not sorted."
            )
        if count and rows.max() >= sample_count:
            raise SparseCoreError(
                f"a SparseTensor row {int(rows.max())} is >= the sample "
                f"count {sample_count}."
            )
    elif positions.ndim == 1:
        if positions.size != sample_count + 1:
            raise SparseCoreError(
                f"a RaggedTensor input has {positions.size} row splits for "
                f"{sample_count} samples."
            )
        rows = np.repeat(
            np.arange(sample_count, dtype=np.int64), np.diff(positions)
        )
    else:
        raise SparseCoreError(
            f"indices_or_row_splits of rank {positions.ndim} is invalid."
        )
    gains = weights.astype(np.float32)
    scale = np.ones([sample_count], np.float32)
    if combiner != "sum":
        contribution = gains if combiner == "mean" else gains * gains
        total = np.zeros([sample_count], np.float32)
        np.add.at(total, rows, contribution)
        if combiner == "sqrtn":
            total = np.sqrt(total)
        # A sample whose weights sum to 0: the chip's rule is not
        # documented; here its ids get gain 0.
        scale = np.divide(
            1.0, total, out=np.zeros_like(total), where=total != 0
        )
    # Adjacent repeats of one id in one sample merge into one COO entry.
    keep = np.ones([count], bool)
    if count:
        keep[1:] = (rows[1:] != rows[:-1]) | (values[1:] != values[:-1])
    group = np.cumsum(keep) - 1
    merged = np.zeros([int(keep.sum())], np.float32)
    np.add.at(merged, group, gains)
    rows, values = rows[keep], values[keep]
    gains = merged * scale[rows]
    per_sc = sample_count // num_sc_per_chip
    sc_of_row = rows // per_sc
    mod = num_sc_shards - 1
    cols = ((values + col_shift) & mod) + (values & ~mod) + col_offset
    out_rows = (
        rows % per_sc
        + row_offset // num_sc_per_chip
        + (stacked_table_sample_count // num_sc_per_chip) * sc_of_row
    )
    return [
        (
            out_rows[sc_of_row == sc].astype(np.int32),
            cols[sc_of_row == sc].astype(np.int32),
            gains[sc_of_row == sc].astype(np.float32),
        )
        for sc in range(num_sc_per_chip)
    ]


@dataclasses.dataclass
class SortedCoo:
    rows: Array
    cols: Array
    gains: Array
    id_counts: Array
    max_ids: int
    max_unique_ids: int


def sort_coo(
    rows_list: list[Array],
    cols_list: list[Array],
    gains_list: list[Array],
    *,
    sample_count_list: list[int],
    col_offset_list: list[int],
    num_replica: int,
    num_sc_per_chip: int,
    table_vocab_size: int,
    max_ids_per_sparse_core: int | None,
    max_unique_ids_per_sparse_core: int | None,
    table_name: str,
) -> SortedCoo:
    """`SortListOfSparseCoreCooTensors` (and its statistics) for one
    SparseCore of the chip."""
    shards = num_replica * num_sc_per_chip
    if not _is_power_of_two(shards):
        raise SparseCoreError(
            f"{shards} SparseCores in the system: expected a power of two."
        )
    shard_bits = shards.bit_length() - 1
    per_sc_batch = sum(sample_count_list)
    # Features of one table share its column offset; each offset's table
    # ends where the next table of the stack starts.
    offsets = sorted(set(col_offset_list))
    ends = dict(zip(offsets, offsets[1:] + [table_vocab_size]))
    groups: list[tuple[Array, Array, Array]] = []
    for offset in offsets:
        members = [i for i, o in enumerate(col_offset_list) if o == offset]
        rows = np.concatenate([rows_list[i] for i in members]).astype(np.int64)
        cols = np.concatenate([cols_list[i] for i in members]).astype(np.int64)
        gains = np.concatenate([gains_list[i] for i in members])
        outside = (cols < offset) | (cols >= ends[offset])
        if np.any(outside):
            raise SparseCoreError(
                f"table {table_name!r}: an id outside its table reached the "
                "SparseCore (stacked row "
                f"{int(cols[outside][0])} is not in [{offset}, "
                f"{ends[offset]})); the chip would read another table's row."
            )
        order = np.argsort(cols, kind="stable")
        rows, cols, gains = rows[order], cols[order], gains[order]
        first = np.ones([cols.size], bool)
        first[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
        group_of = np.cumsum(first) - 1
        merged = np.zeros([int(first.sum())], np.float32)
        np.add.at(merged, group_of, gains)
        groups.append((rows[first], cols[first], merged))
    all_cols = (
        np.concatenate([g[1] for g in groups]) if groups else np.zeros([0])
    ).astype(np.int64)
    destination = all_cols & (shards - 1)
    id_count = np.bincount(destination, minlength=shards)
    unique_count = np.zeros([shards], np.int64)
    for _, cols, _ in groups:
        distinct = np.unique(cols)
        unique_count += np.bincount(distinct & (shards - 1), minlength=shards)
    for shard in range(shards):
        if (
            max_ids_per_sparse_core is not None
            and id_count[shard] > max_ids_per_sparse_core
        ):
            # TF's words (`SortListOfSparseCoreCooTensorsOp`,
            # tensorflow/core/tpu/kernels/sparse_core_preprocess_ops.cc).
            raise SparseCoreError(
                f"Sparse core {shard} gets {id_count[shard]} ids while the "
                f"max ids per sparse core is set to be "
                f"{max_ids_per_sparse_core} for table {table_name}"
            )
        if (
            max_unique_ids_per_sparse_core is not None
            and unique_count[shard] > max_unique_ids_per_sparse_core
        ):
            raise SparseCoreError(
                f"Sparse core {shard} gets {unique_count[shard]} unique ids "
                "while the max unique ids per sparse core is set to be "
                f"{max_unique_ids_per_sparse_core} for table {table_name}"
            )
    all_rows = np.concatenate([g[0] for g in groups]) if groups else all_cols
    all_gains = (
        np.concatenate([g[2] for g in groups])
        if groups
        else np.zeros([0], np.float32)
    )
    order = np.argsort(destination, kind="stable")
    id_counts = np.concatenate([[0], np.cumsum(id_count)]).astype(np.int32)
    return SortedCoo(
        rows=(all_rows[order] % max(per_sc_batch, 1)).astype(np.int32),
        cols=(all_cols[order] >> shard_bits).astype(np.int32),
        gains=all_gains[order].astype(np.float32),
        id_counts=id_counts,
        max_ids=int(id_count.max()) if shards else 0,
        max_unique_ids=int(unique_count.max()) if shards else 0,
    )


def csr_wrap(
    rows_list: list[Array],
    cols_list: list[Array],
    gains_list: list[Array],
    id_counts_list: list[Array],
    *,
    sample_count_per_sc: int,
    num_replica: int,
    num_sc_per_chip: int,
    max_minibatches_per_sc: int,
    max_ids_per_chip_per_sample: int,
    allow_id_dropping: bool,
    table_name: str,
) -> tuple[Array, ...]:
    """`ConvertToSparseCoreCsrWrappedCooTensor` without minibatching."""
    shards = num_replica * num_sc_per_chip
    max_ids = max_ids_per_chip_per_sample * sample_count_per_sc
    max_ids *= num_sc_per_chip
    if max_ids % PAD_SIZE:
        raise SparseCoreError(
            f"The max_ids_per_chip is set to be {max_ids} which is not "
            f"divisible by the xla_pad_size {PAD_SIZE} ."
        )
    pointers_per_sc = round_up(shards, PAD_SIZE)
    row_pointers = np.zeros(
        [max_minibatches_per_sc * num_sc_per_chip * pointers_per_sc], np.int32
    )
    sample_ids = np.full([max_ids], PAD_VALUE, np.int32)
    token_ids = np.full([max_ids], PAD_VALUE, np.int32)
    gains = np.full([max_ids], float(PAD_VALUE), np.float32)
    total = sum(int(c[-1]) for c in id_counts_list)
    packed = 0
    position = 0
    pointer = 0
    for sc in range(num_sc_per_chip):
        counts = id_counts_list[sc]
        if counts.size != shards + 1:
            raise SparseCoreError(
                f"id counts of {counts.size} entries for {shards} "
                "SparseCores: minibatching is not emulated."
            )
        for shard in range(shards):
            start, end = int(counts[shard]), int(counts[shard + 1])
            take = end - start
            if position + take > max_ids:
                if not allow_id_dropping:
                    # TF's words (`ConvertToSparseCoreCsrWrappedCooTensorOp`,
                    # sparse_core_preprocess_ops.cc), without minibatching.
                    raise SparseCoreError(
                        f"The max_ids_per_chip is set to be {max_ids} which "
                        "is not going to fit all ids. The remaining id "
                        f"count is {total - packed} . Please consider "
                        "setting the allow_id_dropping to be true. "
                    )
                take = max_ids - position
            span = slice(position, position + take)
            token_ids[span] = cols_list[sc][start : start + take]
            sample_ids[span] = rows_list[sc][start : start + take]
            gains[span] = gains_list[sc][start : start + take]
            position += take
            packed += take
            row_pointers[pointer] = position
            pointer += 1
            position = min(round_up(position, PAD_SIZE), max_ids)
        padded = round_up(pointer, PAD_SIZE)
        row_pointers[pointer:padded] = position
        pointer = padded
    if packed < total:
        tf.get_logger().warning(
            "emulated SparseCore: table %s drops %d ids that do not fit the "
            "static buffer of %d ids.",
            table_name,
            total - packed,
            max_ids,
        )
    row_pointers[pointer:] = position
    return (
        row_pointers,
        sample_ids,
        token_ids,
        gains,
        np.array(num_sc_per_chip * pointers_per_sc, np.int32),
        np.array(position, np.int32),
        np.array(1, np.int32),  # minibatches per SparseCore
    )


def decode_csr(
    row_pointers: Array,
    sample_ids: Array,
    token_ids: Array,
    gains: Array,
    *,
    num_sc_per_chip: int,
    num_sc_shards: int,
    per_sc_samples: int,
    rows_per_shard: int,
) -> tuple[Array, Array, Array]:
    """The chip's reading of the buffers: for every id, its activation row
    on this chip, its row in the stacked table (shard-major: the chips'
    shards one after the other) and its gain."""
    pointers_per_sc = round_up(num_sc_shards, PAD_SIZE)
    if row_pointers.size < num_sc_per_chip * pointers_per_sc:
        raise SparseCoreError(
            f"{row_pointers.size} row pointers for {num_sc_per_chip} "
            f"SparseCores of {num_sc_shards} shards."
        )
    act_rows, table_rows, out_gains = [], [], []
    end = 0
    for sc in range(num_sc_per_chip):
        for shard in range(num_sc_shards):
            start = round_up(end, PAD_SIZE) if (sc, shard) != (0, 0) else 0
            end = int(row_pointers[sc * pointers_per_sc + shard])
            if end < start or end > token_ids.size:
                raise SparseCoreError(
                    f"row pointer {end} out of order (segment starts at "
                    f"{start}, {token_ids.size} ids)."
                )
            tokens = token_ids[start:end].astype(np.int64)
            samples = sample_ids[start:end].astype(np.int64)
            if np.any(tokens >= rows_per_shard) or np.any(
                samples >= per_sc_samples
            ):
                raise SparseCoreError(
                    "an id or sample outside the shard reached the SparseCore."
                )
            act_rows.append(sc * per_sc_samples + samples)
            table_rows.append(shard * rows_per_shard + tokens)
            out_gains.append(gains[start:end])
    return (
        np.concatenate(act_rows).astype(np.int64),
        np.concatenate(table_rows).astype(np.int64),
        np.concatenate(out_gains).astype(np.float32),
    )
