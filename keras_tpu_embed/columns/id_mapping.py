"""Raw values to ids: the id mapping each column kind owns.

Every categorical spec answers `id_mapping()` with an object of the
`IdMapping` protocol (`categorical_base.py`): the `tf.lookup` table it
holds, if any, and a call that turns the raw features into the column's
ids. The objects here (and in `derived_ids.py`) are the kinds of this
package; each spec passes its own fields to its mapping. Identity columns
pass ids through (out-of-range ones to `default_value` or a range error),
hashed columns hash with TensorFlow's `to_hash_bucket_fast` (as
`tf.feature_column` does), vocabulary columns look values up in a
`tf.lookup` table built from the list or the file (OOV buckets, or -1 /
`default_value` for unknown values). `FeaturePreprocessor` applies one
mapping per column, inside `tf.data` and inside the serving graph.
"""

from __future__ import annotations

import os
from typing import Any
from typing import Mapping

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns.categorical_base import CategoricalColumn
from keras_tpu_embed.columns.vocabulary_files import read_vocabulary_file
from keras_tpu_embed.columns.vocabulary_files import supplied_by_archive
from keras_tpu_embed.placement.ids import as_rank_2
from keras_tpu_embed.placement.ids import check_integer
from keras_tpu_embed.placement.ids import ids_below
from keras_tpu_embed.placement.ids import map_to_default
from keras_tpu_embed.types import LookupInitializer
from keras_tpu_embed.types import LookupTable
from keras_tpu_embed.types import Tensor


def _ignore_value(dtype: tf.DType) -> Any:
    return "" if dtype == tf.string else -1


def to_sparse(feature: str, value: Tensor) -> tf.SparseTensor:
    """Raw dense / ragged / sparse input as a rank-2 SparseTensor."""
    if isinstance(value, tf.RaggedTensor):
        if value.ragged_rank != 1 or value.shape.rank != 2:
            raise ValueError(
                f"Feature '{feature}' must be a ragged `[batch, (n)]` tensor, "
                f"got shape {value.shape}."
            )
        return value.to_sparse()
    if isinstance(value, tf.SparseTensor):
        return as_rank_2(feature, value)
    value = as_rank_2(feature, tf.convert_to_tensor(value))
    keep = tf.not_equal(value, _ignore_value(value.dtype))
    return tf.SparseTensor(
        indices=tf.where(keep),
        values=tf.boolean_mask(value, keep),
        dense_shape=tf.shape(value, out_type=tf.int64),
    )


def check_raw_dtype(
    feature: str, value: Tensor, column: CategoricalColumn
) -> None:
    want_string = column.base.input_dtype == "string"
    dtype = value.dtype
    if want_string and dtype != tf.string:
        raise TypeError(
            f"Feature '{feature}' must hold strings for column "
            f"'{column.name}', got dtype {dtype.name}."
        )
    if not want_string:
        check_integer(
            f"Feature '{feature}'",
            dtype,
            f"integers for column '{column.name}'",
        )


class ValueIds:
    """The base of kinds that map each value of their feature to one id.

    Subclasses give `map_values`; the call reads the column's feature,
    checks its dtype and keeps its structure.
    """

    table: LookupTable | None = None

    def __init__(self, column: CategoricalColumn) -> None:
        self.column = column

    def __call__(self, features: Mapping[str, Tensor]) -> tf.SparseTensor:
        key = self.column.feature_key
        raw = features[key]
        check_raw_dtype(key, raw, self.column)
        sparse = to_sparse(key, raw)
        ids = self.map_values(sparse.values)
        return tf.SparseTensor(sparse.indices, ids, sparse.dense_shape)

    def map_values(self, values: Tensor) -> Tensor:
        """The ids of a vector of raw values."""
        raise NotImplementedError(
            f"{type(self).__name__} must define map_values(values)."
        )


class IdentityIds(ValueIds):
    """Integers that are ids already: range-checked, or to the default."""

    def __init__(
        self, column: CategoricalColumn, default_value: int | None
    ) -> None:
        super().__init__(column)
        self.default_value = default_value

    def map_values(self, values: Tensor) -> Tensor:
        base = self.column
        ids = tf.cast(values, tf.int64)
        if self.default_value is not None:
            return map_to_default(ids, base.num_buckets, self.default_value)
        return ids_below(
            ids,
            base.num_buckets,
            f"Feature '{base.key}' has ids outside [0, "
            f"{base.num_buckets}) and its identity column has no "
            "default_value.",
        )


