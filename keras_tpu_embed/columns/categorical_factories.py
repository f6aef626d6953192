"""The `categorical_column_with_*` family: `tf.feature_column`'s factories.

Each factory has the name, arguments and defaults of its `tf.feature_column`
namesake and returns a spec of `categorical.py`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING
from typing import Any
from typing import Iterable
from typing import TypeVar

from keras_tpu_embed.columns.categorical import HashedColumn
from keras_tpu_embed.columns.categorical import IdentityColumn
from keras_tpu_embed.columns.categorical import VocabularyFileColumn
from keras_tpu_embed.columns.categorical import VocabularyListColumn
from keras_tpu_embed.columns.categorical import WeightedColumn
from keras_tpu_embed.columns.categorical import dtype_name
from keras_tpu_embed.columns.categorical_base import CategoricalColumn
from keras_tpu_embed.columns.vocabulary_files import INTEGER_DTYPES
from keras_tpu_embed.columns.vocabulary_files import check_file_format

if TYPE_CHECKING:
    from keras_tpu_embed.columns.embedding import ColumnSpec


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
    name = dtype_name(dtype, "dtype", key)
    if name in INTEGER_DTYPES:
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
    dtype: Any = "string",
    default_value: int | None = None,
    num_oov_buckets: int = 0,
    file_format: str | None = None,
) -> VocabularyFileColumn:
    """A column mapping values to their line number in `vocabulary_file`.

    The arguments are in the order of TF2's
    `tf.feature_column.categorical_column_with_vocabulary_file`; TF1's
    `tf.compat.v1.feature_column` one puts `num_oov_buckets` and
    `default_value` before `dtype` (pass those by keyword).

    Args:
        key: Name of the feature.
        vocabulary_file: Path of a file with one token per line.
        vocabulary_size: Number of lines to use; all of them when `None`.
        dtype: `"string"` or an integer dtype.
        default_value: Id of out-of-vocabulary values; `None` drops them.
        num_oov_buckets: Hash buckets after the vocabulary for
            out-of-vocabulary values; exclusive with `default_value`.
        file_format: `None` or `"text"`. TF's `"tfrecord_gzip"` (also what
            `None` means for a path ending in `tfrecord.gz`) is refused.

    Returns:
        A `VocabularyFileColumn`.

    Raises:
        ValueError: if the file is missing, empty or malformed (the message
            names the path and line), `vocabulary_size` exceeds it, or the
            file is not a text file.
    """
    path = os.fspath(vocabulary_file) if vocabulary_file else ""
    return VocabularyFileColumn(
        key=key,
        vocabulary_file=path,
        vocabulary_size=vocabulary_size,
        num_oov_buckets=num_oov_buckets,
        default_value=default_value,
        dtype=dtype_name(dtype, "dtype", key),
        file_format=check_file_format(key, path, file_format),
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
        dtype=dtype_name(dtype, "dtype", key),
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
        dtype=dtype_name(dtype, "dtype", weight_feature_key),
    )


_Spec = TypeVar("_Spec", bound=CategoricalColumn)


def as_sequence(column: _Spec) -> _Spec:
    """The sequence form of a categorical spec (same ids, one per step)."""
    sequence: _Spec = dataclasses.replace(  # type: ignore[type-var]
        column, is_sequence=True
    )
    return sequence


def sequence_categorical_column_with_identity(
    key: str, num_buckets: int, default_value: int | None = None
) -> IdentityColumn:
    """Sequence form of `categorical_column_with_identity`."""
    return as_sequence(
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
    return as_sequence(
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
    """Sequence form of `categorical_column_with_vocabulary_file`.

    In the argument order of TF's
    `tf.feature_column.sequence_categorical_column_with_vocabulary_file`,
    which has kept TF1's order and has no `file_format`.
    """
    return as_sequence(
        categorical_column_with_vocabulary_file(
            key,
            vocabulary_file,
            vocabulary_size=vocabulary_size,
            num_oov_buckets=num_oov_buckets,
            default_value=default_value,
            dtype=dtype,
        )
    )


def sequence_categorical_column_with_hash_bucket(
    key: str, hash_bucket_size: int, dtype: Any = "string"
) -> HashedColumn:
    """Sequence form of `categorical_column_with_hash_bucket`."""
    return as_sequence(
        categorical_column_with_hash_bucket(key, hash_bucket_size, dtype)
    )


def input_keys(columns: Iterable[ColumnSpec]) -> list[str]:
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
