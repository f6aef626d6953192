"""Ids derived from other features: bucketized and crossed columns' own.

The mappings of `derived.py`'s kinds (`BucketizedIds`, `CrossedIds`) and
the functions that compute their ids as TensorFlow does. They read the
specs through the Protocols below, which `derived.py` satisfies (it
imports this module).
"""

from __future__ import annotations

import math
from typing import Any
from typing import Mapping
from typing import Protocol

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns.categorical_base import IdMapping
from keras_tpu_embed.columns.id_mapping import to_sparse
from keras_tpu_embed.placement.ids import as_rank_2
from keras_tpu_embed.placement.ids import check_numeric
from keras_tpu_embed.types import LookupTable
from keras_tpu_embed.types import Tensor


class NumericSource(Protocol):
    """A numeric column (`derived.NumericColumn`)."""

    @property
    def key(self) -> str:
        """The feature key."""

    @property
    def shape(self) -> tuple[int, ...]:
        """Numbers per example, as a shape."""

    @property
    def size(self) -> int:
        """Numbers per example."""


class BucketizedSpec(Protocol):
    """A bucketized column (`derived.BucketizedColumn`)."""

    @property
    def name(self) -> str:
        """The column's name."""

    @property
    def boundaries(self) -> tuple[float, ...]:
        """The bucket boundaries."""

    @property
    def source_column(self) -> NumericSource:
        """The numeric column it buckets."""

    def id_mapping(self) -> IdMapping:
        """Its mapping (`BucketizedIds`)."""


class CrossedSpec(Protocol):
    """A crossed column (`derived.CrossedColumn`)."""

    @property
    def name(self) -> str:
        """The column's name."""

    @property
    def keys(self) -> tuple[str | BucketizedSpec, ...]:
        """Feature keys and bucketized columns."""

    @property
    def key_dtypes(self) -> tuple[str, ...] | None:
        """One dtype per feature key."""

    @property
    def hash_bucket_size(self) -> int:
        """The number of ids."""

    @property
    def hash_key(self) -> int | None:
        """TF's `sparse_cross_hashed` key."""


def bucketized_ids(column: BucketizedSpec, raw: Tensor) -> tf.SparseTensor:
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
    check_numeric(
        f"Feature '{source.key}' of bucketized column '{column.name}'",
        raw.dtype,
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


def _numbers_per_row(column: BucketizedSpec, raw: Tensor) -> Tensor:
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
    column: CrossedSpec, key: str, declared: str, dtype: Any
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
    column: CrossedSpec, features: Mapping[str, Tensor]
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
                value = as_rank_2(key, tf.convert_to_tensor(value))
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

    table: LookupTable | None = None

    def __init__(self, column: BucketizedSpec) -> None:
        self.column = column

    def __call__(self, features: Mapping[str, Tensor]) -> tf.SparseTensor:
        source = self.column.source_column
        return bucketized_ids(self.column, features[source.key])


class CrossedIds:
    """A crossed column's ids, from its keys' features."""

    table: LookupTable | None = None

    def __init__(self, column: CrossedSpec) -> None:
        self.column = column

    def __call__(self, features: Mapping[str, Tensor]) -> tf.SparseTensor:
        return crossed_ids(self.column, features)
