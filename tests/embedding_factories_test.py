"""`embedding_column` and `shared_embedding_columns`, as TF spells them."""

import keras
import pytest

import keras_tpu_embed as kte
from keras_tpu_embed.columns import SharedEmbeddingColumn


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


@pytest.mark.parametrize("dimension", [0, -1, None, 2.5])
def test_invalid_dimension(dimension):
    cat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match="Invalid dimension"):
        kte.embedding_column(cat, dimension)
    with pytest.raises(ValueError, match="Invalid dimension"):
        kte.shared_embedding_columns([cat], dimension)


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


def test_factories_pass_every_argument_on():
    cat = kte.sequence_categorical_column_with_identity("s", 5)
    lr = lambda step: 0.1  # noqa: E731
    initializer = keras.initializers.Zeros()
    arguments = dict(
        combiner="sqrtn",
        initializer=initializer,
        learning_rate_fn=lr,
        embedding_lookup_device="tpu_tensor_core",
        tensor_core_shape=[None, 4],
        use_safe_embedding_lookup=False,
    )
    own = kte.embedding_column(cat, 3, max_sequence_length=4, **arguments)
    (shared,) = kte.shared_embedding_columns(
        [cat], 3, max_sequence_lengths=[4], **arguments
    )
    for column in (own, shared):
        assert column.dimension == 3 and column.max_sequence_length == 4
        assert column.combiner == "sqrtn"
        assert column.initializer is initializer
        assert column.learning_rate_fn is lr
        assert column.tensor_core_shape == (None, 4)
        assert not column.use_safe_embedding_lookup


def test_shared_columns_read_one_table():
    a = kte.categorical_column_with_identity("a", 5)
    b = kte.sequence_categorical_column_with_identity("b", 5)
    shared = kte.shared_embedding_columns(
        [a, b], 2, max_sequence_lengths=[0, 2]
    )
    assert all(isinstance(c, SharedEmbeddingColumn) for c in shared)
    assert {c.table_name for c in shared} == {"a_b_shared_embedding"}
    # One initializer object for the one table.
    assert shared[0].initializer is shared[1].initializer
    assert [c.max_sequence_length for c in shared] == [0, 2]
