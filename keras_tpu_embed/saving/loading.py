"""Loading `.keras` files and SavedModels with errors that name the file.

A damaged file must never load as wrong values. Each loader checks what it
can and turns TensorFlow's or Keras' low-level errors into one `ValueError`
that names the file and says what is wrong with it. Checkpoints of tables
are restored by `checkpoints.restore_tables`; what an export records for
these checks is written and read in `saving/export_records.py`.
"""

from __future__ import annotations

import os
import warnings
import zipfile
from typing import Any
from typing import Iterator
from typing import Mapping

import numpy as np
from google.protobuf.message import DecodeError

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.saving.export_records import damaged_file_error
from keras_tpu_embed.saving.export_records import loaded_table_dtype
from keras_tpu_embed.saving.export_records import verify_digests

# What TensorFlow raises on damaged files besides OpError: a truncated
# data file gives IndexError ("Read less bytes than requested"), a
# corrupted graph KeyError or RuntimeError while it is rebuilt.
LOAD_ERRORS = (
    tf.errors.OpError,
    OSError,
    ValueError,
    DecodeError,
    IndexError,
    KeyError,
    RuntimeError,
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


def load_weights(model: keras.Model, path: str, **kwargs: Any) -> None:
    """`model.load_weights(path)` whose failures name the file.

    Keras' HDF5 errors name an object, not the file, and a damaged group
    name only warns that a layer keeps its fresh weights: both become one
    `ValueError` naming the file. HDF5 has no checksums over the values,
    so a flipped byte inside a weight's data loads as a different value;
    a `.keras` file (zip CRCs, `kte.load_model`) detects that.

    Args:
        model: The built model to load into.
        path: A `.weights.h5` file (or anything `load_weights` takes).
        **kwargs: Passed to `model.load_weights`.

    Raises:
        ValueError: the file is missing, truncated or corrupt, or holds
            other tables (see `load_layer_variables`).
    """
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.load_weights(path, **kwargs)
        except LOAD_ERRORS as error:
            raise damaged_file_error(path, error) from error
    for warning in caught:
        message = str(warning.message)
        if "Skipping" in message or "could not be loaded" in message:
            raise ValueError(f"{path} is truncated or corrupt: {message}")
        warnings.warn_explicit(
            warning.message, warning.category, warning.filename, warning.lineno
        )


def load_saved_model(path: str, verify: bool = True) -> Any:
    """`tf.saved_model.load` that refuses damaged or edited exports.

    Every file of the export (graph, variables, vocabulary assets) is
    checked against the SHA-256 that `kte.export_saved_model` recorded in
    `assets.extra/`; TensorFlow itself checks only the CRCs of variable
    values, so an edited vocabulary would load as a different model.

    Every signature of the loaded object (`loaded.signatures[name]`, and
    `serve(**features)` for `serving_default`) converts each feature to
    the dtype of its signature first, so that integer ids of any width
    (int8 to int64, uint8 to uint64 below 2**63, numpy or TensorFlow) and
    integer weights are accepted, and refuses what would change a value
    (float ids, uint64 ids of 2**63 or more), naming the feature: called
    directly, TensorFlow converts numpy float ids to int64 by truncation.
    The exported signature itself takes int64 ids, as TF Serving expects;
    a caller holding only TensorFlow must cast int32 ids to int64 itself.

    Args:
        path: The export's directory.
        verify: Check the recorded digests (hashing every file once). With
            False, an export without them loads, checked by TensorFlow only.

    Returns:
        The loaded SavedModel, with `serve` and `table_dtype` (how its
        tables are stored: "float32", "bfloat16" or "int8").

    Raises:
        ValueError: the SavedModel is truncated, corrupt or edited, or has
            no recorded digests while `verify` is true.
    """
    path = os.fspath(path)
    if verify:
        verify_digests(path)
    try:
        loaded = tf.saved_model.load(path)
    except LOAD_ERRORS as error:
        raise damaged_file_error(path, error) from error
    # TensorFlow converts a signature's arguments to its dtypes itself,
    # silently: numpy float ids are truncated, uint64 ids wrap negative.
    # Every signature of the loaded object checks and converts first.
    loaded.signatures = CheckedSignatures(loaded.signatures)
    if "serving_default" in loaded.signatures:
        loaded.serve = loaded.signatures["serving_default"]
    loaded.table_dtype = loaded_table_dtype(loaded, path)
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
        if name in ("signature", "specs"):
            # Not set yet (copy, unpickling): no recursion through here.
            raise AttributeError(name)
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
        converted = {
            key: _convert_feature(key, value, self.specs[key].dtype)
            for key, value in features.items()
        }
        _check_batch_sizes(converted)
        return dict(self.signature(**converted))


def _check_batch_sizes(features: Mapping[str, Any]) -> None:
    """Raises naming every feature's batch size when they differ."""
    sizes = {key: int(value.shape[0]) for key, value in features.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(
            "Every feature must hold one row per example, but the batch "
            f"sizes differ: {dict(sorted(sizes.items()))}. Give each "
            "feature the same number of rows."
        )


def _as_tensor(key: str, value: Any, dtype: Any) -> Any:
    """`value` as a dense tensor, or an error naming `key` and the fix."""
    if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
        raise TypeError(
            f"Feature '{key}' is a {type(value).__name__}, but the signature "
            "takes dense [batch] or [batch, n] tensors: pad it "
            '(`.to_tensor(...)` / `tf.sparse.to_dense`) with "" for '
            "strings, -1 for ids, 0 for weights."
        )
    if isinstance(value, tf.Tensor):
        return value
    try:
        array = np.asarray(value)
    except ValueError as error:
        raise ValueError(
            f"Feature '{key}' is ragged (rows of different lengths: "
            f"{error}); the signature takes dense [batch] or [batch, n] "
            'values: pad every row to one length with "" for strings, -1 '
            "for ids, 0 for weights."
        ) from None
    if array.size == 0 and array.dtype == np.float64:
        # numpy's dtype for `[]`: no value to change, so the signature's.
        return tf.zeros(array.shape, dtype)
    if array.dtype == object or array.dtype.kind in "US":
        if dtype.is_integer and all(
            isinstance(v, int) and not isinstance(v, bool) for v in array.flat
        ):
            raise ValueError(
                f"Feature '{key}' holds ids outside the int64 range "
                f"[-2**63, 2**63), which the signature's int64 cannot hold."
            )
        return tf.constant(array.astype(object), tf.string)
    if (
        dtype.is_integer
        and array.dtype == np.float64
        and not isinstance(value, np.ndarray)
        and _python_ints(value)
    ):
        # numpy makes a float64 array of Python ints mixing 2**63 and more
        # with negatives: no integer dtype holds them all.
        raise ValueError(
            f"Feature '{key}' holds ids outside the int64 range "
            f"[-2**63, 2**63), which the signature's int64 cannot hold."
        )
    return tf.constant(array)


def _python_ints(value: Any) -> bool:
    """Whether `value` (nested lists) holds only Python ints."""
    if isinstance(value, (list, tuple)):
        return all(_python_ints(item) for item in value)
    return isinstance(value, int) and not isinstance(value, bool)


def _convert_feature(key: str, value: Any, dtype: Any) -> Any:
    tensor = _as_tensor(key, value, dtype)
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
