"""The host kernels of the emulated SparseCore, on hand-made inputs.

`tests/emulated/sparsecore_chip_test.py` runs them under TF's own
`TPUEmbeddingV2`; here each is checked alone, with the stacked-table layout
taken from TF's own `tpu_embedding_v3_utils.map_indices_in_shard`.
"""

import numpy as np
import pytest
from tensorflow.python.tpu import tpu_embedding_v3_utils

from keras_tpu_embed.testing import sparsecore_kernels as sc


def _stacked_row(ids, num_shards, offset_in_shard, rotation):
    """TF's placement of a table's rows in its stack, as one row index."""
    shard, position = tpu_embedding_v3_utils.map_indices_in_shard(
        num_shards, offset_in_shard, rotation, np.asarray(ids)
    )
    return np.asarray(position) * num_shards + np.asarray(shard)


def test_coo_rows_columns_and_mean_gains():
    # 4 samples on 2 SparseCores; 4 SparseCores in the system; the table
    # starts at row 2 of each shard and is rotated by 1.
    splits = np.array([0, 2, 3, 3, 6], np.int32)
    ids = np.array([5, 5, 2, 7, 1, 3], np.int32)
    weights = np.array([1, 3, 2, 1, 1, 2], np.float32)
    per_sc = sc.coo_from_feature(
        splits,
        ids,
        weights,
        sample_count=4,
        num_sc_per_chip=2,
        row_offset=4,
        col_offset=8,
        col_shift=1,
        num_sc_shards=4,
        stacked_table_sample_count=12,
        combiner="mean",
    )
    (rows0, cols0, gains0), (rows1, cols1, gains1) = per_sc
    # Samples 0, 1 on SparseCore 0, samples 2, 3 on SparseCore 1, at
    # row 4 / 2 of each SparseCore's 12 / 2 rows.
    np.testing.assert_array_equal(rows0, [2, 3])
    np.testing.assert_array_equal(rows1, [9, 9, 9])
    np.testing.assert_array_equal(cols0, _stacked_row([5, 2], 4, 2, 1))
    np.testing.assert_array_equal(cols1, _stacked_row([7, 1, 3], 4, 2, 1))
    # The repeated 5 of sample 0 is one entry; mean: weight / sum.
    np.testing.assert_allclose(gains0, [1.0, 1.0])
    np.testing.assert_allclose(gains1, [0.25, 0.25, 0.5])


def test_coo_sqrtn_of_a_sparse_input():
    indices = np.array([[0, 0], [0, 1], [1, 0]], np.int32)
    ((rows, cols, gains),) = sc.coo_from_feature(
        indices,
        np.array([3, 4, 3], np.int32),
        np.array([3, 4, 2], np.float32),
        sample_count=2,
        num_sc_per_chip=1,
        row_offset=0,
        col_offset=0,
        col_shift=0,
        num_sc_shards=2,
        stacked_table_sample_count=2,
        combiner="sqrtn",
    )
    np.testing.assert_array_equal(rows, [0, 0, 1])
    np.testing.assert_allclose(gains, [0.6, 0.8, 1.0])


def test_coo_refuses_unsorted_sparse_indices():
    with pytest.raises(sc.SparseCoreError, match="not sorted"):
        sc.coo_from_feature(
            np.array([[1, 0], [0, 0]], np.int32),
            np.array([1, 2], np.int32),
            np.array(1.0, np.float32),
            sample_count=2,
            num_sc_per_chip=1,
            row_offset=0,
            col_offset=0,
            col_shift=0,
            num_sc_shards=2,
            stacked_table_sample_count=2,
            combiner="sum",
        )


def _sorted(max_ids=None, shared_id=2):
    # Two features of one table (its rows 0-7 of the stack) and one of the
    # next table (rows 8-15), on one SparseCore of 2 chips x 2 SparseCores.
    return sc.sort_coo(
        [np.array([0, 1, 1], np.int32), np.array([2]), np.array([3])],
        [np.array([0, 5, 5], np.int32), np.array([shared_id]), np.array([9])],
        [np.array([1, 2, 3], np.float32), np.array([4.0]), np.array([5.0])],
        sample_count_list=[2, 1, 1],
        col_offset_list=[0, 0, 8],
        num_replica=2,
        num_sc_per_chip=2,
        table_vocab_size=16,
        max_ids_per_sparse_core=max_ids,
        max_unique_ids_per_sparse_core=None,
        table_name="stack",
    )


