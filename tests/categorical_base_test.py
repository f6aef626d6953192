"""The categorical base: what a column kind gives instead of type switches."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte


class _ModuloIds:
    """The id mapping of `_ModuloColumn`: each integer modulo the buckets."""

    table = None  # no `tf.lookup` table to track

    def __init__(self, column):
        self.column = column

    def __call__(self, features):
        raw = tf.convert_to_tensor(features[self.column.feature_key])
        present = tf.where(tf.not_equal(raw, -1))
        values = tf.math.floormod(
            tf.cast(tf.gather_nd(raw, present), tf.int64),
            self.column.num_buckets,
        )
        return tf.SparseTensor(
            present, values, tf.shape(raw, out_type=tf.int64)
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _ModuloColumn(kte.columns.CategoricalColumn):
    """A column kind the library does not know: ids are values % buckets."""

    key: str
    num_buckets: int
    is_sequence: bool = False

    def id_mapping(self):
        return _ModuloIds(self)


def test_a_new_kind_is_one_spec_class_end_to_end():
    """Preprocessor and layer take a kind defined outside the library."""
    column = kte.embedding_column(_ModuloColumn(key="m", num_buckets=3), 2)
    preprocessor = kte.FeaturePreprocessor([column])
    layer = kte.TPUEmbeddingLayer([column])
    ids = preprocessor({"m": tf.constant([[4, -1], [9, 5]])})
    np.testing.assert_array_equal(
        tf.sparse.to_dense(ids["m"], default_value=-1), [[1, -1], [0, 2]]
    )
    out = layer(ids)["m_embedding"].numpy()
    table = layer.table_variable("m").numpy()
    np.testing.assert_allclose(out[0], table[1], atol=1e-7)
    np.testing.assert_allclose(out[1], (table[0] + table[2]) / 2, atol=1e-7)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _KindWithoutIds(kte.columns.CategoricalColumn):
    key: str
    num_buckets: int = 3
    is_sequence: bool = False


def test_a_kind_without_id_mapping_is_named_at_construction():
    column = kte.embedding_column(_KindWithoutIds(key="k"), 2)
    with pytest.raises(NotImplementedError, match="_KindWithoutIds gives no"):
        kte.FeaturePreprocessor([column])


def test_defaults_of_a_kind_without_vocabulary_or_derived_ids():
    kind = _KindWithoutIds(key="k")
    assert kind.out_of_range_id is None and kind.vocabulary() is None
    assert kind.vocabulary_files() == [] and kind.numeric_sources == {}
    assert kind.crossed_padding == {}
    assert kind.with_vocabulary_files({"a": "b"}) is kind
