"""Vocabulary files that travel inside `.keras` archives.

A vocabulary-file column names a file on disk. Keras' `StringLookup` keeps
its vocabulary in the archive's assets (`save_assets` / `load_assets`); the
layers of this package do the same, so a `.keras` file loads with the
original file gone or changed:

- `save_assets` copies every vocabulary file the layer's columns name into
  the archive, with a manifest (`vocabularies.json`) of where each came from,
  its line count and its SHA-256;
- `keras.models.load_model` rebuilds the layer from its config first.
  Inside `vocabulary_files_from_archive()`, a column whose file is missing
  is accepted with the `vocabulary_size` its config recorded (the table's
  row count), and reads nothing;
- `load_assets` then extracts each vocabulary to a directory that lives as
  long as the process and points the columns at it, after checking its
  digest against the manifest.

A column still pointing at a missing file after all this fails where its
tokens are needed (the preprocessor), naming the file.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import tempfile
from typing import TYPE_CHECKING
from typing import Sequence
from typing import TypeVar
from typing import cast

from keras_tpu_embed.columns.categorical_base import CategoricalColumn
from keras_tpu_embed.columns.categorical_base import VocabularyFile
from keras_tpu_embed.columns.vocabulary_files import file_sha256

if TYPE_CHECKING:
    from keras_tpu_embed.columns.embedding import ColumnSpec

SpecT = TypeVar("SpecT", bound="ColumnSpec")

MANIFEST = "vocabularies.json"

_EXTRACTED: list[str] = []


def vocabulary_file_columns(
    columns: Sequence[ColumnSpec],
) -> list[VocabularyFile]:
    """The `VocabularyFileColumn`s under `columns`, one per file path.

    Takes categorical and embedding columns (their categorical column).
    """
    found: dict[str, VocabularyFile] = {}
    for column in columns:
        for reader in _categorical(column).vocabulary_files():
            found.setdefault(reader.vocabulary_file, reader)
    return list(found.values())


def _categorical(column: ColumnSpec) -> CategoricalColumn:
    """A categorical column, or an embedding column's categorical column."""
    if isinstance(column, CategoricalColumn):
        return column
    categorical: CategoricalColumn = column.categorical_column
    return categorical


def save_vocabularies(columns: Sequence[ColumnSpec], directory: str) -> None:
    """Copies the vocabulary files of `columns` into `directory`."""
    manifest = {}
    for index, column in enumerate(vocabulary_file_columns(columns)):
        source = column.vocabulary_file
        if not os.path.exists(source):
            raise ValueError(
                f"Cannot save the vocabulary of column '{column.key}': "
                f"{source} does not exist. Restore the file (or load the "
                "model from a .keras archive that carries it) before saving."
            )
        asset = f"vocabulary_{index}.txt"
        shutil.copyfile(source, os.path.join(directory, asset))
        manifest[source] = {
            "asset": asset,
            "column": column.key,
            "vocabulary_size": column.vocabulary_size,
            "sha256": file_sha256(source),
        }
    with open(os.path.join(directory, MANIFEST), "w") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)


def load_vocabularies(columns: Sequence[SpecT], directory: str) -> list[SpecT]:
    """`columns` pointing at the vocabularies extracted from `directory`.

    Raises:
        ValueError: a vocabulary in the archive does not match its manifest
            (the archive was edited or damaged).
    """
    manifest_path = os.path.join(directory, MANIFEST)
    if not os.path.exists(manifest_path):
        return list(columns)  # saved without vocabulary files
    with open(manifest_path) as handle:
        manifest = json.load(handle)
    moved = {}
    for source, entry in manifest.items():
        asset = os.path.join(directory, entry["asset"])
        if not os.path.exists(asset) or file_sha256(asset) != entry["sha256"]:
            raise ValueError(
                f"The vocabulary of column '{entry['column']}' in this "
                f"archive ({entry['asset']}, saved from {source}) is missing "
                "or does not match its recorded SHA-256: the archive was "
                "edited or damaged."
            )
        target = os.path.join(_extraction_directory(), entry["sha256"])
        if not os.path.exists(target):
            shutil.copyfile(asset, target)
        moved[source] = target
    # Each column keeps its kind: an embedding column stays one, with its
    # categorical column replaced.
    return [
        cast(SpecT, _with_vocabulary_files(column, moved)) for column in columns
    ]


def _with_vocabulary_files(
    column: ColumnSpec, moved: dict[str, str]
) -> ColumnSpec:
    """`column` with its vocabulary file replaced per `moved`, if listed."""
    if isinstance(column, CategoricalColumn):
        return column.with_vocabulary_files(moved)
    replaced = column.categorical_column.with_vocabulary_files(moved)
    if replaced is column.categorical_column:
        return column
    return dataclasses.replace(column, categorical_column=replaced)


def _extraction_directory() -> str:
    """A directory for extracted vocabularies, removed at exit."""
    if not _EXTRACTED:
        path = tempfile.mkdtemp(prefix="keras_tpu_embed_vocabularies_")
        _EXTRACTED.append(path)
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return _EXTRACTED[0]
