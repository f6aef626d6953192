"""`tf.feature_column` categorical columns become ours."""

import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed import columns as column_conversion


def test_unsupported_tf_column_is_a_type_error():
    numeric = tf.feature_column.numeric_column("a")
    with pytest.raises(TypeError, match="NumericColumn"):
        column_conversion.to_categorical_column(numeric)
    # A crossed column over another kind of categorical column.
    identity = tf.feature_column.categorical_column_with_identity("h", 5)
    crossed = tf.feature_column.crossed_column([identity, "b"], 10)
    with pytest.raises(TypeError, match="Cross its raw feature key"):
        column_conversion.to_categorical_column(crossed)


def test_bucketized_and_crossed_convert():
    fc = tf.feature_column
    price = fc.bucketized_column(fc.numeric_column("p", shape=2), [1, 5])
    crossed = fc.crossed_column(["a", price], 7, hash_key=3)
    ours = column_conversion.to_categorical_column(crossed)
    assert ours == kte.crossed_column(
        ["a", kte.bucketized_column(kte.numeric_column("p", 2), [1, 5])],
        7,
        hash_key=3,
    )
    assert ours.name == crossed.name
    assert column_conversion.to_categorical_column(price).num_buckets == (
        price.num_buckets
    )


def test_every_supported_kind_converts(tmp_path):
    fc = tf.feature_column
    path = tmp_path / "v.txt"
    path.write_text("a\nb\nc\n")
    pairs = [
        (
            fc.categorical_column_with_identity("i", 5, default_value=2),
            kte.categorical_column_with_identity("i", 5, default_value=2),
        ),
        (
            fc.categorical_column_with_vocabulary_list(
                "l", ["x", "y"], num_oov_buckets=3
            ),
            kte.categorical_column_with_vocabulary_list(
                "l", ["x", "y"], num_oov_buckets=3
            ),
        ),
        (
            fc.categorical_column_with_vocabulary_file(
                "f", str(path), vocabulary_size=2
            ),
            kte.categorical_column_with_vocabulary_file(
                "f", str(path), vocabulary_size=2
            ),
        ),
        (
            fc.categorical_column_with_hash_bucket("h", 7, dtype=tf.int64),
            kte.categorical_column_with_hash_bucket("h", 7, dtype="int64"),
        ),
        (
            fc.sequence_categorical_column_with_identity("s", 4),
            kte.sequence_categorical_column_with_identity("s", 4),
        ),
        (
            fc.weighted_categorical_column(
                fc.categorical_column_with_identity("w", 4), "ww"
            ),
            kte.weighted_categorical_column(
                kte.categorical_column_with_identity("w", 4), "ww"
            ),
        ),
    ]
    for theirs, ours in pairs:
        assert column_conversion.to_categorical_column(theirs) == ours
    # Ours pass through.
    assert column_conversion.to_categorical_column(ours) is ours


def test_tf_tfrecord_vocabulary_is_refused_by_name(tmp_path):
    path = str(tmp_path / "v.tfrecord.gz")
    column = tf.feature_column.categorical_column_with_vocabulary_file(
        "f", path, vocabulary_size=3, file_format="tfrecord_gzip"
    )
    with pytest.raises(ValueError, match="Column 'f'.*tfrecord_gzip"):
        column_conversion.to_categorical_column(column)
