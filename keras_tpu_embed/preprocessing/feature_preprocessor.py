"""Host preprocessing: raw feature values to ids and weights.

`FeaturePreprocessor` maps strings or integers (dense, ragged or sparse) to
int64 ids exactly as `tf.feature_column` does — same vocabulary order, same
out-of-vocabulary hashing, same hash buckets — using `tf.lookup` tables, so
it runs inside `tf.data.Dataset.map` and inside an exported serving graph.
Its output is the input of `TPUEmbeddingLayer` / `SharedTPUEmbedding`.
"""

from __future__ import annotations

import warnings
from typing import Any
from typing import Iterable

from keras_tpu_embed import columns as columns_lib
from keras_tpu_embed._compat import caller_stacklevel
from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import EmbeddingColumn
from keras_tpu_embed.columns import SharedEmbeddingColumn
from keras_tpu_embed.columns import to_categorical_column
from keras_tpu_embed.columns import to_embedding_column
from keras_tpu_embed.columns import vocabulary_assets
from keras_tpu_embed.columns.embedding import ColumnLike
from keras_tpu_embed.columns.embedding import ColumnSpec
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.placement.devices import has_tensor_core_width
from keras_tpu_embed.placement.hardware import CLIENT_CPU
from keras_tpu_embed.placement.ids import as_rank_2
from keras_tpu_embed.placement.ids import checked_weights
from keras_tpu_embed.placement.ids import densify
from keras_tpu_embed.placement.ids import width_of
from keras_tpu_embed.serialization import serializable
from keras_tpu_embed.serialization import with_load_hint
from keras_tpu_embed.serialization import without_load_hint
from keras_tpu_embed.types import KerasConfig
from keras_tpu_embed.types import Tensor


def categorical_columns_of(
    columns: Iterable[Any],
) -> list[columns_lib.CategoricalColumn]:
    """The distinct categorical columns under `columns`, one per feature key.

    Accepts embedding columns and categorical columns of this package or of
    `tf.feature_column`.

    Raises:
        ValueError: if two different columns read the same feature key.
    """
    by_key: dict[str, columns_lib.CategoricalColumn] = {}
    for column in columns:
        if isinstance(column, (EmbeddingColumn, SharedEmbeddingColumn)):
            categorical = column.categorical_column
        else:
            try:
                categorical = to_categorical_column(column)
            except TypeError:
                categorical = to_embedding_column(column).categorical_column
        known = by_key.get(categorical.feature_key)
        if known is not None and known.base != categorical.base:
            raise ValueError(
                f"Feature '{categorical.feature_key}' is read by two different "
                f"columns: {known!r} and {categorical!r}. One feature key "
                "must map to ids one way."
            )
        if known is None or categorical.weight_feature_key:
            by_key[categorical.feature_key] = categorical
    return list(by_key.values())


def tensor_core_widths(
    columns: Iterable[Any], engine_falls_back: bool = False
) -> dict[str, int]:
    """Feature keys read only by tensor-core columns, and their widths.

    Args:
        columns: Embedding columns (categorical ones are skipped: their
            lookups are not known).
        engine_falls_back: On a TPU without an embedding engine, columns
            for the engine run on the tensor core too
            (`devices.training_device`); those with a width count here.
    """
    widths: dict[str, int] = {}
    host: set[str] = set()
    for column in columns:
        try:
            column = to_embedding_column(column)
        except TypeError:
            continue  # a categorical column: its lookups are not known here
        falls_back = (
            engine_falls_back
            and column.lookup_device is not LookupDevice.CPU
            and has_tensor_core_width(column)
        )
        if column.lookup_device is LookupDevice.TPU_TENSOR_CORE or falls_back:
            key = column.feature_key
            widths[key] = max(widths.get(key, 0), width_of(column))
        else:
            host.add(column.feature_key)
    return {k: w for k, w in widths.items() if k not in host}


