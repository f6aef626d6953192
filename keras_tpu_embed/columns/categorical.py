"""Categorical column specs: which raw feature becomes which ids.

Frozen dataclasses, validated at construction, that serialize with
`keras.saving.serialize_keras_object`. They only describe ids: the factories
in `categorical_factories.py` build them with `tf.feature_column`'s arguments,
`preprocessing/feature_preprocessor.py` turns raw values into ids, and
`embedding.py` puts tables on top.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import id_mapping as mappings
from keras_tpu_embed.columns.categorical_base import CategoricalColumn
from keras_tpu_embed.columns.categorical_base import IdMapping
from keras_tpu_embed.columns.categorical_base import VocabularyFile
from keras_tpu_embed.columns.vocabulary_files import STRING_DTYPES
from keras_tpu_embed.columns.vocabulary_files import check_file_format
from keras_tpu_embed.columns.vocabulary_files import check_oov
from keras_tpu_embed.columns.vocabulary_files import check_vocabulary_dtype
from keras_tpu_embed.columns.vocabulary_files import read_vocabulary_file
from keras_tpu_embed.columns.vocabulary_files import supplied_by_archive
from keras_tpu_embed.serialization import serializable
from keras_tpu_embed.types import KerasConfig


def dtype_name(dtype: Any, argument: str, key: str) -> str:
    try:
        name = tf.as_dtype(dtype).name
    except TypeError as error:
        raise TypeError(
            f"`{argument}` of column '{key}' must be a TensorFlow dtype. "
            f"Received: {argument}={dtype!r}"
        ) from error
    return str(name)


def _check_key(key: Any) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(
            "`key` must be a non-empty string naming the input feature. "
            f"Received: key={key!r}"
        )


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class IdentityColumn(CategoricalColumn):
    """Ids given directly as integers in `[0, num_buckets)`.

    Built by `categorical_column_with_identity` and
    `sequence_categorical_column_with_identity`.
    """

    key: str
    num_buckets: int
    default_value: int | None = None
    is_sequence: bool = False

    def __post_init__(self) -> None:
        _check_key(self.key)
        if (
            not isinstance(self.num_buckets, int)
            or isinstance(self.num_buckets, bool)
            or self.num_buckets < 1
        ):
            raise ValueError(
                f"`num_buckets` of column '{self.key}' must be a positive "
                f"integer. Received: num_buckets={self.num_buckets!r}"
            )
        if self.default_value is not None and not (
            0 <= self.default_value < self.num_buckets
        ):
            raise ValueError(
                f"`default_value` of column '{self.key}' must be in "
                f"[0, {self.num_buckets}). "
                f"Received: default_value={self.default_value}"
            )

    def id_mapping(self) -> IdMapping:
        return mappings.IdentityIds(self, self.default_value)

    @property
    def out_of_range_id(self) -> int | None:
        return self.default_value


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class VocabularyListColumn(CategoricalColumn):
    """Values mapped to their index in an in-memory vocabulary.

    Out-of-vocabulary values get `default_value` (dropped from lookups when
    it is -1) or, with `num_oov_buckets > 0`, a hash bucket after the
    vocabulary, hashed exactly as `tf.feature_column` hashes them.
    """

    key: str
    vocabulary_list: tuple[Any, ...]
    dtype: str = "string"
    default_value: int = -1
    num_oov_buckets: int = 0
    is_sequence: bool = False

    def __post_init__(self) -> None:
        _check_key(self.key)
        if self.vocabulary_list is None or len(self.vocabulary_list) < 1:
            raise ValueError(
                f"`vocabulary_list` of column '{self.key}' must be non-empty. "
                f"Received: vocabulary_list={self.vocabulary_list!r}"
            )
        seen: set[Any] = set()
        for position, token in enumerate(self.vocabulary_list):
            if token in seen:
                raise ValueError(
                    f"`vocabulary_list` of column '{self.key}' has the "
                    f"duplicate token {token!r} at index {position}."
                )
            seen.add(token)
        check_oov(self.key, self.num_oov_buckets, self.default_value, -1)
        check_vocabulary_dtype(self.key, self.dtype)
        want_str = self.dtype in STRING_DTYPES
        for token in self.vocabulary_list:
            if isinstance(token, str) != want_str:
                raise ValueError(
                    f"`vocabulary_list` of column '{self.key}' must hold "
                    f"{self.dtype} values; found {token!r} "
                    f"(of type {type(token).__name__})."
                )

    @property
    def num_buckets(self) -> int:
        return len(self.vocabulary_list) + self.num_oov_buckets

    @property
    def input_dtype(self) -> str:
        return self.dtype

    def id_mapping(self) -> IdMapping:
        return mappings.VocabularyListIds(
            self, self.vocabulary_list, self.num_oov_buckets, self.default_value
        )

    def vocabulary(self) -> tuple[list[Any], bool] | None:
        return list(self.vocabulary_list), self.dtype in STRING_DTYPES

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["vocabulary_list"] = list(self.vocabulary_list)
        return config

    @classmethod
    def from_config(cls, config: KerasConfig) -> Any:
        config = dict(config)
        config["vocabulary_list"] = tuple(config["vocabulary_list"])
        return cls(**config)


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class VocabularyFileColumn(CategoricalColumn):
    """Values mapped to their line number in a vocabulary file.

    The file is read and validated when the column is built, so a missing,
    empty or malformed file fails there, naming the path and the line. An
    exported SavedModel carries the file as an asset.
    """

    key: str
    vocabulary_file: str
    vocabulary_size: int | None = None
    num_oov_buckets: int = 0
    default_value: int | None = None
    dtype: str = "string"
    file_format: str = "text"
    is_sequence: bool = False

    def __post_init__(self) -> None:
        _check_key(self.key)
        if not self.vocabulary_file:
            raise ValueError(f"Missing vocabulary_file in {self.key}.")
        check_vocabulary_dtype(self.key, self.dtype)
        check_file_format(self.key, self.vocabulary_file, self.file_format)
        if self.vocabulary_size is not None and supplied_by_archive(
            self.vocabulary_file, self.key, self.dtype, self.vocabulary_size
        ):
            return  # the archive's copy replaces the file (load_assets)
        tokens = read_vocabulary_file(
            self.vocabulary_file, self.key, self.dtype
        )
        if self.vocabulary_size is None:
            object.__setattr__(self, "vocabulary_size", len(tokens))
        elif (
            not isinstance(self.vocabulary_size, int)
            or self.vocabulary_size < 1
        ):
            raise ValueError(
                f"`vocabulary_size` of column '{self.key}' must be a positive "
                f"integer. Received: vocabulary_size={self.vocabulary_size!r}"
            )
        elif self.vocabulary_size > len(tokens):
            raise ValueError(
                f"`vocabulary_size` of column '{self.key}' is "
                f"{self.vocabulary_size}, but {self.vocabulary_file} has only "
                f"{len(tokens)} lines."
            )
        check_oov(self.key, self.num_oov_buckets, self.default_value, None)

    @property
    def num_buckets(self) -> int:
        assert self.vocabulary_size is not None
        return self.vocabulary_size + self.num_oov_buckets

    @property
    def input_dtype(self) -> str:
        return self.dtype

    def id_mapping(self) -> IdMapping:
        assert self.vocabulary_size is not None
        return mappings.VocabularyFileIds(
            self,
            self.vocabulary_file,
            self.vocabulary_size,
            self.num_oov_buckets,
            self.default_value,
        )

    def vocabulary(self) -> tuple[list[Any], bool] | None:
        string = self.dtype in STRING_DTYPES
        tokens = read_vocabulary_file(
            self.vocabulary_file, self.key, self.dtype
        )[: self.vocabulary_size]
        return (tokens if string else [int(t) for t in tokens]), string

    def vocabulary_files(self) -> list[VocabularyFile]:
        return [self]

    def with_vocabulary_files(self, moved: dict[str, str]) -> CategoricalColumn:
        target = moved.get(self.vocabulary_file)
        if target is None:
            return self
        return dataclasses.replace(self, vocabulary_file=target)


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class HashedColumn(CategoricalColumn):
    """Values hashed into `hash_bucket_size` buckets.

    Uses `tf.strings.to_hash_bucket_fast`; integers are hashed through their
    decimal string, as `tf.feature_column` does.
    """

    key: str
    hash_bucket_size: int
    dtype: str = "string"
    is_sequence: bool = False

    def __post_init__(self) -> None:
        _check_key(self.key)
        if (
            self.hash_bucket_size is None
            or not isinstance(self.hash_bucket_size, int)
            or self.hash_bucket_size < 1
        ):
            raise ValueError(
                f"`hash_bucket_size` of column '{self.key}' must be at least "
                f"1. Received: hash_bucket_size={self.hash_bucket_size!r}"
            )
        check_vocabulary_dtype(self.key, self.dtype)

    @property
    def num_buckets(self) -> int:
        return self.hash_bucket_size

    @property
    def input_dtype(self) -> str:
        return self.dtype

    def id_mapping(self) -> IdMapping:
        return mappings.HashedIds(self)


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightedColumn(CategoricalColumn):
    """A categorical column whose ids carry weights from another feature."""

    categorical_column: CategoricalColumn
    weight_feature_key: str = dataclasses.field()
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.categorical_column, CategoricalColumn):
            raise TypeError(
                "`categorical_column` must be a categorical column of "
                "keras_tpu_embed. Received: "
                f"{type(self.categorical_column).__name__}"
            )
        if isinstance(self.categorical_column, WeightedColumn):
            raise ValueError(
                f"Column '{self.categorical_column.name}' is already weighted;"
                " it cannot be weighted twice."
            )
        _check_key(self.weight_feature_key)
        if not tf.as_dtype(self.dtype).is_floating:
            raise ValueError(
                f"`dtype` of weighted column '{self.name}' must be a float "
                f"dtype. Received: dtype={self.dtype!r}"
            )

    @property
    def key(self) -> str:  # type: ignore[override]
        return self.categorical_column.key

    @property
    def is_sequence(self) -> bool:  # type: ignore[override]
        return self.categorical_column.is_sequence

    @property
    def name(self) -> str:
        return (
            f"{self.categorical_column.name}_weighted_by_"
            f"{self.weight_feature_key}"
        )

    @property
    def num_buckets(self) -> int:
        return self.categorical_column.num_buckets

    @property
    def input_dtype(self) -> str:
        return self.categorical_column.input_dtype

    @property
    def base(self) -> CategoricalColumn:
        return self.categorical_column

    def id_mapping(self) -> IdMapping:
        return self.categorical_column.id_mapping()

    @property
    def out_of_range_id(self) -> int | None:
        return self.categorical_column.out_of_range_id

    def vocabulary(self) -> tuple[list[Any], bool] | None:
        return self.categorical_column.vocabulary()

    def vocabulary_files(self) -> list[VocabularyFile]:
        return self.categorical_column.vocabulary_files()

    def with_vocabulary_files(self, moved: dict[str, str]) -> CategoricalColumn:
        inner = self.categorical_column.with_vocabulary_files(moved)
        if inner is self.categorical_column:
            return self
        return dataclasses.replace(self, categorical_column=inner)

    def get_config(self) -> dict[str, Any]:
        return {
            "categorical_column": keras.saving.serialize_keras_object(
                self.categorical_column
            ),
            "weight_feature_key": self.weight_feature_key,
            "dtype": self.dtype,
        }

    @classmethod
    def from_config(cls, config: KerasConfig) -> Any:
        config = dict(config)
        config["categorical_column"] = keras.saving.deserialize_keras_object(
            config["categorical_column"]
        )
        return cls(**config)
