"""Stochastic gradient descent, as the TPU embedding engine runs it."""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import ClassVar
from typing import Mapping

from keras_tpu_embed._compat import tf
from keras_tpu_embed.optimizers.base import EmbeddingOptimizer
from keras_tpu_embed.serialization import serializable
from keras_tpu_embed.types import Tensor


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class SGD(EmbeddingOptimizer):
    """Stochastic gradient descent: `w -= lr * g`.

    Args:
        learning_rate, use_gradient_accumulation, clip_weight_min,
            clip_weight_max, weight_decay_factor,
            multiply_weight_decay_factor_by_learning_rate, clipvalue: As
            `EmbeddingOptimizer`; TF's defaults.

    Example:

    >>> opt = SGD(learning_rate=0.1)
    >>> type(opt.to_tpu()).__name__
    'SGD'
    """

    zero_gradient_is_noop: ClassVar[bool] = True

    @classmethod
    def tpu_twin(cls) -> Any:
        return tf.tpu.experimental.embedding.SGD

    def update(
        self,
        rows: Tensor,
        slots: Mapping[str, Tensor],
        gradient: Tensor,
        learning_rate: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return rows - learning_rate * gradient, {}
