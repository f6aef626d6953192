"""Converts `tf.feature_column` categorical columns to our specs.

Existing feature-column code migrates without edits: wherever a categorical
column of this package is accepted, one built with `tf.feature_column.*` is
accepted too and converted here, once.
"""

from __future__ import annotations

from typing import Any

from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_feature_column_v2 as fc
from keras_tpu_embed.columns import categorical as columns_lib
from keras_tpu_embed.columns import categorical_factories as factories
from keras_tpu_embed.columns import derived
from keras_tpu_embed.columns.categorical_base import CategoricalColumn
from keras_tpu_embed.types import TFFeatureColumn


def to_categorical_column(
    column: CategoricalColumn | TFFeatureColumn,
) -> CategoricalColumn:
    """Returns `column` as a categorical column of this package.

    Raises:
        TypeError: for a column kind this package has no equivalent of
            (crossed, bucketized, ...), naming its type.
    """
    if isinstance(column, CategoricalColumn):
        return column
    sequence = False
    if isinstance(column, fc.SequenceCategoricalColumn):
        sequence = True
        column = column.categorical_column
    if isinstance(column, fc.WeightedCategoricalColumn):
        inner = to_categorical_column(column.categorical_column)
        return columns_lib.WeightedColumn(
            categorical_column=inner,
            weight_feature_key=column.weight_feature_key,
            dtype=tf.as_dtype(column.dtype).name,
        )
    converted: CategoricalColumn
    if isinstance(column, fc.IdentityCategoricalColumn):
        converted = factories.categorical_column_with_identity(
            column.key, column.number_buckets, column.default_value
        )
    elif isinstance(column, fc.VocabularyListCategoricalColumn):
        vocabulary = [
            t.decode() if isinstance(t, bytes) else t
            for t in column.vocabulary_list
        ]
        converted = factories.categorical_column_with_vocabulary_list(
            column.key,
            vocabulary,
            column.dtype,
            column.default_value,
            column.num_oov_buckets,
        )
    elif isinstance(column, fc.VocabularyFileCategoricalColumn):
        default = column.default_value
        converted = factories.categorical_column_with_vocabulary_file(
            column.key,
            column.vocabulary_file,
            vocabulary_size=column.vocabulary_size,
            num_oov_buckets=column.num_oov_buckets,
            default_value=None if default == -1 else default,
            dtype=column.dtype,
            file_format=getattr(column, "file_format", None),
        )
    elif isinstance(column, fc.BucketizedColumn):
        converted = derived.bucketized_column(
            column.source_column, column.boundaries
        )
    elif isinstance(column, fc.CrossedColumn):
        converted = derived.crossed_column(
            [k if isinstance(k, str) else _cross_key(k) for k in column.keys],
            column.hash_bucket_size,
            column.hash_key,
        )
    elif isinstance(column, fc.HashedCategoricalColumn):
        converted = factories.categorical_column_with_hash_bucket(
            column.key, column.hash_bucket_size, column.dtype
        )
    else:
        raise TypeError(
            "Cannot convert a column of type "
            f"{type(column).__name__} ({getattr(column, 'name', column)!r}). "
            "Supported: identity, vocabulary list, vocabulary file, hash "
            "bucket, bucketized, crossed, weighted and sequence categorical "
            "columns."
        )
    if sequence:
        converted = factories.as_sequence(converted)
    return converted


def _cross_key(key: Any) -> derived.BucketizedColumn:
    converted = to_categorical_column(key)
    if not isinstance(converted, derived.BucketizedColumn):
        raise TypeError(
            "A crossed column may cross feature keys and bucketized columns; "
            f"it has the {type(key).__name__} {getattr(key, 'name', key)!r}."
            " Cross its raw feature key instead."
        )
    return converted
