"""Raw values to ids, one categorical column at a time, on the host.

Identity columns pass ids through (out-of-range ones to `default_value` or a
range error), hashed columns hash with TensorFlow's `to_hash_bucket_fast`
(as `tf.feature_column` does), vocabulary columns look values up in a
`tf.lookup` table built from the list or the file (OOV buckets, or -1 /
`default_value` for unknown values). `FeaturePreprocessor` applies one
`IdMapper` per column, inside `tf.data` and inside the serving graph.
"""

from __future__ import annotations

import math
import os
from typing import Any

from keras_tpu_embed import columns as columns_lib
from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns.vocabulary_files import supplied_by_archive
from keras_tpu_embed.ids import ids_below
from keras_tpu_embed.ids import map_to_default
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
        rank = value.shape.rank
        if rank == 1:
            return tf.sparse.reshape(value, [-1, 1])
        if rank != 2:
            raise ValueError(
                f"Feature '{feature}' must be rank 1 or 2, got a sparse "
                f"tensor of rank {rank}."
            )
        return value
    value = tf.convert_to_tensor(value)
    rank = value.shape.rank
    if rank == 1:
        value = value[:, tf.newaxis]
    elif rank != 2:
        raise ValueError(
            f"Feature '{feature}' must be rank 1 `[batch]` or rank 2 "
            f"`[batch, n]`, got shape {value.shape}."
        )
    keep = tf.not_equal(value, _ignore_value(value.dtype))
    return tf.SparseTensor(
        indices=tf.where(keep),
        values=tf.boolean_mask(value, keep),
        dense_shape=tf.shape(value, out_type=tf.int64),
    )


def check_raw_dtype(
    feature: str, value: Tensor, column: columns_lib.CategoricalColumn
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


class IdMapper:
    """Maps the values of one feature to ids with one column's rules."""

    def __init__(self, column: columns_lib.CategoricalColumn) -> None:
        self.column = column
        base = column.base
        self.table: Any = None
        if isinstance(base, columns_lib.VocabularyListColumn):
            key_dtype = tf.string if base.dtype == "string" else tf.int64
            initializer = tf.lookup.KeyValueTensorInitializer(
                keys=tf.constant(list(base.vocabulary_list), key_dtype),
                values=tf.range(len(base.vocabulary_list), dtype=tf.int64),
            )
            self.table = self._table(
                initializer, base.num_oov_buckets, base.default_value
            )
        elif isinstance(base, columns_lib.VocabularyFileColumn):
            assert base.vocabulary_size is not None
            if not os.path.exists(base.vocabulary_file) or (
                supplied_by_archive(
                    base.vocabulary_file,
                    base.key,
                    base.input_dtype,
                    base.vocabulary_size,
                )
            ):
                # Rebuilt from a `.keras` config: the archive's copy of the
                # file arrives in `load_assets`; a call before that reads
                # the file again (`__call__`).
                return
            self.table = self._file_table(base)

    @classmethod
    def _file_table(cls, base: columns_lib.VocabularyFileColumn) -> Any:
        key_dtype = tf.string if base.dtype == "string" else tf.int64
        initializer = _UnsharedTextFileInitializer(
            filename=base.vocabulary_file,
            key_dtype=key_dtype,
            key_index=tf.lookup.TextFileIndex.WHOLE_LINE,
            value_dtype=tf.int64,
            value_index=tf.lookup.TextFileIndex.LINE_NUMBER,
            vocab_size=base.vocabulary_size,
        )
        default = -1 if base.default_value is None else base.default_value
        return cls._table(initializer, base.num_oov_buckets, default)

    @staticmethod
    def _table(initializer: Any, num_oov_buckets: int, default: int) -> Any:
        # Each table has a name of its own (see `_UnsharedTextFileInitializer`)
        # but is not anonymous: an anonymous table cannot be serialized
        # with a dataset's graph, which is how an input pipeline reaches a
        # pod's hosts (`distribute_dataset`).
        if num_oov_buckets:
            return tf.lookup.StaticVocabularyTable(initializer, num_oov_buckets)
        return tf.lookup.StaticHashTable(initializer, default)

    def __call__(self, values: Tensor) -> Tensor:
        base = self.column.base
        if isinstance(base, columns_lib.IdentityColumn):
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
        if isinstance(base, columns_lib.HashedColumn):
            if values.dtype != tf.string:
                values = tf.strings.as_string(values)
            return tf.strings.to_hash_bucket_fast(values, base.hash_bucket_size)
        if self.table is None:
            # Only a vocabulary-file column rebuilt from a config whose file
            # was missing or invalid gets here: read it again, naming what
            # is wrong, and build the table if it is now valid.
            assert isinstance(base, columns_lib.VocabularyFileColumn)
            assert base.vocabulary_size is not None
            tokens = columns_lib.read_vocabulary_file(
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
                self.table = self._file_table(base)
        if values.dtype.is_integer and values.dtype != tf.int64:
            values = tf.cast(values, tf.int64)
        return self.table.lookup(values)


def bucketized_ids(
    column: columns_lib.BucketizedColumn, raw: Tensor
) -> tf.SparseTensor:
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


def _numbers_per_row(
    column: columns_lib.BucketizedColumn, raw: Tensor
) -> Tensor:
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
    column: columns_lib.CrossedColumn, key: str, declared: str, dtype: Any
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
    column: columns_lib.CrossedColumn, features: dict[str, Tensor]
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
                value = tf.convert_to_tensor(value)
                if value.shape.rank == 1:
                    value = value[:, tf.newaxis]
                if value.shape.rank != 2:
                    raise ValueError(
                        f"Feature '{key}' must be rank 1 `[batch]` or rank 2 "
                        f"`[batch, n]`, got shape {value.shape}."
                    )
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
            inputs.append(bucketized_ids(key, features[key.source_column.key]))
    return tf.sparse.cross_hashed(
        inputs, num_buckets=column.hash_bucket_size, hash_key=column.hash_key
    )


def derived_ids(
    column: columns_lib.CategoricalColumn, features: dict[str, Tensor]
) -> tf.SparseTensor | None:
    """Ids of a bucketized or crossed column; None for other columns."""
    base = column.base
    if isinstance(base, columns_lib.BucketizedColumn):
        return bucketized_ids(base, features[base.source_column.key])
    if isinstance(base, columns_lib.CrossedColumn):
        return crossed_ids(base, features)
    return None
