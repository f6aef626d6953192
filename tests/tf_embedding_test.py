"""`tf.feature_column` and TPU embedding columns become ours."""

import keras
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed import columns as column_conversion
from keras_tpu_embed.columns import EmbeddingColumn
from keras_tpu_embed.columns import SharedEmbeddingColumn


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


def test_lists_convert_column_by_column():
    fc = tf.feature_column
    columns = [
        fc.embedding_column(fc.categorical_column_with_identity("a", 4), 2),
        kte.embedding_column(kte.categorical_column_with_identity("b", 4), 2),
    ]
    converted = column_conversion.to_embedding_columns(columns)
    assert [c.name for c in converted] == ["a_embedding", "b_embedding"]
    assert converted[1] is columns[1]
    with pytest.raises(
        TypeError,
        match="Expected an embedding column .*"
        "Received: IdentityCategoricalColumn 'a'",
    ):
        column_conversion.to_embedding_column(
            fc.categorical_column_with_identity("a", 4)
        )


def test_trainable_carries_over_from_tf_columns():
    fc = tf.feature_column
    cats = [
        fc.categorical_column_with_identity("a", 5),
        fc.categorical_column_with_identity("b", 5),
    ]
    frozen = fc.embedding_column(cats[0], 2, trainable=False)
    assert column_conversion.to_embedding_column(frozen).trainable is False
    assert column_conversion.to_embedding_column(
        fc.embedding_column(cats[0], 2)
    ).trainable
    with tf.Graph().as_default():
        shared = fc.shared_embeddings(cats, 2, trainable=False)
    assert all(
        not column_conversion.to_embedding_column(c).trainable for c in shared
    )
