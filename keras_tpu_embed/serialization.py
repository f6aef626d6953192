"""Registering the package's classes with Keras serialization, one way.

Every public class that appears in a config (layers, column specs, the
config, optimizers) is registered as `keras_tpu_embed>ClassName`, so that
`get_config` / `from_config`, `serialize_keras_object` and `.keras` files
find it by that name.

Keras 3 imports a registered class's module only for its own packages
(keras, keras_hub, keras_cv, keras_nlp; see
`keras/src/saving/serialization_lib.py`, `_retrieve_class_or_fn`), so a
process that never imported this package cannot load its layers from a
`.keras` file, and nothing of ours runs there to help. What we can do is
put the fix where Keras' error shows it: the first key of the configs
of the classes a model file names first (layers, preprocessor), which
Keras prints right after the class name it could not locate.
"""

from __future__ import annotations

from typing import TypeVar

from keras_tpu_embed._compat import keras
from keras_tpu_embed.types import KerasConfig

PACKAGE = "keras_tpu_embed"

_Class = TypeVar("_Class", bound=type)


def serializable(cls: _Class) -> _Class:
    """Class decorator: registers `cls` under `keras_tpu_embed>ClassName`."""
    registered: _Class = keras.saving.register_keras_serializable(
        package=PACKAGE
    )(cls)
    return registered


LOAD_HINT_KEY = "load_with"
LOAD_HINT = (
    "`import keras_tpu_embed` before keras.models.load_model: its layers "
    "register with Keras when the package is imported"
)


def with_load_hint(config: KerasConfig) -> KerasConfig:
    """`config` with the import to add first, for Keras' load error."""
    return {LOAD_HINT_KEY: LOAD_HINT, **config}


def without_load_hint(config: KerasConfig) -> KerasConfig:
    """A copy of `config` without the hint (files without it load too)."""
    config = dict(config)
    config.pop(LOAD_HINT_KEY, None)
    return config
