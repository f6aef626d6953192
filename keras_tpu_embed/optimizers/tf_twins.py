"""From `tf.tpu.experimental.embedding` optimizers to ours.

`EmbeddingConfig` and the layers accept the TF optimizers users already
have; each is converted once to its twin here, every value kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_tpu_embed.optimizers.adagrad import Adagrad
from keras_tpu_embed.optimizers.adagrad import AdagradMomentum
from keras_tpu_embed.optimizers.adam import Adam
from keras_tpu_embed.optimizers.base import EmbeddingOptimizer
from keras_tpu_embed.optimizers.ftrl import FTRL
from keras_tpu_embed.optimizers.sgd import SGD

SUPPORTED_OPTIMIZERS: tuple[type[EmbeddingOptimizer], ...] = (
    SGD,
    Adagrad,
    AdagradMomentum,
    Adam,
    FTRL,
)


def from_tpu(optimizer: Any) -> EmbeddingOptimizer:
    """Our twin of a `tf.tpu.experimental.embedding` optimizer."""
    for ours in SUPPORTED_OPTIMIZERS:
        if type(optimizer) is ours.tpu_twin():
            values: dict[str, Any] = {}
            for field in dataclasses.fields(ours):
                if field.name == "clipvalue":
                    low = optimizer.clip_gradient_min
                    high = optimizer.clip_gradient_max
                    values["clipvalue"] = (
                        None if low is None and high is None else (low, high)
                    )
                else:
                    values[field.name] = getattr(optimizer, field.name)
            return ours(**values)
    raise TypeError(
        "No keras_tpu_embed twin for the TPU optimizer "
        f"{type(optimizer).__name__}; supported: "
        f"{[c.__name__ for c in SUPPORTED_OPTIMIZERS]}."
    )


def get(identifier: Any) -> EmbeddingOptimizer:
    """Accepts one of our optimizers or a `tf.tpu.experimental.embedding` one.

    Raises:
        TypeError: for anything else, naming what was received.
    """
    if isinstance(identifier, EmbeddingOptimizer):
        return identifier
    try:
        return from_tpu(identifier)
    except TypeError:
        pass
    raise TypeError(
        "`optimizer` must be one of kte.optimizers."
        f"{', '.join(c.__name__ for c in SUPPORTED_OPTIMIZERS)} (or their "
        "tf.tpu.experimental.embedding twins). Received: "
        f"{identifier!r} (of type {type(identifier).__name__})"
    )
