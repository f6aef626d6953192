"""Raw values to ids: the id mapping each column kind owns.

Every categorical spec answers `id_mapping()` with an object of the
`IdMapping` protocol: the `tf.lookup` table it holds, if any, and a call
that turns the raw features into the column's ids. The objects here are
the kinds of this package: identity columns pass ids through (out-of-range
ones to `default_value` or a range error), hashed columns hash with
TensorFlow's `to_hash_bucket_fast` (as `tf.feature_column` does),
vocabulary columns look values up in a `tf.lookup` table built from the
list or the file (OOV buckets, or -1 / `default_value` for unknown
values), bucketized and crossed columns compute their ids from other
features. `FeaturePreprocessor` applies one mapping per column, inside
`tf.data` and inside the serving graph.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING
from typing import Any
from typing import Mapping
from typing import Protocol

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns.vocabulary_files import read_vocabulary_file
from keras_tpu_embed.columns.vocabulary_files import supplied_by_archive
from keras_tpu_embed.ids import check_rank
from keras_tpu_embed.ids import ids_below
from keras_tpu_embed.ids import map_to_default
from keras_tpu_embed.types import Tensor

if TYPE_CHECKING:
    from keras_tpu_embed.columns.categorical import HashedColumn
    from keras_tpu_embed.columns.categorical import IdentityColumn
    from keras_tpu_embed.columns.categorical import VocabularyFileColumn
    from keras_tpu_embed.columns.categorical import VocabularyListColumn
    from keras_tpu_embed.columns.categorical_base import CategoricalColumn
    from keras_tpu_embed.columns.derived import BucketizedColumn
    from keras_tpu_embed.columns.derived import CrossedColumn


class IdMapping(Protocol):
    """How one column turns its raw features into ids.

    Attributes:
        table: The `tf.lookup` table the mapping holds (tracked by a
            SavedModel), or None.
    """

    table: Any

    def __call__(self, features: Mapping[str, Tensor]) -> tf.SparseTensor:
        """The column's ids `[batch, n]` from the raw `features` it reads
        (`column.raw_inputs`)."""


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
        if check_rank(feature, value) == 1:
            return tf.sparse.reshape(value, [-1, 1])
        return value
    value = dense_rank_2(feature, value)
    keep = tf.not_equal(value, _ignore_value(value.dtype))
    return tf.SparseTensor(
        indices=tf.where(keep),
        values=tf.boolean_mask(value, keep),
        dense_shape=tf.shape(value, out_type=tf.int64),
    )


def dense_rank_2(feature: str, value: Tensor) -> Tensor:
    """A dense `[batch]` or `[batch, n]` feature as `[batch, n]`."""
    value = tf.convert_to_tensor(value)
    if check_rank(feature, value) == 1:
        return value[:, tf.newaxis]
    return value


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
    if not want_string and not dtype.is_integer:
        raise TypeError(
            f"Feature '{feature}' must hold integers for column "
            f"'{column.name}', got dtype {dtype.name}."
        )


class ValueIds:
    """The base of kinds that map each value of their feature to one id.

    Subclasses give `map_values`; the call reads the column's feature,
    checks its dtype and keeps its structure.
    """

    table: Any = None

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

    column: IdentityColumn

    def map_values(self, values: Tensor) -> Tensor:
        base = self.column
        ids = tf.cast(values, tf.int64)
        if base.default_value is not None:
            return map_to_default(ids, base.num_buckets, base.default_value)
        return ids_below(
            ids,
            base.num_buckets,
            f"Feature '{base.key}' has ids outside [0, "
            f"{base.num_buckets}) and its identity column has no "
            "default_value.",
        )


class HashedIds(ValueIds):
    """Values hashed as `tf.feature_column` hashes them."""

    column: HashedColumn

    def map_values(self, values: Tensor) -> Tensor:
        if values.dtype != tf.string:
            values = tf.strings.as_string(values)
        return tf.strings.to_hash_bucket_fast(
            values, self.column.hash_bucket_size
        )


def _lookup_table(initializer: Any, num_oov_buckets: int, default: int) -> Any:
    # Anonymous: TF otherwise shares a file's table by its name, line
    # count and columns (`TextFileInitializer._shared_name`), so a file
    # rewritten in place kept its old mapping in every new table of
    # the process.
    if num_oov_buckets:
        return tf.lookup.StaticVocabularyTable(
            initializer, num_oov_buckets, experimental_is_anonymous=True
        )
    return tf.lookup.StaticHashTable(
        initializer, default, experimental_is_anonymous=True
    )


def _looked_up(table: Any, values: Tensor) -> Tensor:
    if values.dtype.is_integer and values.dtype != tf.int64:
        values = tf.cast(values, tf.int64)
    return table.lookup(values)


class VocabularyListIds(ValueIds):
    """Values looked up in a table built from the in-memory vocabulary."""

    column: VocabularyListColumn

    def __init__(self, column: VocabularyListColumn) -> None:
        super().__init__(column)
        key_dtype = tf.string if column.dtype == "string" else tf.int64
        initializer = tf.lookup.KeyValueTensorInitializer(
            keys=tf.constant(list(column.vocabulary_list), key_dtype),
            values=tf.range(len(column.vocabulary_list), dtype=tf.int64),
        )
        self.table = _lookup_table(
            initializer, column.num_oov_buckets, column.default_value
        )

    def map_values(self, values: Tensor) -> Tensor:
        return _looked_up(self.table, values)


class VocabularyFileIds(ValueIds):
    """Values looked up in a table built from the vocabulary file."""

    column: VocabularyFileColumn

    def __init__(self, column: VocabularyFileColumn) -> None:
        super().__init__(column)
        assert column.vocabulary_size is not None
        if not os.path.exists(column.vocabulary_file) or (
            supplied_by_archive(
                column.vocabulary_file,
                column.key,
                column.input_dtype,
                column.vocabulary_size,
            )
        ):
            # Rebuilt from a `.keras` config: the archive's copy of the
            # file arrives in `load_assets`; a call before that reads
            # the file again (`map_values`).
            return
        self.table = self._file_table()

    def _file_table(self) -> Any:
        base = self.column
        key_dtype = tf.string if base.dtype == "string" else tf.int64
        initializer = tf.lookup.TextFileInitializer(
            filename=base.vocabulary_file,
            key_dtype=key_dtype,
            key_index=tf.lookup.TextFileIndex.WHOLE_LINE,
            value_dtype=tf.int64,
            value_index=tf.lookup.TextFileIndex.LINE_NUMBER,
            vocab_size=base.vocabulary_size,
        )
        default = -1 if base.default_value is None else base.default_value
        return _lookup_table(initializer, base.num_oov_buckets, default)

    def map_values(self, values: Tensor) -> Tensor:
        if self.table is None:
            # Only a column rebuilt from a config whose file was missing
            # or invalid gets here: read it again, naming what is wrong,
            # and build the table if it is now valid.
            base = self.column
            assert base.vocabulary_size is not None
            tokens = read_vocabulary_file(
                base.vocabulary_file, base.key, base.input_dtype
            )
            if len(tokens) < base.vocabulary_size:
                raise ValueError(
                    f"vocabulary_file {base.vocabulary_file} of column "
                    f"'{base.key}' has {len(tokens)} lines, but the column "
                    f"was saved with vocabulary_size={base.vocabulary_size}."
                    " Restore the file the model was trained with."
                )
            with tf.init_scope():
                self.table = self._file_table()
        return _looked_up(self.table, values)


def bucketized_ids(column: BucketizedColumn, raw: Tensor) -> tf.SparseTensor:
    """A bucketized column's ids: `[batch, size]`, one per number.

    As TF computes them: the numbers cast to float32
    (`NumericColumn._transform_input_tensor`), bucketized with the
    `Bucketize` op (`math_ops._bucketize`), dimension `i` offset by
    `i * (len(boundaries) + 1)`
    (`BucketizedColumn._get_sparse_tensors_for_input_tensor`).
    """
    source = column.source_column
    if isinstance(raw, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(
            f"Feature '{source.key}' of bucketized column '{column.name}' "
            f"must be a dense tensor of shape [batch, {source.size}], as "
            "tf.feature_column.numeric_column takes it; got a "
            f"{type(raw).__name__}."
        )
    raw = tf.convert_to_tensor(raw)
    if not (raw.dtype.is_floating or raw.dtype.is_integer):
        raise TypeError(
            f"Feature '{source.key}' of bucketized column '{column.name}' "
            f"must be numeric, got dtype {raw.dtype.name}."
        )
    values = _numbers_per_row(column, tf.cast(raw, tf.float32))
    buckets = tf.raw_ops.Bucketize(
        input=values, boundaries=list(column.boundaries)
    )
    offsets = tf.range(source.size, dtype=tf.int64) * (
        len(column.boundaries) + 1
    )
    ids = tf.cast(buckets, tf.int64) + offsets[tf.newaxis, :]
    shape = tf.shape(ids, out_type=tf.int64)
    return tf.SparseTensor(
        indices=tf.where(tf.ones_like(ids, tf.bool)),
        values=tf.reshape(ids, [-1]),
        dense_shape=shape,
    )


def _numbers_per_row(column: BucketizedColumn, raw: Tensor) -> Tensor:
    """`raw` as `[batch, size]`, refusing any other count per example.

    A `[batch, n]` input with `n != size` reshaped to `[-1, size]` would
    silently become another number of examples; legacy `DenseFeatures`
    raises there too.
    """
    source = column.source_column
    message = (
        f"Feature '{source.key}' of bucketized column '{column.name}' must "
        f"hold {source.size} numbers per example ([batch, {source.size}], "
        f"as numeric_column('{source.key}', shape={source.shape}) declares); "
        "give each example that many numbers or declare the numeric "
        "column's shape to match. Received shape"
    )
    rank = raw.shape.rank
    static = raw.shape.as_list()[1:] if rank is not None else None
    if rank == 0 or (
        rank is not None
        and static is not None
        and None not in static
        and (math.prod(static) if rank > 1 else 1) != source.size
    ):
        raise ValueError(f"{message} {raw.shape}.")
    shape = tf.shape(raw)
    per_row = tf.reduce_prod(shape[1:])
    check = tf.debugging.Assert(
        tf.logical_and(tf.size(shape) >= 1, tf.equal(per_row, source.size)),
        [message, shape],
    )
    with tf.control_dependencies([check]):
        return tf.reshape(raw, tf.stack([shape[0], source.size]))


def _check_cross_dtype(
    column: CrossedColumn, key: str, declared: str, dtype: Any
) -> None:
    """Refuses a crossed key whose values are not of its declared kind.

    The integer 1 and the string "1" hash to different ids, and the
    serving export and parse spec take each key as declared: integers
    crossed in training under a string declaration would serve other ids.
    """
    if (declared == "string") == (dtype == tf.string):
        return
    position = [k for k in column.keys if isinstance(k, str)].index(key)
    dtypes = list(column.key_dtypes or ())
    dtypes[position] = "int64" if declared == "string" else "string"
    raise TypeError(
        f"Feature '{key}' of crossed column '{column.name}' holds "
        f"{dtype.name} values, but the column declares it {declared} "
        "(key_dtypes; a tf.feature_column.crossed_column declares every "
        "feature key a string): integers and strings hash to different "
        "ids, so training and the serving export would disagree. Declare "
        f"it: kte.crossed_column(keys, ..., key_dtypes={dtypes}), or feed "
        f"{declared} values."
    )


def crossed_ids(
    column: CrossedColumn, features: Mapping[str, Tensor]
) -> tf.SparseTensor:
    """A crossed column's ids, with TF's own hashing of every combination.

    `CrossedColumn.get_sparse_tensors` (`feature_column_v2.py`) passes its
    keys' values (raw features; bucketized ids) in key order to
    `sparse_ops.sparse_cross_hashed`, the op behind `tf.sparse.cross_hashed`,
    which is what runs here, with the same inputs. A dense raw feature
    reaches that op dense, every value included
    (`FeatureTransformationCache._get_raw_feature_as_tensor` drops no
    `""` / -1), and the op crosses sparse inputs before dense ones, which
    changes the hashes: both are kept as TF has them, so dense padding is
    crossed like a value, as in TF. Ragged and sparse inputs have no padding.
    """
    dtypes = iter(column.key_dtypes or ())
    inputs: list[Any] = []
    for key in column.keys:
        if isinstance(key, str):
            declared = next(dtypes)
            value = features[key]
            if isinstance(value, (tf.SparseTensor, tf.RaggedTensor)):
                value = to_sparse(key, value)
                values = value.values
            else:
                value = dense_rank_2(key, value)
                values = value
            if not (values.dtype.is_integer or values.dtype == tf.string):
                raise TypeError(
                    f"Feature '{key}' of crossed column '{column.name}' "
                    f"must hold strings or integers (declared {declared}), "
                    f"got dtype {values.dtype.name}."
                )
            _check_cross_dtype(column, key, declared, values.dtype)
            if values.dtype.is_integer and values.dtype != tf.int64:
                if isinstance(value, tf.SparseTensor):
                    value = tf.SparseTensor(
                        value.indices,
                        tf.cast(values, tf.int64),
                        value.dense_shape,
                    )
                else:
                    value = tf.cast(value, tf.int64)
            inputs.append(value)
        else:
            inputs.append(key.id_mapping()(features))
    return tf.sparse.cross_hashed(
        inputs, num_buckets=column.hash_bucket_size, hash_key=column.hash_key
    )


class BucketizedIds:
    """A bucketized column's ids, from its numeric feature."""

    table: Any = None

    def __init__(self, column: BucketizedColumn) -> None:
        self.column = column

    def __call__(self, features: Mapping[str, Tensor]) -> tf.SparseTensor:
        source = self.column.source_column
        return bucketized_ids(self.column, features[source.key])


class CrossedIds:
    """A crossed column's ids, from its keys' features."""

    table: Any = None

    def __init__(self, column: CrossedColumn) -> None:
        self.column = column

    def __call__(self, features: Mapping[str, Tensor]) -> tf.SparseTensor:
        return crossed_ids(self.column, features)
