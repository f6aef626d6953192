"""Ids derived from other features: bucketized and crossed columns.

`bucketized_column(numeric_column(key, shape), boundaries)` turns each of the
`shape` numbers of a feature into the bucket it falls in, dimension `i`
taking the ids `[i * (len(boundaries) + 1), (i + 1) * (len(boundaries) + 1))`
(`feature_column_v2.py`, `BucketizedColumn._get_sparse_tensors_for_input_
tensor`). `crossed_column(keys, hash_bucket_size, hash_key)` hashes every
combination of the values of its keys (string or integer features, or
bucketized columns) with TensorFlow's own `sparse_cross_hashed`, as
`CrossedColumn.get_sparse_tensors` does, so the ids are TF's. Both read
raw features (`raw_inputs`) other than the ids feature they produce
(`feature_key`); `derived_ids.py` computes the ids.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_feature_column_v2 as fc
from keras_tpu_embed.columns import derived_ids
from keras_tpu_embed.columns.categorical import dtype_name
from keras_tpu_embed.columns.categorical_base import CategoricalColumn
from keras_tpu_embed.columns.categorical_base import IdMapping
from keras_tpu_embed.serialization import serializable
from keras_tpu_embed.types import KerasConfig
from keras_tpu_embed.types import TFFeatureColumn


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class NumericColumn:
    """A dense numeric feature; here only as the source of a bucketized one.

    Built by `numeric_column`; `tf.feature_column.numeric_column` converts.
    """

    key: str
    shape: tuple[int, ...] = (1,)
    default_value: tuple[float, ...] | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(
                "`key` of a numeric column must be a non-empty string. "
                f"Received: key={self.key!r}"
            )
        shape = tuple(int(d) for d in self.shape)
        if not shape or any(d < 1 for d in shape):
            raise ValueError(
                f"`shape` of numeric column '{self.key}' must hold positive "
                f"integers. Received: shape={self.shape!r}"
            )
        object.__setattr__(self, "shape", shape)
        if not tf.as_dtype(self.dtype).is_floating and not (
            tf.as_dtype(self.dtype).is_integer
        ):
            raise ValueError(
                f"`dtype` of numeric column '{self.key}' must be a float or "
                f"integer dtype. Received: dtype={self.dtype!r}"
            )

    @property
    def size(self) -> int:
        """Numbers per example."""
        return math.prod(self.shape)

    def get_config(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: KerasConfig) -> NumericColumn:
        config = dict(config)
        config["shape"] = tuple(config["shape"])
        if config.get("default_value") is not None:
            config["default_value"] = tuple(config["default_value"])
        return cls(**config)


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class BucketizedColumn(CategoricalColumn):
    """Numbers of a numeric feature mapped to the bucket they fall in."""

    source_column: NumericColumn
    boundaries: tuple[float, ...]
    is_sequence: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.source_column, NumericColumn):
            raise TypeError(
                "`source_column` of a bucketized column must be a "
                "numeric_column. Received: "
                f"{type(self.source_column).__name__}"
            )
        boundaries = tuple(float(b) for b in self.boundaries)
        if not boundaries or any(
            a >= b for a, b in zip(boundaries, boundaries[1:])
        ):
            raise ValueError(
                "`boundaries` of bucketized column "
                f"'{self.source_column.key}_bucketized' must be a non-empty, "
                f"strictly increasing list. Received: {self.boundaries!r}"
            )
        object.__setattr__(self, "boundaries", boundaries)

    @property
    def key(self) -> str:  # type: ignore[override]
        return self.source_column.key

    @property
    def name(self) -> str:
        return f"{self.source_column.key}_bucketized"

    @property
    def feature_key(self) -> str:
        # Its own key in the preprocessor's output: the numbers stay raw.
        return self.name

    @property
    def num_buckets(self) -> int:
        return (len(self.boundaries) + 1) * self.source_column.size

    @property
    def input_dtype(self) -> str:
        return self.source_column.dtype

    @property
    def raw_inputs(self) -> dict[str, str]:
        return {self.source_column.key: self.source_column.dtype}

    @property
    def numeric_sources(self) -> dict[str, NumericColumn]:
        return {self.source_column.key: self.source_column}

    def id_mapping(self) -> IdMapping:
        return derived_ids.BucketizedIds(self)

    def get_config(self) -> dict[str, Any]:
        return {
            "source_column": self.source_column.get_config(),
            "boundaries": list(self.boundaries),
        }

    @classmethod
    def from_config(cls, config: KerasConfig) -> BucketizedColumn:
        return cls(
            source_column=NumericColumn.from_config(config["source_column"]),
            boundaries=tuple(config["boundaries"]),
        )


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class CrossedColumn(CategoricalColumn):
    """Every combination of its keys' values, hashed into buckets.

    `keys` are feature keys (of string features unless `key_dtypes` says
    otherwise, as `tf.feature_column.make_parse_example_spec` assumes) or
    bucketized columns.
    """

    keys: tuple[str | BucketizedColumn, ...]
    hash_bucket_size: int
    hash_key: int | None = None
    key_dtypes: tuple[str, ...] | None = None
    is_sequence: bool = False

    def __post_init__(self) -> None:
        keys = tuple(self.keys)
        if len(keys) < 2:
            raise ValueError(
                "`keys` of a crossed column must hold at least 2 keys or "
                f"bucketized columns. Received: keys={self.keys!r}"
            )
        for key in keys:
            if not isinstance(key, (str, BucketizedColumn)):
                raise TypeError(
                    "`keys` of a crossed column must be feature keys or "
                    "bucketized columns (cross other columns by crossing "
                    f"their raw feature keys). Received: {key!r}"
                )
        object.__setattr__(self, "keys", keys)
        if (
            not isinstance(self.hash_bucket_size, int)
            or self.hash_bucket_size < 1
        ):
            raise ValueError(
                f"`hash_bucket_size` of crossed column '{self.name}' must "
                f"be > 1. Received: hash_bucket_size={self.hash_bucket_size!r}"
            )
        strings = [k for k in keys if isinstance(k, str)]
        dtypes = self.key_dtypes
        if dtypes is None:
            dtypes = tuple("string" for _ in strings)
        dtypes = tuple(dtype_name(d, "key_dtypes", self.name) for d in dtypes)
        if len(dtypes) != len(strings):
            raise ValueError(
                f"`key_dtypes` of crossed column '{self.name}' must give one "
                f"dtype per feature key {strings}. Received: {dtypes}"
            )
        object.__setattr__(self, "key_dtypes", dtypes)

    @property
    def key(self) -> str:  # type: ignore[override]
        return self.name

    @property
    def name(self) -> str:
        # TF's name: the sorted leaf names joined by "_X_".
        names = [k if isinstance(k, str) else k.name for k in self.keys]
        return "_X_".join(sorted(names))

    @property
    def num_buckets(self) -> int:
        return self.hash_bucket_size

    @property
    def input_dtype(self) -> str:
        return "int64"

    @property
    def raw_inputs(self) -> dict[str, str]:
        inputs: dict[str, str] = {}
        dtypes = iter(self.key_dtypes or ())
        for key in self.keys:
            if isinstance(key, str):
                inputs[key] = next(dtypes)
            else:
                inputs.update(key.raw_inputs)
        return inputs

    @property
    def numeric_sources(self) -> dict[str, NumericColumn]:
        sources: dict[str, NumericColumn] = {}
        for key in self.keys:
            if not isinstance(key, str):
                sources.update(key.numeric_sources)
        return sources

    @property
    def crossed_padding(self) -> dict[str, Any]:
        pads: dict[str, Any] = {}
        dtypes = iter(self.key_dtypes or ())
        for key in self.keys:
            if isinstance(key, str):
                pads[key] = "" if next(dtypes) == "string" else -1
        return pads

    def id_mapping(self) -> IdMapping:
        return derived_ids.CrossedIds(self)

    def get_config(self) -> dict[str, Any]:
        return {
            "keys": [
                k
                if isinstance(k, str)
                else keras.saving.serialize_keras_object(k)
                for k in self.keys
            ],
            "hash_bucket_size": self.hash_bucket_size,
            "hash_key": self.hash_key,
            "key_dtypes": list(self.key_dtypes or ()),
        }

    @classmethod
    def from_config(cls, config: KerasConfig) -> CrossedColumn:
        return cls(
            keys=tuple(
                k
                if isinstance(k, str)
                else keras.saving.deserialize_keras_object(k)
                for k in config["keys"]
            ),
            hash_bucket_size=config["hash_bucket_size"],
            hash_key=config["hash_key"],
            key_dtypes=tuple(config["key_dtypes"]),
        )


def numeric_column(
    key: str,
    shape: Any = (1,),
    default_value: Any = None,
    dtype: Any = "float32",
    normalizer_fn: Any = None,
) -> NumericColumn:
    """A dense numeric feature, as the source of `bucketized_column`.

    Args:
        key: Name of the feature.
        shape: Numbers per example; an int or a tuple.
        default_value: For `make_parse_example_spec` (missing values).
        dtype: A float or integer dtype.
        normalizer_fn: Must be None: a Python function cannot travel in a
            saved config or serving export. Apply it in the input pipeline.

    Returns:
        A `NumericColumn`.

    Raises:
        ValueError: `normalizer_fn` is given, or a bad shape or dtype.

    Example:

    >>> numeric_column("age").shape
    (1,)
    """
    if normalizer_fn is not None:
        raise ValueError(
            f"numeric_column '{key}' has a normalizer_fn, which this package "
            "does not carry into saved models and serving exports. Apply it "
            "in the input pipeline (tf.data map) and pass normalizer_fn=None."
        )
    if isinstance(shape, int):
        shape = (shape,)
    if default_value is not None:
        flat = tf.nest.flatten(default_value)
        default_value = tuple(float(v) for v in flat)
    return NumericColumn(
        key=key,
        shape=tuple(shape),
        default_value=default_value,
        dtype=dtype_name(dtype, "dtype", key),
    )


def bucketized_column(
    source_column: NumericColumn, boundaries: Any
) -> BucketizedColumn:
    """Ids from the bucket each number of `source_column` falls in.

    Args:
        source_column: A `numeric_column` (ours or `tf.feature_column`'s).
        boundaries: Sorted bucket boundaries; `len(boundaries) + 1` buckets
            per number.

    Returns:
        A `BucketizedColumn` named `<key>_bucketized`, with
        `(len(boundaries) + 1) * size` buckets.

    Example:

    >>> age = bucketized_column(numeric_column("age"), [18, 30, 65])
    >>> age.name, age.num_buckets
    ('age_bucketized', 4)
    """
    return BucketizedColumn(
        source_column=to_numeric_column(source_column),
        boundaries=tuple(boundaries),
    )


def crossed_column(
    keys: Any,
    hash_bucket_size: int,
    hash_key: int | None = None,
    key_dtypes: Any = None,
) -> CrossedColumn:
    """Every combination of the values of `keys`, hashed as TF hashes it.

    Args:
        keys: Feature keys and bucketized columns.
        hash_bucket_size: Number of ids.
        hash_key: TF's `sparse_cross_hashed` key; None for its default.
        key_dtypes: One dtype per feature key in `keys`, for the serving
            signature and the parse spec; all strings when None (as
            `tf.feature_column.make_parse_example_spec` assumes). Integer
            features are hashed as integers, as TF hashes them.

    Returns:
        A `CrossedColumn`.

    Example:

    >>> crossed_column(["country", "lang"], 100).name
    'country_X_lang'
    """
    return CrossedColumn(
        keys=tuple(keys),
        hash_bucket_size=hash_bucket_size,
        hash_key=hash_key,
        key_dtypes=None if key_dtypes is None else tuple(key_dtypes),
    )


def to_numeric_column(
    column: NumericColumn | TFFeatureColumn,
) -> NumericColumn:
    """`column` as our `NumericColumn` (from `tf.feature_column` too)."""
    if isinstance(column, NumericColumn):
        return column
    if isinstance(column, fc.NumericColumn):
        return numeric_column(
            column.key,
            column.shape,
            column.default_value,
            column.dtype,
            column.normalizer_fn,
        )
    raise TypeError(
        "`source_column` of a bucketized column must be a numeric_column. "
        f"Received: {type(column).__name__} {getattr(column, 'name', column)!r}"
    )
