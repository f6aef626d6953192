"""Vocabulary files: reading and validating them, and when they may be absent.

A vocabulary-file column reads its file at construction, so that a missing,
empty or malformed file fails there, naming the path and the line. The one
exception is a column rebuilt by `keras.models.load_model`, whose archive
carries the file (`vocabulary_assets.py`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
from typing import Any
from typing import Iterator

from keras_tpu_embed._compat import tf

STRING_DTYPES = ("string",)
INTEGER_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16")

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


def file_sha256(path: str) -> str:
    """The hex SHA-256 of the file at `path`, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def supplied_by_archive(
    path: str, key: str = "", dtype: str = "string", size: int = 1
) -> bool:
    """Whether `path` will come from the archive being loaded: inside
    `vocabulary_files_from_archive()`, a file that is missing, or is no
    valid vocabulary of `size` lines (shorter, damaged, a directory, or a
    relative path now resolving elsewhere). The archive's copy replaces it
    in `load_assets`; outside an archive load, the preprocessor reads the
    file again when first called and names what is wrong with it.
    """
    if not _FROM_ARCHIVE.get():
        return False
    try:
        return len(read_vocabulary_file(path, key, dtype)) < size
    except ValueError:
        return True


def check_vocabulary_dtype(key: str, dtype: str) -> None:
    if dtype not in STRING_DTYPES + INTEGER_DTYPES:
        raise ValueError(
            f"`dtype` of column '{key}' must be string or integer. "
            f"Received: dtype={dtype!r}"
        )


def read_vocabulary_file(path: str, key: str, dtype: str) -> list[str]:
    """Reads and validates a vocabulary file: one token per line.

    Raises:
        ValueError: if the file is missing, unreadable, empty, starts with
            a byte-order mark, or has a blank line, surrounding whitespace, a
            duplicate token or (for integer columns) a token that is not an
            integer or equals an earlier one as an integer (`7`, `007`); the
            message names the path and the line number.
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
    if text.startswith("\ufeff"):
        # Refused, not stripped: TF's TextFileInitializer (lookup_ops.py)
        # reads the file itself and keeps the mark in the first token, so
        # stripping it here would make the serving table disagree.
        raise ValueError(
            f"vocabulary_file {path} of column '{key}' starts with a UTF-8 "
            "byte-order mark, which TensorFlow would read as part of the "
            "first token. Save the file as UTF-8 without a byte-order mark."
        )
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise ValueError(
            f"vocabulary_file {path} of column '{key}' is empty: it must hold "
            "one token per line."
        )
    seen: dict[str, int] = {}
    # TF parses integer keys, so "7" and "007" are one key to its table.
    seen_integers: dict[int, tuple[str, int]] = {}
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
        if dtype in INTEGER_DTYPES:
            try:
                value = int(token)
            except ValueError:
                raise ValueError(
                    f"{where} holds {token!r}, not an integer ({dtype})."
                ) from None
            if value in seen_integers:
                first, line = seen_integers[value]
                raise ValueError(
                    f"{where} holds {token!r}, the integer {value} of line "
                    f"{line} ({first!r}): TensorFlow would refuse the table "
                    "with 'HashTable has different value for same key'. "
                    "Keep one of them."
                )
            seen_integers[value] = (token, number)
        seen[token] = number
    return list(seen)


def check_file_format(key: str, path: str, file_format: str | None) -> str:
    """Returns the vocabulary's format; only text files are read.

    `tf.feature_column.categorical_column_with_vocabulary_file` (TF2) also
    reads `"tfrecord_gzip"`, and picks it for a path ending in
    `tfrecord.gz` when `file_format` is None (`feature_column_v2.py`,
    `categorical_column_with_vocabulary_file_v2`). Lookups, `.keras` assets
    and serving exports here read one token per text line, so such a file
    is refused rather than misread.
    """
    if file_format is None:
        file_format = (
            "tfrecord_gzip" if path.endswith("tfrecord.gz") else "text"
        )
    if file_format != "text":
        raise ValueError(
            f"Column '{key}' reads its vocabulary {path} with "
            f"file_format={file_format!r}; only file_format='text' (one "
            "token per line) is supported. Write the tokens to a text file, "
            "e.g. with `tf.data.TFRecordDataset(path, 'GZIP')` and one line "
            "per record, and pass that file."
        )
    return file_format


def check_oov(
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