@serializable
class FeaturePreprocessor(keras.layers.Layer):  # type: ignore[misc]
    """Maps raw features to the ids and weights the embedding layers take.

    Runs on the host: inside `tf.data.Dataset.map` for training and inside
    the serving graph of an exported model.

    Args:
        columns: The embedding columns of the layers it feeds (or their
            categorical columns), from this package or `tf.feature_column`.
        **kwargs: Base `keras.layers.Layer` arguments (`name`, ...).

    Input shape:
        A dict keyed by feature key (and weight key): dense `[batch]` or
        `[batch, n]` tensors (multi-valued features padded with `""` or -1),
        ragged `[batch, (n)]` or sparse `[batch, n]` tensors. Other keys are
        ignored, with one warning.

    Output shape:
        A dict: per feature key an int64 `tf.SparseTensor` `[batch, n]` of
        ids; per weight key a float32 `tf.SparseTensor` with the same indices.
        Features read only by `tpu_tensor_core` columns come out dense
        instead, `[batch, width]` padded with -1 (weights with 0), so that
        the device step has static shapes.
        Out-of-vocabulary values without OOV buckets map to -1, which the
        embedding layers skip.

    Raises:
        KeyError: a feature is missing (the message lists the expected keys).
        TypeError: a feature has the wrong dtype for its column.
        ValueError: a feature has rank other than 1 or 2.

    Example:

    >>> country = categorical_column_with_vocabulary_list(
    ...     "country", ["us", "fr", "de"], num_oov_buckets=1)
    >>> pre = FeaturePreprocessor([embedding_column(country, 4)])
    >>> ids = pre({"country": tf.constant([["fr", ""], ["de", "xx"]])})
    >>> tf.sparse.to_dense(ids["country"], default_value=-1).numpy().tolist()
    [[1, -1], [2, 3]]
    """

    def __init__(self, columns: Iterable[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Converted once: TF's column namedtuples cannot go through Keras'
        # attribute tracking (it rebuilds tuples positionally).
        self._columns_arg = [_as_spec(c) for c in columns]
        self.categorical_columns = categorical_columns_of(self._columns_arg)
        self.dense_widths = tensor_core_widths(self._columns_arg)
        # Its lookup tables live on this process's CPU, also when it is
        # made in a strategy's scope: on a pod the scope would place them on
        # a host, and the input pipelines that this process builds and sends
        # to each host as a graph could not reach them.
        with tf.init_scope(), tf.device(CLIENT_CPU):
            self._mappings = [c.id_mapping() for c in self.categorical_columns]
        self._warned_extra_keys = False
        self.built = True

    @property
    def columns(self) -> list[Any]:
        """The columns it was made from (TF's converted to this package's)."""
        return list(self._columns_arg)

    @property
    def lookup_tables(self) -> list[Any]:
        """The `tf.lookup` tables, for tracking in a SavedModel."""
        return [m.table for m in self._mappings if m.table is not None]

    @property
    def expected_keys(self) -> list[str]:
        """The raw feature keys `call` reads (bucketized and crossed
        columns read their source features, not their ids key)."""
        keys = []
        for column in self.categorical_columns:
            keys += list(column.raw_inputs)
            if column.weight_feature_key:
                keys.append(column.weight_feature_key)
        return list(dict.fromkeys(keys))

    def call(self, features: dict[str, Tensor]) -> dict[str, Tensor]:
        if not isinstance(features, dict):
            raise TypeError(
                "FeaturePreprocessor takes a dict of raw features keyed by "
                f"feature key. Received: {type(features).__name__}"
            )
        expected = self.expected_keys
        self._warn_extra_keys(features, expected)
        outputs = {}
        for column, mapping in zip(self.categorical_columns, self._mappings):
            key = column.feature_key
            raws = {k: _fetch(features, k, expected) for k in column.raw_inputs}
            outputs[key] = mapping(raws)
            weight_key = column.weight_feature_key
            if weight_key:
                outputs[weight_key] = _weights_like(
                    weight_key,
                    _fetch(features, weight_key, expected),
                    key,
                    raws[key],
                    outputs[key],
                )
            width = self.dense_widths.get(key)
            if width is not None:
                # Tensor-core features leave the host dense and padded, so
                # that the device step has static shapes.
                outputs[key] = densify(outputs[key], width, -1)
                if weight_key:
                    outputs[weight_key] = densify(
                        outputs[weight_key], width, 0.0
                    )
        return outputs

    def _warn_extra_keys(
        self, features: dict[str, Tensor], expected: list[str]
    ) -> None:
        extra = sorted(set(features) - set(expected))
        if extra and not self._warned_extra_keys:
            self._warned_extra_keys = True
            warnings.warn(
                f"FeaturePreprocessor ignores features {extra}: no column "
                f"reads them (expected keys: {expected}).",
                stacklevel=caller_stacklevel(),
            )

    def keras_inputs(self) -> dict[str, Any]:
        """`keras.Input`s matching this preprocessor's output, by key.

        Use them to build a functional model around the embedding layers.
        """
        inputs = {}
        for key, (shape, dtype, sparse) in self._output_specs().items():
            inputs[key] = keras.Input(
                shape=shape, sparse=sparse, dtype=dtype, name=key
            )
        return inputs

    def _output_specs(self) -> dict[str, tuple[tuple[Any, ...], str, bool]]:
        """Per output key: shape without batch, dtype, sparse or dense."""
        specs = {}
        for column in self.categorical_columns:
            key = column.feature_key
            width = self.dense_widths.get(key)
            shape = (None,) if width is None else (width,)
            specs[key] = (shape, "int64", width is None)
            if column.weight_feature_key:
                specs[column.weight_feature_key] = (
                    shape,
                    "float32",
                    width is None,
                )
        return specs

    def compute_output_spec(self, features: Any) -> dict[str, Any]:
        return {
            key: keras.KerasTensor(
                (None, *shape), dtype=dtype, sparse=sparse, name=key
            )
            for key, (shape, dtype, sparse) in self._output_specs().items()
        }

    def get_config(self) -> dict[str, Any]:
        config: KerasConfig = super().get_config()
        config["columns"] = [
            keras.saving.serialize_keras_object(c) for c in self._columns_arg
        ]
        return with_load_hint(config)

    @classmethod
    def from_config(cls, config: KerasConfig) -> FeaturePreprocessor:
        config = without_load_hint(config)
        with columns_lib.vocabulary_files_from_archive():
            config["columns"] = [
                keras.saving.deserialize_keras_object(c)
                for c in config["columns"]
            ]
            # Inside too: the lookup tables of files the archive replaces
            # wait for `load_assets`.
            return cls(**config)

    def save_assets(self, dir_path: str) -> None:
        """Copies the vocabulary files into a `.keras` archive."""
        vocabulary_assets.save_vocabularies(self._columns_arg, dir_path)

    def load_assets(self, dir_path: str) -> None:
        """Rebuilds the lookup tables from the archive's vocabularies."""
        self._columns_arg = vocabulary_assets.load_vocabularies(
            self._columns_arg, dir_path
        )
        self.categorical_columns = categorical_columns_of(self._columns_arg)
        # Its lookup tables live on this process's CPU, also when it is
        # made in a strategy's scope: on a pod the scope would place them on
        # a host, and the input pipelines that this process builds and sends
        # to each host as a graph could not reach them.
        with tf.init_scope(), tf.device(CLIENT_CPU):
            self._mappings = [c.id_mapping() for c in self.categorical_columns]


def _as_spec(column: ColumnLike) -> ColumnSpec:
    """An embedding or categorical column of this package."""
    if isinstance(
        column,
        (EmbeddingColumn, SharedEmbeddingColumn, columns_lib.CategoricalColumn),
    ):
        return column
    try:
        return to_categorical_column(column)
    except TypeError:
        return to_embedding_column(column)


def _fetch(features: dict[str, Tensor], key: str, expected: list[str]) -> Any:
    if key not in features:
        raise KeyError(
            f"Missing feature '{key}'. Expected keys: {expected}. "
            f"Received keys: {sorted(features)}."
        )
    return features[key]


def _weights_like(
    weight_key: str,
    weights: Tensor,
    key: str,
    raw_ids: Tensor,
    ids: tf.SparseTensor,
) -> tf.SparseTensor:
    """Weights as a SparseTensor with exactly the ids' indices."""
    if isinstance(weights, tf.SparseTensor):
        weights = as_rank_2(weight_key, weights)
        check = tf.debugging.assert_equal(
            weights.indices,
            ids.indices,
            message=(
                f"Weight feature '{weight_key}' must have exactly the indices "
                "of its ids."
            ),
        )
        with tf.control_dependencies([check]):
            values = tf.identity(weights.values)
    elif isinstance(weights, tf.RaggedTensor):
        if not isinstance(raw_ids, tf.RaggedTensor):
            raise TypeError(
                f"Weight feature '{weight_key}' is ragged but its ids are not."
            )
        check = tf.debugging.assert_equal(
            weights.row_splits,
            raw_ids.row_splits,
            message=(
                f"Weight feature '{weight_key}' must have exactly the row "
                "lengths of its ids."
            ),
        )
        with tf.control_dependencies([check]):
            values = tf.identity(weights.flat_values)
    else:
        weights = as_rank_2(weight_key, tf.convert_to_tensor(weights))
        raw = as_rank_2(key, tf.convert_to_tensor(raw_ids))
        check = tf.debugging.assert_equal(
            tf.shape(weights),
            tf.shape(raw),
            message=(
                f"Weight feature '{weight_key}' must have exactly the shape "
                "of its ids."
            ),
        )
        with tf.control_dependencies([check]):
            values = tf.gather_nd(weights, ids.indices)
    values = checked_weights(weight_key, values)
    return tf.SparseTensor(ids.indices, values, ids.dense_shape)


def make_parse_example_spec(columns: Iterable[Any]) -> dict[str, Any]:
    """The `tf.io.parse_example` spec for the raw features of `columns`.

    Every feature and weight feature is a `tf.io.VarLenFeature`, as
    `tf.feature_column.make_parse_example_spec` gives for categorical columns
    (string for a crossed column's keys unless it declares `key_dtypes`);
    the numeric source of a bucketized column is a `tf.io.FixedLenFeature`
    of its shape and default, as TF's `numeric_column` gives, of the dtype
    a `tf.train.Example` holds (float32, or int64 for integer columns).

    Example:

    >>> tags = weighted_categorical_column(
    ...     categorical_column_with_hash_bucket("tags", 100), "tag_weights")
    >>> sorted(make_parse_example_spec([embedding_column(tags, 4)]))
    ['tag_weights', 'tags']
    """
    spec: dict[str, tf.io.VarLenFeature | tf.io.FixedLenFeature] = {}
    for column in categorical_columns_of(columns):
        numeric = column.base.numeric_sources
        for key, dtype_name in column.raw_inputs.items():
            if key in numeric:
                # TF's `NumericColumn.parse_example_spec`.
                source = numeric[key]
                spec[key] = tf.io.FixedLenFeature(
                    source.shape,
                    _example_dtype(source.dtype),
                    source.default_value,
                )
                continue
            dtype = tf.string if dtype_name == "string" else tf.int64
            spec[key] = tf.io.VarLenFeature(dtype)
        if column.weight_feature_key:
            spec[column.weight_feature_key] = tf.io.VarLenFeature(
                _example_dtype(getattr(column, "dtype", "float32"))
            )
    return spec


def _example_dtype(dtype: Any) -> Any:
    """The dtype `tf.io.parse_example` reads a numeric feature as.

    A `tf.train.Example` holds only 32-bit floats, int64 and bytes, and
    `parse_example` refuses any other dtype (float64: "dense_defaults"),
    so a float64 column reads its float32 values as float32 (exactly what
    the Example holds; the preprocessor casts numbers to float32 anyway).
    """
    return tf.float32 if tf.as_dtype(dtype).is_floating else tf.int64
