"""Embedding column specs: a categorical column plus the table it looks up.

`EmbeddingColumn` has a table of its own, `SharedEmbeddingColumn` shares one
with other features. Frozen dataclasses, validated at construction with the
`ValueError`s of `tf.compat.v1.tpu.experimental.embedding_column`; the
factories that build them are in `embedding_factories.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import warnings
from typing import Any
from typing import TypeAlias
from typing import cast

import numpy as np

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns.categorical_base import CategoricalColumn
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.placement.devices import parse_lookup_device
from keras_tpu_embed.serialization import serializable
from keras_tpu_embed.types import SUPPORTED_COMBINERS
from keras_tpu_embed.types import InitializerLike
from keras_tpu_embed.types import KerasConfig
from keras_tpu_embed.types import LearningRateFn
from keras_tpu_embed.types import TFFeatureColumn


def default_initializer(dimension: int) -> keras.initializers.Initializer:
    """Truncated normal, mean 0, stddev 1/sqrt(dimension), as TF's default."""
    return keras.initializers.TruncatedNormal(
        mean=0.0, stddev=1.0 / math.sqrt(dimension)
    )


def describe(initializer: InitializerLike) -> str:
    """A short name for an initializer in error messages."""
    if isinstance(initializer, functools.partial):
        return f"functools.partial({describe(initializer.func)}, ...)"
    name = getattr(initializer, "__qualname__", None)
    if name is not None:  # a function or lambda
        return f"{name}()"
    kind = type(initializer)
    if getattr(keras.initializers, kind.__name__, None) is kind:
        return f"keras.initializers.{kind.__name__}"
    return f"{kind.__module__}.{kind.__qualname__}"


def _serialize_callable(value: Any, column: str, argument: str) -> Any:
    """`value` as a config holds it, refused (naming the column) where a
    `.keras` file cannot carry it.

    Keras serializes an object by its `get_config` (JSON) and finds its
    class again only among Keras' own and the registered ones; a function
    by name; a lambda by its bytecode and closure, which may hold anything
    (a numpy matrix, another initializer). A `functools.partial` or an
    object without `get_config` is not serializable at all. Refused here,
    at save time, rather than as a bare error of Keras naming no column
    (at save) or no class it can find (at load: TF's
    `tf.constant_initializer` and the other `tf.*_initializer`s).
    """
    if value is None:
        return None
    try:
        config = keras.saving.serialize_keras_object(value)
        if not hasattr(value, "get_config"):
            json.dumps(config)
    except (TypeError, ValueError) as error:
        problem = f"Keras cannot serialize it ({type(error).__name__})"
    else:
        if _loadable(value, config):
            return config
        problem = "Keras could not find its class again to load it"
    raise TypeError(
        f"Column '{column}': its {argument} {describe(value)} cannot be "
        f"saved in a model's config (get_config, model.save to .keras): "
        f"{problem}. Give the column one a .keras file carries (a "
        "keras.initializers object such as keras.initializers.Constant("
        "matrix) for a pretrained table, a class with get_config "
        "registered with keras.saving.register_keras_serializable, or a "
        "named function), or save the weights only (model.save_weights, "
        "tf.train.Checkpoint), which do not store it."
    )


def _loadable(value: Any, config: object) -> bool:
    """Whether Keras finds an object's class again: Keras' own, or one
    registered with `keras.saving.register_keras_serializable`."""
    if not hasattr(value, "get_config") or not isinstance(config, dict):
        return True
    module = str(config.get("module") or "")
    return module.split(".")[0] == "keras" or (
        keras.saving.get_registered_object(config.get("registered_name"))
        is not None
    )


def callable_signature(value: Any) -> Any:
    """What a column's function is, for comparing two columns' tables:
    never saved, and never raising.

    Its Keras config where that is small JSON; an array constant (a
    pretrained matrix) by a digest of its values, not by a JSON list of
    them; anything Keras cannot write as JSON (a `functools.partial`, a
    lambda closing over an array) by identity, so that the columns of one
    `shared_embedding_columns` call, which hold the one object, agree.
    Keras' warning that a lambda is unsafe to save would be noise here (it
    still warns when a model holding one is saved).
    """
    if value is None:
        return None
    array = _array_value(value)
    if array is not None:
        digest = hashlib.sha256(np.ascontiguousarray(array).data).hexdigest()
        return {
            "class_name": type(value).__qualname__,
            "value": {
                "shape": list(array.shape),
                "dtype": str(array.dtype),
                "sha256": digest,
            },
        }
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="The object being serialized includes a `lambda`"
        )
        try:
            config = _without_sharing_ids(
                keras.saving.serialize_keras_object(value)
            )
            json.dumps(config)
            return config
        except (TypeError, ValueError):
            return {"object": f"{type(value).__qualname__} at {id(value):#x}"}


