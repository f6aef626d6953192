"""`SharedTPUEmbedding` holds exactly one shared table."""

import typing

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte


def test_columns_of_one_shared_table_share_rows():
    item = kte.categorical_column_with_identity("item", 10)
    recent = kte.categorical_column_with_identity("recent", 10)
    layer = kte.SharedTPUEmbedding([item, recent], dimension=3)
    out = layer({"item": tf.constant([[4]]), "recent": tf.constant([[4]])})
    np.testing.assert_array_equal(
        out["item_shared_embedding"], out["recent_shared_embedding"]
    )
    [table] = layer.table_specs
    assert table.name == "item_recent_shared_embedding"


def test_unshared_columns_and_several_tables_are_refused():
    item = kte.categorical_column_with_identity("item", 10)
    with pytest.raises(TypeError, match="Use TPUEmbeddingLayer"):
        kte.SharedTPUEmbedding([kte.embedding_column(item, 3)])
    one = kte.shared_embedding_columns([item], 3)
    other = kte.shared_embedding_columns(
        [kte.categorical_column_with_identity("user", 10)], 3
    )
    with pytest.raises(ValueError, match="holds one shared table"):
        kte.SharedTPUEmbedding(one + other)


def test_columns_are_typed_as_the_kinds_it_takes():
    """kte shared embedding columns, categorical columns (with `dimension`)
    or their `tf.feature_column` forms: not `Any`."""
    import keras_tpu_embed.shared_layer as module
    from keras_tpu_embed._compat import tf_feature_column_v2

    hints = typing.get_type_hints(kte.SharedTPUEmbedding.__init__, vars(module))
    [kinds] = typing.get_args(hints["columns"])
    assert set(typing.get_args(kinds)) == {
        kte.columns.EmbeddingColumn,
        kte.columns.SharedEmbeddingColumn,
        kte.columns.CategoricalColumn,
        tf_feature_column_v2.fc_types.FeatureColumn,
    }
