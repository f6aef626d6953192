"""Raw values to ids, per column kind, as `tf.feature_column` maps them."""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.columns.id_mapping import check_raw_dtype
from keras_tpu_embed.columns.id_mapping import to_sparse


def _ids(column, values):
    """The ids of a vector of raw values, by the column's own mapping."""
    return column.id_mapping().map_values(values)


def test_vocabulary_list_with_oov_buckets_and_default():
    oov = kte.categorical_column_with_vocabulary_list(
        "c", ["us", "fr"], num_oov_buckets=2
    )
    ids = _ids(oov, tf.constant(["fr", "us", "xx"])).numpy()
    assert ids[:2].tolist() == [1, 0] and ids[2] in (2, 3)
    default = kte.categorical_column_with_vocabulary_list(
        "c", ["us", "fr"], default_value=1
    )
    assert _ids(default, tf.constant(["xx"])).numpy().tolist() == [1]


def test_hash_buckets_are_tensorflows():
    column = kte.categorical_column_with_hash_bucket("h", 50)
    values = tf.constant(["a", "b", "zz"])
    np.testing.assert_array_equal(
        _ids(column, values),
        tf.strings.to_hash_bucket_fast(values, 50),
    )
    ints = kte.categorical_column_with_hash_bucket("h", 50, dtype=tf.int64)
    np.testing.assert_array_equal(
        _ids(ints, tf.constant([7], tf.int64)),
        tf.strings.to_hash_bucket_fast(["7"], 50),
    )


def test_identity_default_and_range():
    column = kte.categorical_column_with_identity("i", 5, default_value=0)
    assert _ids(column, tf.constant([2, 9])).numpy().tolist() == [2, 0]
    strict = kte.categorical_column_with_identity("i", 5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        _ids(strict, tf.constant([9]))


def test_raw_dtype_and_forms():
    column = kte.categorical_column_with_identity("i", 5)
    with pytest.raises(TypeError, match="must hold integers"):
        check_raw_dtype("i", tf.constant(["1"]), column)
    dense = to_sparse("i", tf.constant([[1, -1], [2, 3]]))
    ragged = to_sparse("i", tf.ragged.constant([[1], [2, 3]]))
    assert dense.values.numpy().tolist() == ragged.values.numpy().tolist()


def test_negative_identity_ids_map_to_default_value():
    """As IdentityCategoricalColumn._transform_input_tensor maps them."""
    column = kte.categorical_column_with_identity("i", 5, default_value=0)
    assert _ids(column, tf.constant([-3, 2])).numpy().tolist() == [0, 2]
