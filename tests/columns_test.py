"""Column specs: names, defaults, ValueErrors, conversion, serialization."""

import math

import keras
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed import columns as column_conversion
from keras_tpu_embed.columns import EmbeddingColumn
from keras_tpu_embed.columns import SharedEmbeddingColumn
from tests import testing


def test_names_follow_tf():
    tags = kte.weighted_categorical_column(
        kte.categorical_column_with_hash_bucket("tags", 10), "w"
    )
    assert kte.embedding_column(tags, 4).name == "tags_weighted_by_w_embedding"
    a = kte.categorical_column_with_identity("b_col", 5)
    b = kte.categorical_column_with_identity("a_col", 5)
    shared = kte.shared_embedding_columns([a, b], 3)
    assert [c.name for c in shared] == [
        "b_col_shared_embedding",
        "a_col_shared_embedding",
    ]
    assert shared[0].table_name == "a_col_b_col_shared_embedding"
    named = kte.shared_embedding_columns(
        [a, b], 3, shared_embedding_collection_name="items"
    )
    assert {c.table_name for c in named} == {"items"}


def test_default_initializer_is_truncated_normal():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("a", 5), 16
    )
    init = column.initializer
    assert isinstance(init, keras.initializers.TruncatedNormal)
    assert init.mean == 0.0
    assert math.isclose(init.stddev, 1 / math.sqrt(16))


@pytest.mark.parametrize("dimension", [0, -1, None, 2.5])
def test_invalid_dimension(dimension):
    cat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match="Invalid dimension"):
        kte.embedding_column(cat, dimension)
    with pytest.raises(ValueError, match="Invalid dimension"):
        kte.shared_embedding_columns([cat], dimension)


def test_invalid_initializer():
    cat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match="initializer must be callable"):
        kte.embedding_column(cat, 2, initializer="zeros")


def test_max_sequence_length_rules():
    seq = kte.sequence_categorical_column_with_identity("s", 5)
    flat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match="greater than 0 for sequence"):
        kte.embedding_column(seq, 2)
    with pytest.raises(ValueError, match="Non zero max_seq_length"):
        kte.embedding_column(flat, 2, max_sequence_length=3)
    with pytest.raises(ValueError, match="same length"):
        kte.shared_embedding_columns([seq, flat], 2, max_sequence_lengths=[3])
    with pytest.raises(ValueError, match="greater than 0 for sequence"):
        kte.shared_embedding_columns(
            [seq, flat], 2, max_sequence_lengths=[0, 0]
        )
    cols = kte.shared_embedding_columns(
        [seq, flat], 2, max_sequence_lengths=[3, 0]
    )
    assert [c.max_sequence_length for c in cols] == [3, 0]


def test_shared_columns_must_agree():
    a = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match="same type"):
        kte.shared_embedding_columns(
            [a, kte.categorical_column_with_hash_bucket("h", 5)], 2
        )
    with pytest.raises(ValueError, match="same number of buckets"):
        kte.shared_embedding_columns(
            [a, kte.categorical_column_with_identity("b", 6)], 2
        )
    # Weighted and sequence forms of one type may share.
    kte.shared_embedding_columns(
        [
            a,
            kte.weighted_categorical_column(
                kte.categorical_column_with_identity("b", 5), "w"
            ),
        ],
        2,
    )


def test_lookup_device_rules():
    cat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match="embedding_lookup_device"):
        kte.embedding_column(cat, 2, embedding_lookup_device="gpu")
    with pytest.raises(ValueError, match="requires tensor_core_shape"):
        kte.embedding_column(cat, 2, embedding_lookup_device="tpu_tensor_core")
    with pytest.raises(ValueError, match="tensor_core_shape must be size 2"):
        kte.embedding_column(cat, 2, tensor_core_shape=[1, 2, 3])
    column = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("s", 5),
        2,
        max_sequence_length=4,
        embedding_lookup_device="tpu_tensor_core",
        tensor_core_shape=[None, 4],
    )
    assert column.tensor_core_shape == (None, 4)


def test_invalid_combiner_names_allowed_values():
    cat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match=r"combiner.*'max'"):
        kte.embedding_column(cat, 2, combiner="max")


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


def test_specs_are_immutable():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("a", 5), 2
    )
    with pytest.raises(Exception):
        column.dimension = 3


def test_serialization_round_trip(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a\nb\n")
    cats = [
        kte.categorical_column_with_identity("i", 5, default_value=1),
        kte.categorical_column_with_vocabulary_list(
            "l", ["x", "y"], num_oov_buckets=1
        ),
        kte.categorical_column_with_vocabulary_file("f", str(path)),
        kte.sequence_categorical_column_with_hash_bucket("h", 9),
        kte.weighted_categorical_column(
            kte.categorical_column_with_hash_bucket("w", 9), "ww"
        ),
    ]
    for cat in cats:
        testing.assert_serialization_round_trip(cat)
        max_length = 3 if cat.is_sequence else 0
        column = kte.embedding_column(cat, 4, max_sequence_length=max_length)
        rebuilt = testing.assert_serialization_round_trip(column)
        assert rebuilt.name == column.name
    shared = kte.shared_embedding_columns([cats[0], cats[0]], 3)[0]
    assert testing.assert_serialization_round_trip(shared).table_name == (
        shared.table_name
    )


def test_tf_feature_columns_convert(tmp_path):
    fc = tf.feature_column
    path = tmp_path / "v.txt"
    path.write_text("a\nb\n")
    tf_column = fc.embedding_column(
        fc.weighted_categorical_column(
            fc.categorical_column_with_vocabulary_file(
                "f", str(path), num_oov_buckets=2
            ),
            "fw",
        ),
        6,
        combiner="sqrtn",
    )
    ours = column_conversion.to_embedding_column(tf_column)
    assert isinstance(ours, EmbeddingColumn)
    assert ours.name == tf_column.name
    assert ours.vocabulary_size == 4 and ours.dimension == 6
    assert ours.combiner == "sqrtn" and ours.weight_feature_key == "fw"
    assert isinstance(ours.initializer, keras.initializers.TruncatedNormal)


def test_tpu_columns_convert():
    tpu = tf.compat.v1.tpu.experimental
    fc = tf.feature_column
    lr = lambda step: 0.1  # noqa: E731
    column = tpu.embedding_column(
        fc.sequence_categorical_column_with_identity("s", 7),
        3,
        combiner="sum",
        max_sequence_length=5,
        learning_rate_fn=lr,
        embedding_lookup_device="cpu",
    )
    ours = column_conversion.to_embedding_column(column)
    assert (ours.max_sequence_length, ours.combiner) == (5, "sum")
    assert ours.learning_rate_fn is lr and ours.embedding_lookup_device == "cpu"
    shared = tpu.shared_embedding_columns(
        [
            fc.categorical_column_with_identity("x", 9),
            fc.categorical_column_with_identity("y", 9),
        ],
        4,
        shared_embedding_collection_name="xy",
    )
    converted = [column_conversion.to_embedding_column(c) for c in shared]
    assert all(isinstance(c, SharedEmbeddingColumn) for c in converted)
    assert [c.name for c in converted] == [c.name for c in shared]
    assert {c.table_name for c in converted} == {"xy"}


def test_unsupported_tf_column_is_a_type_error():
    crossed = tf.feature_column.crossed_column(["a", "b"], 10)
    with pytest.raises(TypeError, match="CrossedColumn"):
        column_conversion.to_categorical_column(crossed)
