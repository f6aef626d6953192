"""Host-side clean-up of negative ids before the TPU embedding engine.

The tensor-core padding runs end to end in `distribute_test.py` (a TPU
without an engine).
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_tpu_embed.tpu.host_ids import drop_negative_ids


def test_ragged_ids_lose_negatives_with_their_weights():
    ids = tf.ragged.constant([[3, -1, 4], [-1], [5]], tf.int64)
    weights = tf.ragged.constant([[0.5, 9.0, 2.0], [9.0], [1.5]])
    cleaned = drop_negative_ids(
        {"tags": ids, "tags_w": weights}, {"tags": "tags_w"}, set()
    )
    assert cleaned["tags"].to_list() == [[3, 4], [], [5]]
    assert cleaned["tags_w"].to_list() == [[0.5, 2.0], [], [1.5]]


def test_sparse_ids_lose_negatives_with_their_weights():
    indices = [[0, 0], [0, 1], [1, 0], [2, 1]]
    ids = tf.SparseTensor(
        indices, tf.constant([-1, 7, 2, -1], tf.int64), [3, 2]
    )
    weights = tf.SparseTensor(indices, [9.0, 0.25, 0.5, 9.0], [3, 2])
    cleaned = drop_negative_ids(
        {"item": ids, "item_w": weights}, {"item": "item_w"}, set()
    )
    np.testing.assert_array_equal(cleaned["item"].indices, [[0, 1], [1, 0]])
    np.testing.assert_array_equal(cleaned["item"].values, [7, 2])
    np.testing.assert_array_equal(cleaned["item_w"].values, [0.25, 0.5])
    np.testing.assert_array_equal(cleaned["item_w"].indices, [[0, 1], [1, 0]])


def test_dense_features_not_on_the_engine_keep_their_padding():
    padded = tf.constant([[3, -1], [-1, -1]], tf.int64)  # tensor-core input
    cleaned = drop_negative_ids({"hist": padded}, {}, {"user"})
    np.testing.assert_array_equal(cleaned["hist"], padded)


def test_weights_whose_ids_are_unknown_are_an_error():
    ids = tf.SparseTensor([[0, 0]], tf.constant([-1], tf.int64), [1, 1])
    weights = tf.SparseTensor([[0, 0]], [2.0], [1, 1])
    with pytest.raises(ValueError, match=r"\['w'\] look like weights"):
        drop_negative_ids({"x": ids, "w": weights}, {}, set(), False)
