"""The host ops of the emulated SparseCore, as TF calls them."""

import inspect

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu.ops import gen_xla_ops

from keras_tpu_embed.testing import sparsecore_host_ops as host_ops
from keras_tpu_embed.testing import sparsecore_kernels as kernels


@pytest.mark.parametrize("name", host_ops.HOST_OPS)
def test_each_stands_in_for_the_op_of_its_name_with_its_arguments(name):
    want = list(inspect.signature(getattr(gen_xla_ops, name)).parameters)
    got = list(inspect.signature(getattr(host_ops, name)).parameters)
    assert got == want


def test_coo_op_is_the_kernel_per_sparsecore_with_unknown_lengths():
    splits = np.array([0, 2, 3, 3, 6], np.int32)
    ids = np.array([5, 5, 2, 7, 1, 3], np.int32)
    weights = np.array([1, 3, 2, 1, 1, 2], np.float32)
    arguments = dict(
        sample_count=4,
        num_sc_per_chip=2,
        row_offset=4,
        col_offset=8,
        col_shift=1,
        num_sc_shards=4,
        stacked_table_sample_count=12,
        combiner="mean",
    )

    @tf.function
    def op():
        rows, cols, gains = host_ops.convert_to_list_of_sparse_core_coo_tensors(
            splits, ids, weights, **arguments
        )
        assert all(t.shape.as_list() == [None] for t in rows + cols + gains)
        return rows, cols, gains

    rows, cols, gains = op()
    want = kernels.coo_from_feature(splits, ids, weights, **arguments)
    for sc, (want_rows, want_cols, want_gains) in enumerate(want):
        np.testing.assert_array_equal(rows[sc], want_rows)
        np.testing.assert_array_equal(cols[sc], want_cols)
        np.testing.assert_allclose(gains[sc], want_gains)


def test_csr_op_refuses_minibatch_splits():
    counts = [np.array([0, 1, 1], np.int32)]
    with pytest.raises(kernels.SparseCoreError, match="minibatching"):
        host_ops.convert_to_sparse_core_csr_wrapped_coo_tensor(
            [np.zeros([1], np.int32)],
            [np.zeros([1], np.int32)],
            [np.ones([1], np.float32)],
            counts,
            splits=np.array([1], np.int64),
            sample_count_per_sc=1,
            num_replica=2,
            max_minibatches_per_sc=1,
            max_ids_per_chip_per_sample=8,
            table_vocab_size=4,
            feature_width=2,
            table_name="stack",
            allow_id_dropping=False,
        )


def test_copy_with_dynamic_shape_cuts_to_the_unpadded_sizes():
    cut = host_ops.tpu_copy_with_dynamic_shape(
        [tf.range(8), tf.range(4)], [tf.constant(3), tf.constant(4)]
    )
    assert [t.numpy().tolist() for t in cut] == [[0, 1, 2], [0, 1, 2, 3]]
