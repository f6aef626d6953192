"""Grouping columns into tables; columns sharing one must agree on it."""

import keras
import pytest

import keras_tpu_embed as kte
from keras_tpu_embed.columns import SharedEmbeddingColumn
from keras_tpu_embed.tables import group_into_tables
from tests import testing


def _shared(dimension=2, name="items", **kwargs):
    return kte.shared_embedding_columns(
        [
            kte.categorical_column_with_identity("item", 6),
            kte.sequence_categorical_column_with_identity("hist", 6),
        ],
        dimension,
        max_sequence_lengths=[0, 3],
        shared_embedding_collection_name=name,
        **kwargs,
    )


def test_tables_in_order_of_first_appearance():
    item, hist = _shared()
    a, b = testing.identity_column("a"), testing.identity_column("b")
    tables = group_into_tables([a, item, b, hist])
    assert [t.name for t in tables] == ["a", "items", "b"]
    assert tables[1].columns == (item, hist)
    assert tables[0].columns == (a,)


def test_a_table_takes_its_columns_shape_and_rules():
    lr = lambda step: 0.1  # noqa: E731
    initializer = keras.initializers.Zeros()
    item, _ = _shared(3, initializer=initializer, learning_rate_fn=lr)
    (table,) = group_into_tables([item])
    assert (table.vocabulary_size, table.dimension) == (6, 3)
    assert table.initializer is initializer
    assert table.learning_rate_fn is lr


def test_unshared_columns_may_not_share_a_table():
    a = testing.identity_column("a")
    with pytest.raises(
        ValueError,
        match="'a_embedding' and 'a_embedding' both name the table 'a', but "
        "only shared_embedding_columns may share",
    ):
        group_into_tables([a, testing.identity_column("a", dimension=5)])
    # A shared collection named like an unshared column's table.
    items = testing.identity_column("items")
    with pytest.raises(ValueError, match="both name the table 'items'"):
        group_into_tables([items, _shared()[0]])


@pytest.mark.parametrize(
    "other",
    [
        dict(dimension=4),
        dict(vocabulary_size=7),
        dict(initializer=keras.initializers.Ones()),
    ],
    ids=["dimension", "vocabulary_size", "initializer"],
)
def test_shared_columns_that_disagree_are_refused(other):
    first = _shared()[0]
    second = SharedEmbeddingColumn(
        categorical_column=kte.categorical_column_with_identity(
            "other", other.get("vocabulary_size", 6)
        ),
        dimension=other.get("dimension", 2),
        initializer=other.get("initializer", first.initializer),
        shared_embedding_collection_name="items",
    )
    with pytest.raises(
        ValueError,
        match="'item_shared_embedding' and 'other_shared_embedding' share the "
        "table 'items' but disagree on it",
    ):
        group_into_tables([first, second])
