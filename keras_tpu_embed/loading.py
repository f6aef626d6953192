"""Loading `.keras` files and SavedModels with errors that name the file.

A damaged file must never load as wrong values. Each loader checks what it
can and turns TensorFlow's or Keras' low-level errors into one `ValueError`
that names the file and says what is wrong with it. Checkpoints of tables
are restored by `checkpoints.restore_tables`.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any
from typing import Iterator
from typing import Mapping

import numpy as np
from google.protobuf.message import DecodeError

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf


def damaged_file_error(path: str, error: Exception) -> ValueError:
    return ValueError(
        f"{path} is truncated or corrupt and cannot be loaded: "
        f"{type(error).__name__}: {error}"
    )


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
        raise damaged_file_error(path, error) from error
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

    Every signature of the loaded object (`loaded.signatures[name]`, and
    `serve(**features)` for `serving_default`) converts each feature to
    the dtype of its signature first, so that integer ids of any width
    (int8 to int64, uint8 to uint64 below 2**63, numpy or TensorFlow) and
    integer weights are accepted, and refuses what would change a value
    (float ids, uint64 ids of 2**63 or more), naming the feature: called
    directly, TensorFlow converts numpy float ids to int64 by truncation.
    The exported signature itself takes int64 ids, as TF Serving expects;
    a caller holding only TensorFlow must cast int32 ids to int64 itself.

    Returns:
        The loaded SavedModel, with `serve`.

    Raises:
        ValueError: the SavedModel is truncated or corrupt.
    """
    try:
        loaded = tf.saved_model.load(path)
    except (tf.errors.OpError, OSError, ValueError, DecodeError) as error:
        raise damaged_file_error(path, error) from error
    # TensorFlow converts a signature's arguments to its dtypes itself,
    # silently: numpy float ids are truncated, uint64 ids wrap negative.
    # Every signature of the loaded object checks and converts first.
    loaded.signatures = CheckedSignatures(loaded.signatures)
    if "serving_default" in loaded.signatures:
        loaded.serve = loaded.signatures["serving_default"]
    return loaded


class CheckedSignatures(Mapping[str, "SignatureCaller"]):
    """A SavedModel's signatures, each called through `SignatureCaller`."""

    def __init__(self, signatures: Mapping[str, Any]) -> None:
        self._callers = {
            name: SignatureCaller(signature)
            for name, signature in signatures.items()
        }

    def __getitem__(self, name: str) -> SignatureCaller:
        return self._callers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._callers)

    def __len__(self) -> int:
        return len(self._callers)


class SignatureCaller:
    """Calls a signature after converting each feature to its dtype.

    Ids are cast from any integer width to the signature's int64, weights
    from integers to float32. What cannot be converted without changing a
    value is refused, naming the feature: float or boolean ids, uint64 ids
    of 2**63 or more, features of rank other than 1 or 2.
    """

    def __init__(self, signature: Any) -> None:
        self.signature = signature
        self.specs: dict[str, Any] = dict(
            signature.structured_input_signature[1]
        )

    def __getattr__(self, name: str) -> Any:
        # The concrete function's own attributes (`structured_outputs`,
        # `structured_input_signature`, ...) stay readable.
        return getattr(self.signature, name)

    def __call__(self, **features: Any) -> dict[str, Any]:
        missing = sorted(set(self.specs) - set(features))
        if missing:
            raise KeyError(
                f"Missing feature '{missing[0]}'. Expected keys: "
                f"{sorted(self.specs)}. Received keys: {sorted(features)}."
            )
        unknown = sorted(set(features) - set(self.specs))
        if unknown:
            raise KeyError(
                f"Unknown features {unknown}: the signature takes "
                f"{sorted(self.specs)}."
            )
        return dict(
            self.signature(
                **{
                    key: _convert_feature(key, value, self.specs[key].dtype)
                    for key, value in features.items()
                }
            )
        )


def _convert_feature(key: str, value: Any, dtype: Any) -> Any:
    if isinstance(value, tf.Tensor):
        tensor = value
    else:
        array = np.asarray(value)
        if array.dtype == object or array.dtype.kind in "US":
            array = array.astype(object)
            tensor = tf.constant(array, tf.string)
        else:
            tensor = tf.constant(array)
    if tensor.shape.rank not in (1, 2):
        raise ValueError(
            f"Feature '{key}' must be [batch] or [batch, n]. Received shape "
            f"{tensor.shape.as_list()}."
        )
    if tensor.dtype == dtype:
        return tensor
    if dtype == tf.string or tensor.dtype == tf.string:
        raise TypeError(
            f"Feature '{key}' must hold {dtype.name} values. Received dtype "
            f"{tensor.dtype.name}."
        )
    if dtype.is_integer:
        if not tensor.dtype.is_integer:
            raise TypeError(
                f"Feature '{key}' holds ids and must be integers. Received "
                f"dtype {tensor.dtype.name}; casting would change ids."
            )
        if tensor.dtype == tf.uint64 and bool(
            tf.reduce_any(tensor > tf.constant(2**63 - 1, tf.uint64))
        ):
            raise ValueError(
                f"Feature '{key}' has uint64 ids of 2**63 or more, which do "
                "not fit the signature's int64."
            )
        return tf.cast(tensor, dtype)
    if not (tensor.dtype.is_integer or tensor.dtype.is_floating):
        raise TypeError(
            f"Feature '{key}' must be numeric. Received dtype "
            f"{tensor.dtype.name}."
        )
    return tf.cast(tensor, dtype)
