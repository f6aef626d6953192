"""Grouping columns into tables; columns sharing one must agree on it."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.columns import SharedEmbeddingColumn
from keras_tpu_embed.tables.table_specs import CheckpointInitializer
from keras_tpu_embed.tables.table_specs import group_into_tables
from tests import initializer_cases as cases
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


def test_columns_with_a_lambda_share_a_table_without_a_warning():
    """Comparing the columns of a table serialized their learning_rate_fn,
    and Keras warned that a lambda is unsafe to save: nothing was saved."""
    item, hist = _shared(learning_rate_fn=lambda step: 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (table,) = group_into_tables([item, hist])
    assert table.columns == (item, hist)


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


def _checkpoint(tmp_path, values, name="table"):
    """A name-based checkpoint holding `values` under the key `name`."""
    variable = tf.Variable(values, name="v")
    path = tf.train.Checkpoint(**{name: variable}).write(str(tmp_path / "c"))
    return path, f"{name}/.ATTRIBUTES/VARIABLE_VALUE"


def _from_checkpoint(path, tensor, vocabulary_size=6, dimension=3):
    return tf.feature_column.embedding_column(
        tf.feature_column.categorical_column_with_identity(
            "item", vocabulary_size
        ),
        dimension,
        ckpt_to_load_from=path,
        tensor_name_in_ckpt=tensor,
    )


def test_table_starts_from_the_checkpoint_tensor(tmp_path):
    values = np.arange(18, dtype=np.float32).reshape(6, 3)
    path, tensor = _checkpoint(tmp_path, values)
    layer = kte.TPUEmbeddingLayer([_from_checkpoint(path, tensor)])
    layer.build()
    np.testing.assert_array_equal(layer.table_variable("item").numpy(), values)
    out = layer({"item": tf.constant([[2]])})["item_embedding"]
    np.testing.assert_array_equal(out.numpy(), values[2:3])
    # ... on the TPU engine's TableConfig too.
    configs = kte.to_tpu_feature_configs([_from_checkpoint(path, tensor)])
    initial = configs["item_embedding"].table.initializer((6, 3), "float32")
    np.testing.assert_array_equal(np.asarray(initial), values)


def test_checkpoint_tensor_missing_or_misshapen_names_both(tmp_path):
    path, tensor = _checkpoint(tmp_path, np.zeros([6, 3], np.float32))
    missing = kte.TPUEmbeddingLayer([_from_checkpoint(path, "nope")])
    with pytest.raises(ValueError, match=f"'nope'.*{path}") as error:
        missing.build()
    assert tensor in str(error.value)  # names what the checkpoint has
    wrong = kte.TPUEmbeddingLayer([_from_checkpoint(path, tensor, 7)])
    with pytest.raises(ValueError, match=r"\[6, 3\].*\[7, 3\]"):
        wrong.build()
    nowhere = kte.TPUEmbeddingLayer(
        [_from_checkpoint(str(tmp_path / "absent"), tensor)]
    )
    with pytest.raises(ValueError, match="absent"):
        nowhere.build()


def test_checkpoint_arguments_come_in_pairs():
    item = kte.categorical_column_with_identity("item", 6)
    with pytest.raises(ValueError, match="tensor_name_in_ckpt"):
        kte.embedding_column(item, 3, ckpt_to_load_from="/some/ckpt")


def test_saved_config_does_not_read_the_checkpoint_again(tmp_path):
    values = np.ones([6, 3], np.float32)
    path, tensor = _checkpoint(tmp_path, values)
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 6),
        3,
        ckpt_to_load_from=path,
        tensor_name_in_ckpt=tensor,
    )
    # A saved model carries the trained table: a reload must not need
    # (or go back to) the warm-start checkpoint.
    restored = type(column).from_config(column.get_config())
    assert restored.ckpt_to_load_from is None


@pytest.mark.parametrize("name", sorted(cases.PRETRAINED))
def test_shared_columns_with_any_callable_initializer_share_a_table(name):
    """Issue 41, item 7: grouping `json.dumps`ed the initializer, which
    failed for a closure over a matrix or another initializer, a partial
    and an object with `__call__`."""
    initializer = cases.PRETRAINED[name]((6, 2))
    item, hist = _shared(initializer=initializer)
    (table,) = group_into_tables([item, hist])
    assert table.initializer is initializer
    assert table.columns == (item, hist)


def test_checkpoint_initializer_inside_a_trace_holds_no_copy(tmp_path):
    """Engine tables are created inside the first step's trace: the table
    was a constant of the graph (a copy, and at most 2 GB)."""
    values = np.arange(18, dtype=np.float32).reshape(6, 3)
    path, tensor = _checkpoint(tmp_path, values)
    initializer = CheckpointInitializer(path, tensor, table="item")
    read = tf.function(lambda: initializer((6, 3), tf.float32))
    graph = read.get_concrete_function().graph
    sizes = [
        op.outputs[0].shape.num_elements()
        for op in graph.get_operations()
        if op.type == "Const"
    ]
    assert values.size not in sizes, sizes
    np.testing.assert_array_equal(read(), values)
