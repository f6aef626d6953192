"""FTRL, as the TPU embedding engine runs it."""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import ClassVar
from typing import Mapping

from keras_tpu_embed._compat import tf
from keras_tpu_embed.optimizers.base import EmbeddingOptimizer
from keras_tpu_embed.optimizers.base import SlotSpec
from keras_tpu_embed.optimizers.base import check_non_negative
from keras_tpu_embed.optimizers.base import check_positive
from keras_tpu_embed.optimizers.base import check_range
from keras_tpu_embed.serialization import serializable
from keras_tpu_embed.types import Tensor


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class FTRL(EmbeddingOptimizer):
    """Follow-the-regularized-leader, with the engine's `beta`.

    With `p(x) = x ** -learning_rate_power`, accumulator `a` and linear `z`:

        a' = a + g**2
        z += g - (p(a') - p(a)) * w / lr
        w = (clip(z, -l1, l1) - z) / ((p(a') + beta) / lr + 2 * l2)

    and with `multiply_linear_by_learning_rate` the linear slot stores
    `z * lr` (`z += lr * g - (p(a') - p(a)) * w`, `l1` scaled by `lr`,
    denominator `p(a') + 2 * lr * l2 + beta`).

    Args:
        learning_rate_power: <= 0; -0.5 is the usual 1/sqrt schedule.
        l1_regularization_strength: >= 0.
        l2_regularization_strength: >= 0.
        beta: >= 0; equivalent to adding `beta / (2 * lr)` to l2.
        initial_accumulator_value: Start of the `accumulators` slot, > 0.
        multiply_linear_by_learning_rate: See above.
        allow_zero_accumulator: Recorded for the engine (whose newest
            release ignores it). With `initial_accumulator_value > 0`, which
            TF requires, the accumulator never reaches zero, so it changes
            nothing here.
        learning_rate, use_gradient_accumulation, clip_weight_min,
            clip_weight_max, weight_decay_factor,
            multiply_weight_decay_factor_by_learning_rate, clipvalue: As
            `EmbeddingOptimizer`; TF's defaults.

    Example:

    >>> FTRL(0.1, l1_regularization_strength=0.01).to_tpu().beta
    0.0
    """

    learning_rate: float | Callable[[], float] = dataclasses.field(
        default=0.001, kw_only=False
    )
    learning_rate_power: float = -0.5
    l1_regularization_strength: float = 0.0
    l2_regularization_strength: float = 0.0
    beta: float = 0.0
    initial_accumulator_value: float = 0.1
    multiply_linear_by_learning_rate: bool = False
    allow_zero_accumulator: bool = False

    SLOTS: ClassVar[tuple[SlotSpec, ...]] = (
        SlotSpec("accumulators", "initial_accumulator_value"),
        SlotSpec("linears", None),
    )

    @classmethod
    def tpu_twin(cls) -> Any:
        return tf.tpu.experimental.embedding.FTRL

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "FTRL"
        check_range(
            owner,
            "learning_rate_power",
            self.learning_rate_power,
            float("-inf"),
            0,
            high_inclusive=True,
        )
        check_non_negative(
            owner, "l1_regularization_strength", self.l1_regularization_strength
        )
        check_non_negative(
            owner, "l2_regularization_strength", self.l2_regularization_strength
        )
        check_non_negative(owner, "beta", self.beta)
        check_positive(
            owner, "initial_accumulator_value", self.initial_accumulator_value
        )

    def update(
        self,
        rows: Tensor,
        slots: Mapping[str, Tensor],
        gradient: Tensor,
        learning_rate: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        power = -self.learning_rate_power
        old = slots["accumulators"]
        new = old + gradient * gradient
        delta = tf.pow(new, power) - tf.pow(old, power)
        l1 = self.l1_regularization_strength
        l2 = self.l2_regularization_strength
        if self.multiply_linear_by_learning_rate:
            linear = slots["linears"] + learning_rate * gradient - delta * rows
            limit = l1 * learning_rate
            denominator = (
                tf.pow(new, power) + 2 * learning_rate * l2 + self.beta
            )
        else:
            linear = slots["linears"] + gradient - delta * rows / learning_rate
            limit = l1
            denominator = (tf.pow(new, power) + self.beta) / learning_rate + (
                2 * l2
            )
        numerator = tf.clip_by_value(linear, -limit, limit) - linear
        return numerator / denominator, {
            "accumulators": new,
            "linears": linear,
        }
