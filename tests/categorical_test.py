"""Categorical column specs: their checks, names and ids."""

import pytest

import keras_tpu_embed as kte


def test_categorical_validation():
    with pytest.raises(ValueError, match="num_buckets"):
        kte.categorical_column_with_identity("a", 0)
    with pytest.raises(ValueError, match="default_value"):
        kte.categorical_column_with_identity("a", 3, default_value=3)
    with pytest.raises(ValueError, match="non-empty"):
        kte.categorical_column_with_vocabulary_list("a", [])
    with pytest.raises(ValueError, match="duplicate token 'x'"):
        kte.categorical_column_with_vocabulary_list("a", ["x", "y", "x"])
    with pytest.raises(ValueError, match="both num_oov_buckets and default"):
        kte.categorical_column_with_vocabulary_list(
            "a", ["x"], default_value=0, num_oov_buckets=1
        )
    with pytest.raises(ValueError, match="hash_bucket_size"):
        kte.categorical_column_with_hash_bucket("a", 0)


def test_weighted_column_names_and_unwraps():
    base = kte.sequence_categorical_column_with_identity("ids", 5)
    weighted = kte.weighted_categorical_column(base, "w")
    assert weighted.name == "ids_weighted_by_w"
    assert (weighted.key, weighted.feature_key) == ("ids", "ids")
    assert weighted.weight_feature_key == "w"
    assert weighted.base is base and base.base is base
    assert weighted.is_sequence and weighted.num_buckets == 5
    assert weighted.input_dtype == "int64"


def test_weighted_column_checks():
    weighted = kte.weighted_categorical_column(
        kte.categorical_column_with_identity("ids", 5), "w"
    )
    with pytest.raises(ValueError, match="'ids_weighted_by_w' is already"):
        kte.weighted_categorical_column(weighted, "v")
    with pytest.raises(ValueError, match="must be a float dtype"):
        kte.weighted_categorical_column(weighted.base, "w", dtype="int32")
    with pytest.raises(ValueError, match="`key` must be a non-empty string"):
        kte.weighted_categorical_column(weighted.base, "")
    with pytest.raises(TypeError, match="`categorical_column` must be"):
        kte.weighted_categorical_column("ids", "w")


def test_vocabulary_list_tokens_must_match_the_dtype():
    with pytest.raises(ValueError, match="must hold int64 values; found 'x'"):
        kte.categorical_column_with_vocabulary_list("a", [1, "x"])
    with pytest.raises(ValueError, match="`dtype` of column 'a' must be"):
        kte.categorical_column_with_vocabulary_list("a", [1.5], dtype="float32")
    with pytest.raises(TypeError, match="must be a TensorFlow dtype"):
        kte.categorical_column_with_hash_bucket("a", 3, dtype="text")


def test_num_buckets_and_input_dtypes():
    listed = kte.categorical_column_with_vocabulary_list(
        "a", [3, 1], num_oov_buckets=2
    )
    assert (listed.num_buckets, listed.input_dtype) == (4, "int64")
    hashed = kte.categorical_column_with_hash_bucket("h", 9, dtype="int32")
    assert (hashed.num_buckets, hashed.input_dtype) == (9, "int32")
    identity = kte.categorical_column_with_identity("i", 6)
    assert (identity.num_buckets, identity.input_dtype) == (6, "int64")
    with pytest.raises(ValueError, match="Invalid num_oov_buckets -1 in a"):
        kte.categorical_column_with_vocabulary_list(
            "a", ["x"], num_oov_buckets=-1
        )
