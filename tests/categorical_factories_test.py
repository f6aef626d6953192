"""The `categorical_column_with_*` factories, as TF spells them."""

import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.columns import categorical
from keras_tpu_embed.columns import input_keys


def test_each_factory_builds_its_spec(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a\nb\n")
    built = {
        categorical.IdentityColumn: kte.categorical_column_with_identity(
            "i", 3
        ),
        categorical.VocabularyListColumn: (
            kte.categorical_column_with_vocabulary_list("l", ["x"])
        ),
        categorical.VocabularyFileColumn: (
            kte.categorical_column_with_vocabulary_file("f", path)
        ),
        categorical.HashedColumn: kte.categorical_column_with_hash_bucket(
            "h", 4
        ),
    }
    for spec, column in built.items():
        assert type(column) is spec
        assert not column.is_sequence
    # A pathlib.Path is accepted and stored as a string.
    assert built[categorical.VocabularyFileColumn].vocabulary_file == str(path)


def test_sequence_factories_build_the_sequence_form(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a\nb\n")
    factories = [
        (
            kte.sequence_categorical_column_with_identity,
            kte.categorical_column_with_identity,
            ("i", 3, 1),
        ),
        (
            kte.sequence_categorical_column_with_vocabulary_list,
            kte.categorical_column_with_vocabulary_list,
            ("l", ["x", "y"], None, -1, 2),
        ),
        (
            kte.sequence_categorical_column_with_hash_bucket,
            kte.categorical_column_with_hash_bucket,
            ("h", 4, "int64"),
        ),
    ]
    for sequence_factory, flat_factory, arguments in factories:
        sequence, flat = sequence_factory(*arguments), flat_factory(*arguments)
        assert sequence.is_sequence and not flat.is_sequence
        assert sequence.get_config() == dict(
            flat.get_config(), is_sequence=True
        )
    # TF's sequence vocabulary-file factory keeps the TF1 argument order.
    sequence = kte.sequence_categorical_column_with_vocabulary_file(
        "f", str(path), None, 1
    )
    assert sequence.is_sequence and sequence.num_oov_buckets == 1


def test_vocabulary_file_takes_tf2_argument_order(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("3\n7\n9\n")
    # tf.feature_column's order: key, vocabulary_file, vocabulary_size,
    # dtype, default_value, num_oov_buckets, file_format.
    column = kte.categorical_column_with_vocabulary_file(
        "f", str(path), 2, tf.int64, 1, 0, "text"
    )
    theirs = tf.feature_column.categorical_column_with_vocabulary_file(
        "f", str(path), 2, tf.int64, 1, 0, "text"
    )
    assert column.dtype == "int64" and column.vocabulary_size == 2
    assert column.default_value == theirs.default_value == 1
    assert column.num_oov_buckets == 0 and column.file_format == "text"
    oov = kte.categorical_column_with_vocabulary_file(
        "f", str(path), None, "int64", None, 2
    )
    assert oov.num_buckets == 5


def test_vocabulary_file_refuses_tfrecord_vocabularies(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a\nb\n")
    with pytest.raises(ValueError, match="file_format='tfrecord_gzip'"):
        kte.categorical_column_with_vocabulary_file(
            "f", str(path), file_format="tfrecord_gzip"
        )
    with pytest.raises(ValueError, match="file_format='csv'"):
        kte.categorical_column_with_vocabulary_file(
            "f", str(path), file_format="csv"
        )
    # TF infers tfrecord_gzip from the suffix; so is it refused here.
    gz = tmp_path / "v.tfrecord.gz"
    gz.write_text("a\n")
    with pytest.raises(ValueError, match="tfrecord_gzip"):
        kte.categorical_column_with_vocabulary_file("f", str(gz))


def test_vocabulary_list_dtype_is_inferred_from_the_tokens():
    words = kte.categorical_column_with_vocabulary_list("a", ["x", "y"])
    assert words.dtype == "string"
    numbers = kte.categorical_column_with_vocabulary_list("a", [5, 2])
    assert numbers.dtype == "int64" and numbers.vocabulary_list == (5, 2)
    narrow = kte.categorical_column_with_vocabulary_list(
        "a", [5, 2], dtype=tf.int32
    )
    assert narrow.dtype == "int32"


def test_input_keys_lists_ids_then_weights_once():
    tags = kte.weighted_categorical_column(
        kte.categorical_column_with_hash_bucket("tags", 5), "tag_w"
    )
    item = kte.categorical_column_with_identity("item", 5)
    columns = [tags, item, kte.embedding_column(tags, 2)]
    assert input_keys(columns) == ["tags", "tag_w", "item"]