def test_sort_groups_ids_by_the_sparsecore_of_their_row():
    result = _sorted()
    # Stacked rows 0, 5 (twice in sample 1: merged), 2, and 9: SparseCore
    # row % 4 (0, 1, 2, 1), position in it row // 4 (0, 1, 0, 2).
    np.testing.assert_array_equal(result.id_counts, [0, 1, 3, 4, 4])
    np.testing.assert_array_equal(result.cols, [0, 1, 2, 0])
    np.testing.assert_array_equal(result.rows, [0, 1, 3, 2])
    np.testing.assert_allclose(result.gains, [1, 5, 5, 4])
    assert (result.max_ids, result.max_unique_ids) == (2, 2)


def test_sort_fails_past_max_ids_per_sparse_core():
    with pytest.raises(sc.SparseCoreError, match="Sparse core 1 gets 2 ids"):
        _sorted(max_ids=1)


def test_sort_refuses_an_id_in_another_tables_rows():
    with pytest.raises(sc.SparseCoreError, match="outside its table"):
        _sorted(shared_id=12)


def test_csr_buffers_decode_to_the_sorted_ids():
    rng = np.random.default_rng(0)
    per_sc = []
    for _ in range(2):
        counts = rng.integers(0, 5, 4)
        id_counts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        total = int(id_counts[-1])
        per_sc.append(
            (
                rng.integers(0, 3, total).astype(np.int32),
                rng.integers(0, 6, total).astype(np.int32),
                rng.uniform(size=total).astype(np.float32),
                id_counts,
            )
        )
    buffers = sc.csr_wrap(
        *[list(part) for part in zip(*per_sc)],
        sample_count_per_sc=3,
        num_replica=2,
        num_sc_per_chip=2,
        max_minibatches_per_sc=4,
        max_ids_per_chip_per_sample=16,
        allow_id_dropping=False,
        table_name="stack",
    )
    row_pointers, samples, tokens, gains, pointer_size, id_size, batches = (
        buffers
    )
    assert samples.shape == (16 * 3 * 2,)  # the static buffer
    assert int(pointer_size) == 2 * 8 and int(batches) == 1
    # 4 pointers per SparseCore, padded to 8 with the next free position,
    # which is a multiple of 8 (each segment is padded to 8 ids).
    for first in (0, 8):
        padding = row_pointers[first + 4 : first + 8]
        assert set(padding.tolist()) == {
            -(-int(row_pointers[first + 3]) // 8) * 8
        }
    act_rows, table_rows, out_gains = sc.decode_csr(
        row_pointers[:pointer_size],
        samples[:id_size],
        tokens[:id_size],
        gains[:id_size],
        num_sc_per_chip=2,
        num_sc_shards=4,
        per_sc_samples=3,
        rows_per_shard=6,
    )
    expected = []
    for chip_sc, (rows, cols, sc_gains, id_counts) in enumerate(per_sc):
        for shard in range(4):
            for i in range(id_counts[shard], id_counts[shard + 1]):
                expected.append(
                    (chip_sc * 3 + rows[i], shard * 6 + cols[i], sc_gains[i])
                )
    assert list(zip(act_rows, table_rows, out_gains)) == expected


def test_csr_fails_or_drops_past_the_static_buffer():
    rows = [np.zeros([9], np.int32)]
    counts = [np.array([0, 9, 9], np.int32)]
    arguments = dict(
        sample_count_per_sc=1,
        num_replica=2,
        num_sc_per_chip=1,
        max_minibatches_per_sc=1,
        max_ids_per_chip_per_sample=8,
        table_name="stack",
    )
    with pytest.raises(sc.SparseCoreError, match="allow_id_dropping"):
        sc.csr_wrap(
            rows,
            rows,
            [np.ones([9], np.float32)],
            counts,
            allow_id_dropping=False,
            **arguments,
        )
    buffers = sc.csr_wrap(
        rows,
        rows,
        [np.ones([9], np.float32)],
        counts,
        allow_id_dropping=True,
        **arguments,
    )
    assert int(buffers[5]) == 8  # one id dropped
