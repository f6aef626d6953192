"""Adagrad and Adagrad with momentum, as the TPU embedding engine runs them."""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import ClassVar
from typing import Mapping

from keras_tpu_embed._compat import tf
from keras_tpu_embed.optimizers.base import EmbeddingOptimizer
from keras_tpu_embed.optimizers.base import SlotSpec
from keras_tpu_embed.optimizers.base import check_number
from keras_tpu_embed.optimizers.base import check_positive
from keras_tpu_embed.optimizers.base import check_range
from keras_tpu_embed.serialization import serializable
from keras_tpu_embed.types import Tensor


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class Adagrad(EmbeddingOptimizer):
    """Adagrad: `a += g**2; w -= lr * g / sqrt(a)`, no epsilon.

    Args:
        initial_accumulator_value: Starting value of the `accumulators` slot;
            must be > 0 (the update divides by its square root).
        learning_rate, use_gradient_accumulation, clip_weight_min,
            clip_weight_max, weight_decay_factor,
            multiply_weight_decay_factor_by_learning_rate, clipvalue: As
            `EmbeddingOptimizer`; TF's defaults.

    Example:

    >>> opt = Adagrad(learning_rate=0.05, initial_accumulator_value=0.1)
    >>> opt.to_tpu().initial_accumulator_value
    0.1
    """

    zero_gradient_is_noop: ClassVar[bool] = True

    learning_rate: float | Callable[[], float] = dataclasses.field(
        default=0.001, kw_only=False
    )
    initial_accumulator_value: float = 0.1

    SLOTS: ClassVar[tuple[SlotSpec, ...]] = (
        SlotSpec("accumulators", "initial_accumulator_value"),
    )

    @classmethod
    def tpu_twin(cls) -> Any:
        return tf.tpu.experimental.embedding.Adagrad

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(
            "Adagrad",
            "initial_accumulator_value",
            self.initial_accumulator_value,
        )

    def update(
        self,
        rows: Tensor,
        slots: Mapping[str, Tensor],
        gradient: Tensor,
        learning_rate: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        accumulator = slots["accumulators"] + gradient * gradient
        rows = rows - learning_rate * gradient * tf.math.rsqrt(accumulator)
        return rows, {"accumulators": accumulator}


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class AdagradMomentum(EmbeddingOptimizer):
    """Adagrad with momentum, as the engine computes it.

    With `a` the accumulator and `m` the momentum (both start at 0):

        a = a + g**2 if beta2 == 1 else beta2 * a + (1 - beta2) * g**2
        s = g * (a + epsilon) ** (-1 / exponent)
        m = momentum * m + s
        w -= lr * (momentum * m + s if use_nesterov else m)

    Args:
        momentum: Moving-average parameter of the momentum slot.
        use_nesterov: Use the Nesterov variant.
        exponent: Exponent of the accumulator, > 0.
        beta2: Moving-average parameter of the accumulator (1: a plain sum).
        epsilon: Offset added to the accumulator before the power, > 0.
        learning_rate, use_gradient_accumulation, clip_weight_min,
            clip_weight_max, weight_decay_factor,
            multiply_weight_decay_factor_by_learning_rate, clipvalue: As
            `EmbeddingOptimizer`; TF's defaults.

    Example:

    >>> AdagradMomentum(0.1, momentum=0.9).to_tpu().momentum
    0.9
    """

    learning_rate: float | Callable[[], float] = dataclasses.field(
        default=0.001, kw_only=False
    )
    momentum: float = 0.0
    use_nesterov: bool = False
    exponent: float = 2
    beta2: float = 1
    epsilon: float = 1e-10

    SLOTS: ClassVar[tuple[SlotSpec, ...]] = (
        SlotSpec("accumulators", None),
        SlotSpec("momenta", None),
    )

    @classmethod
    def tpu_twin(cls) -> Any:
        return tf.tpu.experimental.embedding.AdagradMomentum

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "AdagradMomentum"
        check_number(owner, "momentum", self.momentum)
        check_positive(owner, "epsilon", self.epsilon)
        check_positive(owner, "exponent", self.exponent)
        check_range(owner, "beta2", self.beta2, 0, 1, high_inclusive=True)

    def update(
        self,
        rows: Tensor,
        slots: Mapping[str, Tensor],
        gradient: Tensor,
        learning_rate: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        squared = gradient * gradient
        if self.beta2 == 1:
            accumulator = slots["accumulators"] + squared
        else:
            accumulator = (
                self.beta2 * slots["accumulators"] + (1 - self.beta2) * squared
            )
        scaled = gradient * tf.pow(
            accumulator + self.epsilon, -1.0 / self.exponent
        )
        momenta = self.momentum * slots["momenta"] + scaled
        step = (
            self.momentum * momenta + scaled if self.use_nesterov else momenta
        )
        return rows - learning_rate * step, {
            "accumulators": accumulator,
            "momenta": momenta,
        }