class HashedIds(ValueIds):
    """Values hashed as `tf.feature_column` hashes them."""

    def map_values(self, values: Tensor) -> Tensor:
        if values.dtype != tf.string:
            values = tf.strings.as_string(values)
        return tf.strings.to_hash_bucket_fast(values, self.column.num_buckets)


class _UnsharedTextFileInitializer(tf.lookup.TextFileInitializer):  # type: ignore[misc]
    """A vocabulary file's initializer whose table is not shared.

    TF names a file's table by the file's name, line count and columns
    (`TextFileInitializer._shared_name`) and shares it in the process, so a
    file rewritten in place kept its old mapping in every new table. With
    no shared name, `StaticHashTable` gives the table a unique one.
    """

    @property
    def _shared_name(self) -> str:
        return ""


def _lookup_table(
    initializer: LookupInitializer, num_oov_buckets: int, default: int
) -> LookupTable:
    # Each table has a name of its own (see `_UnsharedTextFileInitializer`)
    # but is not anonymous: an anonymous table cannot be serialized with a
    # dataset's graph, which is how an input pipeline reaches a pod's hosts
    # (`distribute_dataset`).
    if num_oov_buckets:
        return tf.lookup.StaticVocabularyTable(initializer, num_oov_buckets)
    return tf.lookup.StaticHashTable(initializer, default)


def _looked_up(table: LookupTable, values: Tensor) -> Tensor:
    if values.dtype.is_integer and values.dtype != tf.int64:
        values = tf.cast(values, tf.int64)
    return table.lookup(values)


class VocabularyListIds(ValueIds):
    """Values looked up in a table built from the in-memory vocabulary."""

    def __init__(
        self,
        column: CategoricalColumn,
        vocabulary_list: tuple[Any, ...],
        num_oov_buckets: int,
        default_value: int,
    ) -> None:
        super().__init__(column)
        string = column.input_dtype == "string"
        initializer = tf.lookup.KeyValueTensorInitializer(
            keys=tf.constant(
                list(vocabulary_list), tf.string if string else tf.int64
            ),
            values=tf.range(len(vocabulary_list), dtype=tf.int64),
        )
        self.table = _lookup_table(initializer, num_oov_buckets, default_value)

    def map_values(self, values: Tensor) -> Tensor:
        return _looked_up(self.table, values)


class VocabularyFileIds(ValueIds):
    """Values looked up in a table built from the vocabulary file."""

    def __init__(
        self,
        column: CategoricalColumn,
        vocabulary_file: str,
        vocabulary_size: int,
        num_oov_buckets: int,
        default_value: int | None,
    ) -> None:
        super().__init__(column)
        self.vocabulary_file = vocabulary_file
        self.vocabulary_size = vocabulary_size
        self.num_oov_buckets = num_oov_buckets
        self.default_value = default_value
        if not os.path.exists(vocabulary_file) or (
            supplied_by_archive(
                vocabulary_file,
                column.key,
                column.input_dtype,
                vocabulary_size,
            )
        ):
            # Rebuilt from a `.keras` config: the archive's copy of the
            # file arrives in `load_assets`; a call before that reads
            # the file again (`map_values`).
            return
        self.table = self._file_table()

    def _file_table(self) -> Any:
        string = self.column.input_dtype == "string"
        initializer = _UnsharedTextFileInitializer(
            filename=self.vocabulary_file,
            key_dtype=tf.string if string else tf.int64,
            key_index=tf.lookup.TextFileIndex.WHOLE_LINE,
            value_dtype=tf.int64,
            value_index=tf.lookup.TextFileIndex.LINE_NUMBER,
            vocab_size=self.vocabulary_size,
        )
        default = -1 if self.default_value is None else self.default_value
        return _lookup_table(initializer, self.num_oov_buckets, default)

    def map_values(self, values: Tensor) -> Tensor:
        if self.table is None:
            # Only a column rebuilt from a config whose file was missing
            # or invalid gets here: read it again, naming what is wrong,
            # and build the table if it is now valid.
            key = self.column.key
            tokens = read_vocabulary_file(
                self.vocabulary_file, key, self.column.input_dtype
            )
            if len(tokens) < self.vocabulary_size:
                raise ValueError(
                    f"vocabulary_file {self.vocabulary_file} of column "
                    f"'{key}' has {len(tokens)} lines, but the column "
                    f"was saved with vocabulary_size={self.vocabulary_size}."
                    " Restore the file the model was trained with."
                )
            with tf.init_scope():
                self.table = self._file_table()
        return _looked_up(self.table, values)