def _without_sharing_ids(value: Any) -> Any:
    """A Keras config without its `shared_object_id`s: Keras numbers the
    objects it meets twice while it saves or loads (an initializer that
    shared columns hold, loaded from a `.keras` file under a strategy),
    which says nothing of what the object is."""
    if isinstance(value, dict):
        return {
            key: _without_sharing_ids(item)
            for key, item in value.items()
            if key != "shared_object_id"
        }
    if isinstance(value, list):
        return [_without_sharing_ids(item) for item in value]
    return value


def _array_value(value: Any) -> np.ndarray | None:
    """The array of a constant initializer holding one (not a scalar)."""
    held = getattr(value, "value", None)
    if held is None or not isinstance(
        value, (keras.initializers.Constant, tf.constant_initializer)
    ):
        return None
    if isinstance(held, tf.Variable) or (
        tf.is_tensor(held) and not hasattr(held, "numpy")
    ):
        return None
    array = np.asarray(held)
    return array if array.ndim > 0 else None


def _deserialize_callable(value: Any) -> Any:
    if value is None:
        return None
    return keras.saving.deserialize_keras_object(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _EmbeddingSpec:
    categorical_column: CategoricalColumn
    dimension: int
    combiner: str = "mean"
    initializer: InitializerLike | None = None
    max_sequence_length: int = 0
    learning_rate_fn: LearningRateFn | None = None
    # A string at the API, validated once into a `LookupDevice`.
    embedding_lookup_device: LookupDevice | str | None = None
    tensor_core_shape: tuple[int | None, int] | None = None
    use_safe_embedding_lookup: bool = True
    # `tf.feature_column.embedding_column`'s `trainable`: False freezes the
    # table (no update, no optimizer slots).
    trainable: bool = True
    # `tf.feature_column.embedding_column`'s `max_norm`: each looked-up row
    # is clipped to this L2 norm before the combiner.
    max_norm: float | None = None
    # `tf.feature_column.embedding_column`'s warm start: the table's initial
    # value is this tensor of this checkpoint (see `tables/table_specs.py`).
    ckpt_to_load_from: str | None = None
    tensor_name_in_ckpt: str | None = None

    def __post_init__(self) -> None:
        column = self.categorical_column
        if not isinstance(column, CategoricalColumn):
            raise TypeError(
                "`categorical_column` must be a categorical column of "
                "keras_tpu_embed, tf.feature_column or "
                "tf.compat.v1.tpu.experimental. Received: "
                f"{type(column).__name__}"
            )
        check_dimension(self.dimension, column.name)
        if self.combiner not in SUPPORTED_COMBINERS:
            raise ValueError(
                "Invalid value for argument `combiner` of column "
                f"'{column.name}'. Expected one of {SUPPORTED_COMBINERS}. "
                f"Received: combiner={self.combiner!r}"
            )
        if self.initializer is not None and not callable(self.initializer):
            raise ValueError(
                "initializer must be callable if specified. Embedding of "
                f"column_name: {column.name}. Received: {self.initializer!r}"
            )
        if self.initializer is None:
            object.__setattr__(
                self, "initializer", default_initializer(self.dimension)
            )
        _check_max_sequence_length(column, self.max_sequence_length)
        if not isinstance(self.trainable, bool):
            raise TypeError(
                f"`trainable` of column '{column.name}' must be True or "
                f"False. Received: trainable={self.trainable!r}"
            )
        if self.max_norm is not None:
            if isinstance(self.max_norm, bool) or not isinstance(
                self.max_norm, (int, float)
            ):
                raise TypeError(
                    f"`max_norm` of column '{column.name}' must be a number "
                    f"or None. Received: max_norm={self.max_norm!r}"
                )
            if not self.max_norm > 0:
                raise ValueError(
                    f"`max_norm` of column '{column.name}' must be > 0 (or "
                    f"None for no clipping). Received: max_norm={self.max_norm}"
                )
            if not math.isfinite(self.max_norm):
                # clip_by_norm computes `rows * max_norm / norm`: NaN or inf.
                raise ValueError(
                    f"`max_norm` of column '{column.name}' must be finite; "
                    "pass max_norm=None for no clipping. Received: "
                    f"max_norm={self.max_norm}"
                )
            object.__setattr__(self, "max_norm", float(self.max_norm))
        _check_checkpoint_pair(
            column.name, self.ckpt_to_load_from, self.tensor_name_in_ckpt
        )
        if self.ckpt_to_load_from is not None:
            object.__setattr__(
                self, "ckpt_to_load_from", os.fspath(self.ckpt_to_load_from)
            )
        if self.learning_rate_fn is not None and not callable(
            self.learning_rate_fn
        ):
            raise ValueError(
                f"`learning_rate_fn` of column '{column.name}' must be a "
                "function of the global step. Received: "
                f"{self.learning_rate_fn!r}"
            )
        device = parse_lookup_device(self.embedding_lookup_device)
        object.__setattr__(self, "embedding_lookup_device", device)
        shape = _check_tensor_core_shape(self.tensor_core_shape, column.name)
        object.__setattr__(self, "tensor_core_shape", shape)
        # Sequence columns are padded to `max_sequence_length` already, so
        # that is their width; TF's own column asks for the shape anyway.
        if (
            device is LookupDevice.TPU_TENSOR_CORE
            and shape is None
            and not column.is_sequence
        ):
            raise ValueError(
                "Using embedding_lookup_device=tpu_tensor_core requires "
                f"tensor_core_shape to be set. Column: {column.name}"
            )

    @property
    def lookup_device(self) -> LookupDevice | None:
        """The column's `embedding_lookup_device` (a `LookupDevice`).

        Parsed once, in `__post_init__`, which stores the `LookupDevice`;
        the field's type also names the strings a caller may pass.
        """
        return cast(LookupDevice | None, self.embedding_lookup_device)

    @property
    def is_sequence(self) -> bool:
        return self.categorical_column.is_sequence

    @property
    def feature_key(self) -> str:
        return self.categorical_column.feature_key

    @property
    def weight_feature_key(self) -> str | None:
        return self.categorical_column.weight_feature_key

    @property
    def vocabulary_size(self) -> int:
        return self.categorical_column.num_buckets

    @property
    def table_name(self) -> str:
        raise NotImplementedError

    def table_signature(self) -> dict[str, Any]:
        """What a table is made of; columns sharing a table must agree."""
        return {
            **_table_fields(self),
            "initializer": callable_signature(self.initializer),
        }

    def agrees_on_table(self, other: _EmbeddingSpec) -> bool:
        """Whether `other`'s `table_signature` is this column's, without
        computing the signature of an initializer both hold (a digest of a
        pretrained matrix reads all of it)."""
        return _table_fields(self) == _table_fields(other) and (
            self.initializer is other.initializer
            or callable_signature(self.initializer)
            == callable_signature(other.initializer)
        )

    def get_config(self) -> dict[str, Any]:
        config = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self)
        }
        config["categorical_column"] = keras.saving.serialize_keras_object(
            self.categorical_column
        )
        name = getattr(self, "name", self.categorical_column.name)
        config["initializer"] = _serialize_callable(
            self.initializer, name, "initializer"
        )
        config["learning_rate_fn"] = _serialize_callable(
            self.learning_rate_fn, name, "learning_rate_fn"
        )
        if self.tensor_core_shape is not None:
            config["tensor_core_shape"] = list(self.tensor_core_shape)
        if self.lookup_device is not None:
            config["embedding_lookup_device"] = self.lookup_device.value
        # The checkpoint gives the table its first value only; a saved model
        # carries the table itself, and reloading it must not need (or read
        # again) a checkpoint that may be gone by then.
        config.pop("ckpt_to_load_from")
        config.pop("tensor_name_in_ckpt")
        return config

    @classmethod
    def from_config(cls, config: KerasConfig) -> Any:
        config = dict(config)
        config["categorical_column"] = keras.saving.deserialize_keras_object(
            config["categorical_column"]
        )
        config["initializer"] = _deserialize_callable(config["initializer"])
        config["learning_rate_fn"] = _deserialize_callable(
            config["learning_rate_fn"]
        )
        return cls(**config)


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddingColumn(_EmbeddingSpec):
    """An embedding column with a table of its own. See `embedding_column`."""

    @property
    def name(self) -> str:
        return f"{self.categorical_column.name}_embedding"

    @property
    def table_name(self) -> str:
        # TF names the table variable after the categorical column.
        return self.categorical_column.name


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class SharedEmbeddingColumn(_EmbeddingSpec):
    """One feature of a shared table. See `shared_embedding_columns`."""

    shared_embedding_collection_name: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.shared_embedding_collection_name:
            raise ValueError(
                "`shared_embedding_collection_name` of a shared column must "
                "name its table; build shared columns with "
                "`shared_embedding_columns`."
            )

    @property
    def name(self) -> str:
        return f"{self.categorical_column.name}_shared_embedding"

    @property
    def table_name(self) -> str:
        return self.shared_embedding_collection_name


