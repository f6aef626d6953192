"""Vocabulary files: reading and validating them, and the archive case."""

import hashlib
import os

import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.columns import vocabulary_files


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "is empty"),
        ("a\n\nb\n", "line 2 is blank"),
        ("a\n b\n", "line 2 has leading or trailing whitespace"),
        ("a\nb\na\n", "line 3 repeats the token 'a' of line 1"),
    ],
)
def test_vocabulary_file_validation(tmp_path, content, message):
    path = tmp_path / "vocab.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as error:
        kte.categorical_column_with_vocabulary_file("f", str(path))
    assert str(path) in str(error.value)


def test_vocabulary_file_missing_and_size(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        kte.categorical_column_with_vocabulary_file("f", str(tmp_path / "no"))
    path = tmp_path / "v.txt"
    path.write_text("a\nb\nc\n")
    column = kte.categorical_column_with_vocabulary_file(
        "f", str(path), num_oov_buckets=2
    )
    assert column.vocabulary_size == 3 and column.num_buckets == 5
    with pytest.raises(ValueError, match="has only 3 lines"):
        kte.categorical_column_with_vocabulary_file(
            "f", str(path), vocabulary_size=4
        )


def test_read_returns_the_tokens_in_line_order(tmp_path):
    path = tmp_path / "v.txt"
    path.write_bytes(b"us\r\nfr\nd\xc3\xa9\n")
    assert vocabulary_files.read_vocabulary_file(str(path), "c", "string") == [
        "us",
        "fr",
        "dé",
    ]


def test_integer_vocabularies_hold_integers(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("3\n-1\nx\n")
    with pytest.raises(ValueError, match=r"line 3 holds 'x', not an integer"):
        kte.categorical_column_with_vocabulary_file(
            "f", str(path), dtype="int64"
        )
    path.write_text("3\n-1\n")
    column = kte.categorical_column_with_vocabulary_file(
        "f", str(path), dtype="int64"
    )
    assert column.vocabulary_size == 2


def test_non_utf8_file_is_named(tmp_path):
    path = tmp_path / "v.txt"
    path.write_bytes(b"a\n\xff\n")
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        kte.categorical_column_with_vocabulary_file("f", str(path))


def test_missing_files_are_allowed_only_inside_an_archive_load(tmp_path):
    missing = str(tmp_path / "gone.txt")
    assert not vocabulary_files.supplied_by_archive(missing)
    with vocabulary_files.vocabulary_files_from_archive():
        assert vocabulary_files.supplied_by_archive(missing)
        column = kte.categorical_column_with_vocabulary_file(
            "f", missing, vocabulary_size=4
        )
        assert column.num_buckets == 4
        # An existing file is still read.
        present = tmp_path / "here.txt"
        present.write_text("a\n")
        assert not vocabulary_files.supplied_by_archive(str(present))
    assert not vocabulary_files.supplied_by_archive(missing)
    with pytest.raises(ValueError, match="does not exist"):
        kte.categorical_column_with_vocabulary_file(
            "f", missing, vocabulary_size=4
        )


def test_byte_order_mark_is_refused_naming_the_file(tmp_path):
    """TF's TextFileInitializer keeps the mark in the first token, so the
    file is refused rather than read differently from the serving table."""
    path = tmp_path / "v.txt"
    path.write_bytes(b"\xef\xbb\xbfus\nfr\n")
    with pytest.raises(ValueError, match="byte-order mark") as error:
        kte.categorical_column_with_vocabulary_file("f", str(path))
    assert str(path) in str(error.value)


def test_integer_tokens_equal_as_integers_are_named(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("5\n7\n007\n")
    with pytest.raises(
        ValueError, match=r"line 3 holds '007', the integer 7 of line 2"
    ) as error:
        kte.categorical_column_with_vocabulary_file(
            "f", str(path), dtype="int64"
        )
    assert str(path) in str(error.value)


@pytest.mark.parametrize("num_oov_buckets", [0, 1])
def test_a_file_rewritten_in_place_is_read_again(tmp_path, num_oov_buckets):
    # TensorFlow shares a file's lookup table by file name, line count and
    # columns: a rewrite of the same length kept the old mapping.
    path = tmp_path / "v.txt"
    path.write_text("a\nb\nc\n")

    def ids():
        column = kte.embedding_column(
            kte.categorical_column_with_vocabulary_file(
                "w", str(path), num_oov_buckets=num_oov_buckets
            ),
            2,
        )
        pre = kte.FeaturePreprocessor([column])
        return pre({"w": tf.constant([["a"], ["c"]])})["w"].values.numpy()

    assert ids().tolist() == [0, 2]
    path.write_text("c\nb\na\n")
    assert ids().tolist() == [2, 0]


def test_file_sha256_is_hashlibs(tmp_path):
    path = tmp_path / "f.bin"
    data = os.urandom(3 << 20)  # more than one block of the reader
    path.write_bytes(data)
    assert vocabulary_files.file_sha256(str(path)) == (
        hashlib.sha256(data).hexdigest()
    )
