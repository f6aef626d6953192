"""Loading saved state with errors that name the file, table and shapes.

Silent wrong answers are the failure mode this module exists for: a table
renamed in a checkpoint restores nothing, and a damaged file may load. Each
loader checks what it can and turns TensorFlow's or Keras' low-level errors
into one `ValueError` that names the file and says what is wrong with it.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

from google.protobuf.message import DecodeError

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.checkpoints import engine_checkpoint

_KEY_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def _damaged(path: str, error: Exception) -> ValueError:
    return ValueError(
        f"{path} is truncated or corrupt and cannot be loaded: "
        f"{type(error).__name__}: {error}"
    )


def restore_tables(
    model_or_layers: Any, path: str, prefix: str = "embedding"
) -> None:
    """Restores every table and slot from a checkpoint, or raises.

    The checkpoint is one written with
    `tf.train.Checkpoint(**{prefix: engine_checkpoint(...)})`, by `save` or
    by `write`, here or by the TPU mid-level API.

    Raises:
        ValueError: a table or slot of the model is missing from the
            checkpoint (renamed, or never saved), has another shape there,
            or the checkpoint is truncated or corrupt. The message names the
            table, the shapes, and the file.
    """
    view = engine_checkpoint(model_or_layers)
    try:
        saved = dict(tf.train.list_variables(path))
    except (tf.errors.OpError, ValueError) as error:
        raise _damaged(path, error) from error
    problems = []
    for name, variable in view.named_variables():
        key = f"{prefix}/{name.replace('/', '.S')}{_KEY_SUFFIX}"
        if key not in saved:
            problems.append(f"table '{name}' is missing")
        elif list(saved[key]) != list(variable.shape):
            problems.append(
                f"table '{name}' has shape {list(saved[key])} in the "
                f"checkpoint but {list(variable.shape)} in the model"
            )
    if problems:
        found = sorted(
            k[len(prefix) + 1 : -len(_KEY_SUFFIX)].replace(".S", "/")
            for k in saved
            if k.startswith(prefix + "/") and k.endswith(_KEY_SUFFIX)
        )
        raise ValueError(
            f"Cannot restore the embedding tables from {path}: "
            + "; ".join(problems)
            + f". The checkpoint holds: {found}."
        )
    # `read`, not `restore`: `restore` also expects the `save_counter` that
    # only `Checkpoint.save` writes, which made good `write` checkpoints
    # look damaged.
    try:
        status = tf.train.Checkpoint(**{prefix: view}).read(path)
    except tf.errors.OpError as error:
        raise _damaged(path, error) from error
    try:
        status.assert_existing_objects_matched()
    except AssertionError as error:
        raise ValueError(
            f"Cannot restore the embedding tables from {path}: {error}"
        ) from error
    status.expect_partial()


def load_model(path: str, **kwargs: Any) -> keras.Model:
    """`keras.models.load_model` that refuses damaged `.keras` files.

    A `.keras` file is a zip archive; its CRCs catch flipped bytes that the
    weights file inside would otherwise load as wrong values.

    Raises:
        ValueError: the file is missing, truncated or corrupt.
    """
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist.")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise _damaged(path, error) from error
    if bad is not None:
        raise ValueError(
            f"{path} is truncated or corrupt: the CRC of its member {bad!r} "
            "does not match."
        )
    return keras.models.load_model(path, **kwargs)


def load_saved_model(path: str) -> Any:
    """`tf.saved_model.load` whose failures on damaged files name the file.

    TensorFlow checks the CRC of every tensor it reads from the variables
    files; a damaged graph fails to parse.

    Raises:
        ValueError: the SavedModel is truncated or corrupt.
    """
    try:
        return tf.saved_model.load(path)
    except (tf.errors.OpError, OSError, ValueError, DecodeError) as error:
        raise _damaged(path, error) from error


def validate_tables(model_or_layer: Any) -> dict[str, list[int]]:
    """Rows holding NaN or inf, per table (only tables that have some).

    Example:

    >>> item = categorical_column_with_identity("item", 4)
    >>> layer = TPUEmbeddingLayer([embedding_column(item, 2)])
    >>> layer.build()
    >>> layer.table_variable("item")[2, 0].assign(float("nan"))
    ... # doctest: +ELLIPSIS
    <...>
    >>> validate_tables(layer)
    {'item': [2]}
    """
    view = engine_checkpoint(model_or_layer)
    report = {}
    for name, variable in view.named_variables():
        if "/" in name:
            continue
        values = tf.convert_to_tensor(variable)
        bad = tf.where(
            tf.reduce_any(tf.logical_not(tf.math.is_finite(values)), axis=1)
        )
        rows = [int(i) for i in bad.numpy().ravel()]
        if rows:
            report[name] = rows
    return report