AnyEmbeddingColumn = EmbeddingColumn | SharedEmbeddingColumn


def _table_fields(column: _EmbeddingSpec) -> dict[str, Any]:
    """A column's `table_signature` but its initializer."""
    return {
        "vocabulary_size": column.vocabulary_size,
        "dimension": column.dimension,
        "learning_rate_fn": callable_signature(column.learning_rate_fn),
        "trainable": column.trainable,
        "max_norm": column.max_norm,
        "ckpt_to_load_from": column.ckpt_to_load_from,
        "tensor_name_in_ckpt": column.tensor_name_in_ckpt,
    }


# What the public functions take: a column of this package or of
# `tf.feature_column` (converted once, on the way in).
EmbeddingColumnLike: TypeAlias = AnyEmbeddingColumn | TFFeatureColumn
# A column of this package that names its ids: categorical or embedding.
ColumnSpec: TypeAlias = AnyEmbeddingColumn | CategoricalColumn
ColumnLike: TypeAlias = ColumnSpec | TFFeatureColumn


def check_dimension(dimension: Any, name: str) -> None:
    if (
        dimension is None
        or not isinstance(dimension, int)
        or isinstance(dimension, bool)
        or dimension < 1
    ):
        raise ValueError(
            f"Invalid dimension {dimension!r} for column {name}: `dimension` "
            "must be a positive integer."
        )


