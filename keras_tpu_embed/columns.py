"""Categorical column specs: which raw feature becomes which ids.

Each factory has the name, arguments and defaults of its `tf.feature_column`
namesake and returns a frozen dataclass that is validated at construction and
serializes with `keras.saving.serialize_keras_object`. The specs only describe
ids; `preprocessing.py` turns raw values into them and `embedding_columns.py`
puts tables on top.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from typing import Any
from typing import Iterator

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf

_STRING_DTYPES = ("string",)
_INTEGER_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16")


_FROM_ARCHIVE = contextvars.ContextVar("kte_from_archive", default=False)


@contextlib.contextmanager
def vocabulary_files_from_archive() -> Iterator[None]:
    """Columns built inside may name vocabulary files that do not exist.

    Layers rebuilt by `keras.models.load_model` take their vocabulary files
    from the archive's assets after their config (`vocabulary_assets.py`);
    until then such a column keeps the `vocabulary_size` of its config.
    """
    token = _FROM_ARCHIVE.set(True)
    try:
        yield
    finally:
        _FROM_ARCHIVE.reset(token)


def _register(cls: type) -> type:
    return keras.saving.register_keras_serializable(package="keras_tpu_embed")(
        cls
    )


def _dtype_name(dtype: Any, argument: str, key: str) -> str:
    try:
        name = tf.as_dtype(dtype).name
    except TypeError as error:
        raise TypeError(
            f"`{argument}` of column '{key}' must be a TensorFlow dtype. "
            f"Received: {argument}={dtype!r}"
        ) from error
    return name


def _check_key(key: Any) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(
            "`key` must be a non-empty string naming the input feature. "
            f"Received: key={key!r}"
        )


class CategoricalColumn:
    """Base of the categorical specs: a feature key and a number of ids."""

    key: str
    is_sequence: bool

    @property
    def name(self) -> str:
        """The column's name, as `tf.feature_column` names it."""
        return self.key

    @property
    def feature_key(self) -> str:
        """The key of the ids feature in the input dict."""
        return self.key

    # The key of the weights feature; only weighted columns have one.
    weight_feature_key: str | None = None
    # The number of distinct ids, which is the table's row count.
    num_buckets: int

    @property
    def input_dtype(self) -> str:
        """The dtype of the raw feature: `"string"` or an integer dtype."""
        return "int64"

    @property
    def base(self) -> CategoricalColumn:
        """The column that maps raw values to ids (unwraps weighting)."""
        return self

    def get_config(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        return cls(**config)


@_register
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


@_register
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
        _check_oov(self.key, self.num_oov_buckets, self.default_value, -1)
        _check_vocabulary_dtype(self.key, self.dtype)
        want_str = self.dtype in _STRING_DTYPES
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

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["vocabulary_list"] = list(self.vocabulary_list)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        config = dict(config)
        config["vocabulary_list"] = tuple(config["vocabulary_list"])
        return cls(**config)


@_register
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
    is_sequence: bool = False

    def __post_init__(self) -> None:
        _check_key(self.key)
        if not self.vocabulary_file:
            raise ValueError(f"Missing vocabulary_file in {self.key}.")
        _check_vocabulary_dtype(self.key, self.dtype)
        if (
            _FROM_ARCHIVE.get()
            and self.vocabulary_size is not None
            and not os.path.exists(self.vocabulary_file)
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
        _check_oov(self.key, self.num_oov_buckets, self.default_value, None)

    @property
    def num_buckets(self) -> int:
        assert self.vocabulary_size is not None
        return self.vocabulary_size + self.num_oov_buckets

    @property
    def input_dtype(self) -> str:
        return self.dtype


@_register
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
        _check_vocabulary_dtype(self.key, self.dtype)

    @property
    def num_buckets(self) -> int:
        return self.hash_bucket_size

    @property
    def input_dtype(self) -> str:
        return self.dtype


@_register
@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightedColumn(CategoricalColumn):
    """A categorical column whose ids carry weights from another feature."""

    categorical_column: CategoricalColumn
    weight_feature_key: str = dataclasses.field()  # type: ignore[assignment]
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

    def get_config(self) -> dict[str, Any]:
        return {
            "categorical_column": keras.saving.serialize_keras_object(
                self.categorical_column
            ),
            "weight_feature_key": self.weight_feature_key,
            "dtype": self.dtype,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        config = dict(config)
        config["categorical_column"] = keras.saving.deserialize_keras_object(
            config["categorical_column"]
        )
        return cls(**config)


def _check_oov(
    key: str, num_oov_buckets: int, default_value: Any, unset: Any
) -> None:
    if not isinstance(num_oov_buckets, int) or num_oov_buckets < 0:
        raise ValueError(
            f"Invalid num_oov_buckets {num_oov_buckets!r} in {key}: it must "
            "be a non-negative integer."
        )
    if num_oov_buckets and default_value != unset:
        raise ValueError(
            f"Can't specify both num_oov_buckets and default_value in {key}. "
            f"Received: num_oov_buckets={num_oov_buckets}, "
            f"default_value={default_value}"
        )


def _check_vocabulary_dtype(key: str, dtype: str) -> None:
    if dtype not in _STRING_DTYPES + _INTEGER_DTYPES:
        raise ValueError(
            f"`dtype` of column '{key}' must be string or integer. "
            f"Received: dtype={dtype!r}"
        )


def read_vocabulary_file(path: str, key: str, dtype: str) -> list[str]:
    """Reads and validates a vocabulary file: one token per line.

    Raises:
        ValueError: if the file is missing, unreadable, empty, or has a blank
            line, surrounding whitespace, a duplicate token or (for integer
            columns) a token that is not an integer; the message names the
            path and the line number.
    """
    if not tf.io.gfile.exists(path):
        raise ValueError(
            f"vocabulary_file in {key} does not exist: {os.fspath(path)}"
        )
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            raw = handle.read()
    except (OSError, tf.errors.OpError) as error:
        raise ValueError(
            f"vocabulary_file {path} of column '{key}' cannot be read: {error}"
        ) from error
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"vocabulary_file {path} of column '{key}' is not UTF-8 text: "
            f"{error}"
        ) from error
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise ValueError(
            f"vocabulary_file {path} of column '{key}' is empty: it must hold "
            "one token per line."
        )
    seen: dict[str, int] = {}
    for number, token in enumerate(lines, start=1):
        token = token.removesuffix("\r")
        where = f"vocabulary_file {path} of column '{key}', line {number}"
        if token.strip() == "":
            raise ValueError(f"{where} is blank.")
        if token != token.strip():
            raise ValueError(
                f"{where} has leading or trailing whitespace: {token!r}."
            )
        if token in seen:
            raise ValueError(
                f"{where} repeats the token {token!r} of line {seen[token]}."
            )
        if dtype in _INTEGER_DTYPES:
            try:
                int(token)
            except ValueError:
                raise ValueError(
                    f"{where} holds {token!r}, not an integer ({dtype})."
                ) from None
        seen[token] = number
    return list(seen)


def categorical_column_with_identity(
    key: str, num_buckets: int, default_value: int | None = None
) -> IdentityColumn:
    """A column whose integer inputs are already ids in `[0, num_buckets)`.

    Args:
        key: Name of the integer feature.
        num_buckets: Number of ids; inputs must be in `[0, num_buckets)`.
        default_value: Id for inputs `>= num_buckets`. If `None`, such inputs
            raise an error naming the feature. Negative inputs are dropped
            (so `-1` pads dense inputs), as `tf.feature_column` drops them.

    Returns:
        An `IdentityColumn`.

    Example:

    >>> col = categorical_column_with_identity("item_id", num_buckets=100)
    >>> col.name, col.num_buckets
    ('item_id', 100)
    """
    return IdentityColumn(
        key=key, num_buckets=num_buckets, default_value=default_value
    )


def categorical_column_with_vocabulary_list(
    key: str,
    vocabulary_list: Any,
    dtype: Any = None,
    default_value: int = -1,
    num_oov_buckets: int = 0,
) -> VocabularyListColumn:
    """A column mapping values to their index in `vocabulary_list`.

    Args:
        key: Name of the feature.
        vocabulary_list: Ordered, unique tokens (strings or integers).
        dtype: Feature dtype; inferred from the tokens when `None`.
        default_value: Id of out-of-vocabulary values; -1 drops them.
        num_oov_buckets: Hash buckets after the vocabulary for
            out-of-vocabulary values; exclusive with `default_value`.

    Returns:
        A `VocabularyListColumn`.

    Example:

    >>> col = categorical_column_with_vocabulary_list("country", ["us", "fr"],
    ...                                               num_oov_buckets=2)
    >>> col.num_buckets
    4
    """
    tokens = tuple(vocabulary_list) if vocabulary_list is not None else ()
    if dtype is None:
        dtype = "string" if tokens and isinstance(tokens[0], str) else "int64"
    name = _dtype_name(dtype, "dtype", key)
    if name in _INTEGER_DTYPES:
        tokens = tuple(int(t) if not isinstance(t, str) else t for t in tokens)
    return VocabularyListColumn(
        key=key,
        vocabulary_list=tokens,
        dtype=name,
        default_value=default_value,
        num_oov_buckets=num_oov_buckets,
    )


def categorical_column_with_vocabulary_file(
    key: str,
    vocabulary_file: str,
    vocabulary_size: int | None = None,
    num_oov_buckets: int = 0,
    default_value: int | None = None,
    dtype: Any = "string",
) -> VocabularyFileColumn:
    """A column mapping values to their line number in `vocabulary_file`.

    Args:
        key: Name of the feature.
        vocabulary_file: Path of a file with one token per line.
        vocabulary_size: Number of lines to use; all of them when `None`.
        num_oov_buckets: Hash buckets after the vocabulary for
            out-of-vocabulary values; exclusive with `default_value`.
        default_value: Id of out-of-vocabulary values; `None` drops them.
        dtype: `"string"` or an integer dtype.

    Returns:
        A `VocabularyFileColumn`.

    Raises:
        ValueError: if the file is missing, empty or malformed (the message
            names the path and line), or `vocabulary_size` exceeds it.
    """
    return VocabularyFileColumn(
        key=key,
        vocabulary_file=os.fspath(vocabulary_file) if vocabulary_file else "",
        vocabulary_size=vocabulary_size,
        num_oov_buckets=num_oov_buckets,
        default_value=default_value,
        dtype=_dtype_name(dtype, "dtype", key),
    )


def categorical_column_with_hash_bucket(
    key: str, hash_bucket_size: int, dtype: Any = "string"
) -> HashedColumn:
    """A column hashing values into `hash_bucket_size` buckets.

    Example:

    >>> col = categorical_column_with_hash_bucket("tags", 1000)
    >>> col.num_buckets
    1000
    """
    return HashedColumn(
        key=key,
        hash_bucket_size=hash_bucket_size,
        dtype=_dtype_name(dtype, "dtype", key),
    )


def weighted_categorical_column(
    categorical_column: CategoricalColumn,
    weight_feature_key: str,
    dtype: Any = "float32",
) -> WeightedColumn:
    """Weights each id of `categorical_column` by a parallel weight feature.

    The weight feature must have exactly the ids' structure: same shape for
    dense inputs, same row lengths for ragged ones, same indices for sparse.

    Example:

    >>> tags = categorical_column_with_hash_bucket("tags", 1000)
    >>> weighted_categorical_column(tags, "tag_weights").name
    'tags_weighted_by_tag_weights'
    """
    return WeightedColumn(
        categorical_column=categorical_column,
        weight_feature_key=weight_feature_key,
        dtype=_dtype_name(dtype, "dtype", weight_feature_key),
    )


def _as_sequence(column: CategoricalColumn) -> Any:
    return dataclasses.replace(column, is_sequence=True)  # type: ignore


def sequence_categorical_column_with_identity(
    key: str, num_buckets: int, default_value: int | None = None
) -> IdentityColumn:
    """Sequence form of `categorical_column_with_identity`."""
    return _as_sequence(
        categorical_column_with_identity(key, num_buckets, default_value)
    )


def sequence_categorical_column_with_vocabulary_list(
    key: str,
    vocabulary_list: Any,
    dtype: Any = None,
    default_value: int = -1,
    num_oov_buckets: int = 0,
) -> VocabularyListColumn:
    """Sequence form of `categorical_column_with_vocabulary_list`."""
    return _as_sequence(
        categorical_column_with_vocabulary_list(
            key, vocabulary_list, dtype, default_value, num_oov_buckets
        )
    )


def sequence_categorical_column_with_vocabulary_file(
    key: str,
    vocabulary_file: str,
    vocabulary_size: int | None = None,
    num_oov_buckets: int = 0,
    default_value: int | None = None,
    dtype: Any = "string",
) -> VocabularyFileColumn:
    """Sequence form of `categorical_column_with_vocabulary_file`."""
    return _as_sequence(
        categorical_column_with_vocabulary_file(
            key,
            vocabulary_file,
            vocabulary_size,
            num_oov_buckets,
            default_value,
            dtype,
        )
    )


def sequence_categorical_column_with_hash_bucket(
    key: str, hash_bucket_size: int, dtype: Any = "string"
) -> HashedColumn:
    """Sequence form of `categorical_column_with_hash_bucket`."""
    return _as_sequence(
        categorical_column_with_hash_bucket(key, hash_bucket_size, dtype)
    )


def input_keys(columns: Any) -> list[str]:
    """The feature keys `columns` read (ids, then weights), each once.

    Takes categorical or embedding columns: both name their `feature_key`
    and `weight_feature_key`.
    """
    keys = []
    for column in columns:
        keys.append(column.feature_key)
        if column.weight_feature_key:
            keys.append(column.weight_feature_key)
    return list(dict.fromkeys(keys))
