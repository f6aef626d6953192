"""Registering the package's classes with Keras serialization, one way.

Every public class that appears in a config (layers, column specs, the
config, optimizers) is registered as `keras_tpu_embed>ClassName`, so that
`get_config` / `from_config`, `serialize_keras_object` and `.keras` files
find it by that name.
"""

from __future__ import annotations

from typing import TypeVar

from keras_tpu_embed._compat import keras

PACKAGE = "keras_tpu_embed"

_Class = TypeVar("_Class", bound=type)


def serializable(cls: _Class) -> _Class:
    """Class decorator: registers `cls` under `keras_tpu_embed>ClassName`."""
    registered: _Class = keras.saving.register_keras_serializable(
        package=PACKAGE
    )(cls)
    return registered