def _check_checkpoint_pair(
    name: str, checkpoint: Any, tensor_name: Any
) -> None:
    # The rule of `feature_column_v2.embedding_column`.
    if (checkpoint is None) != (tensor_name is None):
        raise ValueError(
            f"Column '{name}' needs both `ckpt_to_load_from` and "
            "`tensor_name_in_ckpt`, or neither. Received: "
            f"ckpt_to_load_from={checkpoint!r}, "
            f"tensor_name_in_ckpt={tensor_name!r}"
        )
    if tensor_name is not None and not isinstance(tensor_name, str):
        raise TypeError(
            f"`tensor_name_in_ckpt` of column '{name}' must be a string. "
            f"Received: {tensor_name!r}"
        )


def _check_max_sequence_length(
    column: CategoricalColumn, max_sequence_length: Any
) -> None:
    if not isinstance(max_sequence_length, int) or max_sequence_length < 0:
        raise ValueError(
            f"max_sequence_length of column {column.name} must be a "
            f"non-negative integer. Got {max_sequence_length!r}."
        )
    if column.is_sequence and max_sequence_length < 1:
        raise ValueError(
            "max_sequence_length must be greater than 0 for sequence columns. "
            f"Got max_sequence_length={max_sequence_length} for sequence "
            f"column {column.name}."
        )
    if not column.is_sequence and max_sequence_length != 0:
        raise ValueError(
            f"Non zero max_seq_length={max_sequence_length} specified for non "
            f"sequence column {column.name}."
        )


def _check_tensor_core_shape(
    shape: Any, name: str
) -> tuple[int | None, int] | None:
    if not shape:
        return None
    if len(shape) != 2:
        raise ValueError(
            f"tensor_core_shape must be size 2. Got {list(shape)} for column "
            f"{name}."
        )
    batch, width = shape
    if (
        batch is not None
        and batch != -1
        and (not isinstance(batch, int) or batch < 1)
    ):
        raise ValueError(
            f"The batch dimension of tensor_core_shape of column {name} must "
            f"be None, -1 or a positive integer. Got {list(shape)}."
        )
    if not isinstance(width, int) or width < 1:
        raise ValueError(
            f"The second dimension of tensor_core_shape of column {name} must "
            f"be a positive integer. Got {list(shape)}."
        )
    return (None if batch in (None, -1) else batch, width)
