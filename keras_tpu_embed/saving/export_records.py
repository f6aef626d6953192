"""What an export records beside its graph, and the checks that read it.

`export_saved_model` writes the SHA-256 of every file of the SavedModel
(`write_digests`) and how it stores its tables (`write_export_info`,
`record_table_dtype`); `load_saved_model` checks the first
(`verify_digests`) and reads the second (`loaded_table_dtype`). A record
that cannot be read is a damaged file (`damaged_file_error`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns.vocabulary_files import file_sha256


def damaged_file_error(path: str, error: Exception) -> ValueError:
    return ValueError(
        f"{path} is truncated or corrupt and cannot be loaded: "
        f"{type(error).__name__}: {error}"
    )


DIGESTS_FILE = os.path.join("assets.extra", "keras_tpu_embed_sha256.json")
"""Where an export records the SHA-256 of each of its files.

`assets.extra` is the SavedModel directory for files TensorFlow and TF
Serving do not read themselves.
"""


def write_digests(path: str) -> None:
    """Records the SHA-256 of every file of the SavedModel at `path`.

    TensorFlow checks the CRCs of variable values only: an edited
    vocabulary asset, or a flipped byte in `saved_model.pb` that still
    parses (a constant, a vocabulary list), loads as a different model.
    """
    files = {}
    for folder, _, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            relative = os.path.relpath(full, path).replace(os.sep, "/")
            files[relative] = file_sha256(full)
    manifest = os.path.join(path, DIGESTS_FILE)
    os.makedirs(os.path.dirname(manifest), exist_ok=True)
    with open(manifest, "w") as handle:
        json.dump({"format": 1, "sha256": files}, handle, sort_keys=True)


EXPORT_FILE = os.path.join("assets.extra", "keras_tpu_embed_export.json")
"""How an export stores its tables (`table_dtype`), for `load_saved_model`."""


def write_export_info(path: str, table_dtype: str) -> None:
    """Records how the export at `path` stores its tables."""
    info = os.path.join(path, EXPORT_FILE)
    os.makedirs(os.path.dirname(info), exist_ok=True)
    with open(info, "w") as handle:
        json.dump({"format": 1, "table_dtype": table_dtype}, handle)


TABLE_DTYPE_ATTRIBUTE = "keras_tpu_embed_table_dtype"
"""The SavedModel object's function returning its `table_dtype`."""


def record_table_dtype(root: Any, table_dtype: str) -> None:
    """Stores `table_dtype` in the SavedModel object itself.

    `assets.extra/` is not part of the object: a loaded export re-saved
    with `tf.saved_model.save` loses it, and would then read as float32.
    A function of the object travels with every re-save (a function, not
    a variable: the export's variables stay exactly the tables and dense
    weights the signatures read).
    """
    setattr(
        root,
        TABLE_DTYPE_ATTRIBUTE,
        tf.function(lambda: tf.constant(table_dtype), input_signature=[]),
    )


def loaded_table_dtype(loaded: Any, path: str) -> str:
    """The `table_dtype` of the export at `path`, loaded as `loaded`: the
    object's own record, else `assets.extra/`, else "float32" (exports
    that predate both records stored float32 tables).

    Raises:
        ValueError: the two records disagree, or the file is unreadable.
    """
    recorded = read_table_dtype(path)
    function = getattr(loaded, TABLE_DTYPE_ATTRIBUTE, None)
    if function is None:
        return recorded
    held = function().numpy().decode("utf-8")
    if os.path.exists(os.path.join(path, EXPORT_FILE)) and held != recorded:
        raise ValueError(
            f"The SavedModel {path} records table_dtype='{held}' in its "
            f"object but '{recorded}' in {EXPORT_FILE}: the export was "
            "altered. Export the model again."
        )
    return str(held)


def read_table_dtype(path: str) -> str:
    """The `table_dtype` an export recorded; "float32" for exports that
    predate the record (their tables are float32).

    Raises:
        ValueError: the record exists but cannot be read.
    """
    info = os.path.join(path, EXPORT_FILE)
    if not os.path.exists(info):
        return "float32"
    try:
        with open(info) as handle:
            return str(json.load(handle)["table_dtype"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise damaged_file_error(info, error) from error


def verify_digests(path: str) -> None:
    """Checks every file of an export against the digests it recorded.

    Raises:
        ValueError: the record is missing or unreadable, or a file it lists
            is missing or changed; the message names the file.
    """
    manifest = os.path.join(path, DIGESTS_FILE)
    if not os.path.exists(manifest):
        raise ValueError(
            f"{path} has no {DIGESTS_FILE}: it was not written by "
            "kte.export_saved_model (or the record was removed), so its "
            "files cannot be verified. Re-export it, or pass verify=False "
            "to load it unverified."
        )
    try:
        with open(manifest) as handle:
            files = json.load(handle)["sha256"]
        listed = {str(name): str(digest) for name, digest in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise damaged_file_error(manifest, error) from error
    for name, digest in sorted(listed.items()):
        full = os.path.join(path, *name.split("/"))
        if not os.path.exists(full):
            raise ValueError(f"{full} is missing from the export.")
        if file_sha256(full) != digest:
            raise ValueError(
                f"{full} is truncated or corrupt, or was edited since "
                "export: its SHA-256 differs from the one recorded in "
                f"{DIGESTS_FILE}. Re-export the model."
            )
