"""Bucketized and crossed columns' ids, computed as TensorFlow does."""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.columns import derived_ids


def test_bucketized_ids_refuse_sparse_input():
    column = kte.bucketized_column(kte.numeric_column("p"), [1.0])
    sparse = tf.sparse.from_dense(tf.constant([[2.0]]))
    with pytest.raises(TypeError, match="dense tensor of shape"):
        derived_ids.bucketized_ids(column, sparse)


def test_bucketized_ids_offset_each_dimension():
    column = kte.bucketized_column(kte.numeric_column("p", 2), [0.0, 10.0])
    ids = derived_ids.bucketized_ids(column, tf.constant([[-1.0, 5.0]]))
    # Dimension 0 in bucket 0; dimension 1 in bucket 1, offset by 3.
    np.testing.assert_array_equal(ids.values.numpy(), [0, 4])


@pytest.mark.parametrize("shape", [[4, 3], [4, 1], [4], [2, 2, 2]])
def test_bucketized_refuses_numbers_per_row_other_than_its_shape(shape):
    # [4, 3] has 12 numbers: reshaped to [-1, 2] it would be 6 examples.
    column = kte.bucketized_column(kte.numeric_column("x", 2), [0.0, 10.0])
    raw = tf.zeros(shape)
    with pytest.raises(
        (ValueError, tf.errors.InvalidArgumentError),
        match=r"x_bucketized.*\[batch, 2\]",
    ):
        derived_ids.bucketized_ids(column, raw)
    dynamic = tf.function(
        lambda r: derived_ids.bucketized_ids(column, r).dense_shape,
        input_signature=[tf.TensorSpec(None, tf.float32)],
    )
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"x_bucketized.*\[batch, 2\]"
    ):
        dynamic(raw)
