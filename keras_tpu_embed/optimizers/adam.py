"""Adam, as the TPU embedding engine runs it (no bias correction)."""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import ClassVar
from typing import Mapping

from keras_tpu_embed._compat import tf
from keras_tpu_embed.optimizers.base import EmbeddingOptimizer
from keras_tpu_embed.optimizers.base import SlotSpec
from keras_tpu_embed.optimizers.base import check_positive
from keras_tpu_embed.optimizers.base import check_range
from keras_tpu_embed.serialization import serializable
from keras_tpu_embed.types import Tensor


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class Adam(EmbeddingOptimizer):
    """Adam as the engine computes it: no bias correction.

        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g**2
        w -= lr * m / sqrt(v + epsilon**2)      # sum_inside_sqrt=True
        w -= lr * m / (sqrt(v) + epsilon)       # sum_inside_sqrt=False

    For Keras-style bias correction, pass a `learning_rate` callable (or a
    column `learning_rate_fn`) giving `lr * sqrt(1 - beta_2**t) /
    (1 - beta_1**t)`, as the engine's documentation advises.

    Args:
        beta_1: In [0, 1).
        beta_2: In [0, 1).
        epsilon: > 0.
        lazy_adam: Update only the rows in the batch (True, the engine's
            default). With False every row's slots decay and every row moves
            on every step, which costs O(vocabulary) per step off-TPU too.
        sum_inside_sqrt: Which of the two denominators above.
        learning_rate, use_gradient_accumulation, clip_weight_min,
            clip_weight_max, weight_decay_factor,
            multiply_weight_decay_factor_by_learning_rate, clipvalue: As
            `EmbeddingOptimizer`; TF's defaults.

    Example:

    >>> Adam(0.01).to_tpu().sum_inside_sqrt
    True
    """

    learning_rate: float | Callable[[], float] = dataclasses.field(
        default=0.001, kw_only=False
    )
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-07
    lazy_adam: bool = True
    sum_inside_sqrt: bool = True

    SLOTS: ClassVar[tuple[SlotSpec, ...]] = (
        SlotSpec("momenta", None),
        SlotSpec("velocities", None),
    )

    @classmethod
    def tpu_twin(cls) -> Any:
        return tf.tpu.experimental.embedding.Adam

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("Adam", "beta_1", self.beta_1, 0, 1)
        check_range("Adam", "beta_2", self.beta_2, 0, 1)
        check_positive("Adam", "epsilon", self.epsilon)
        if not self.use_gradient_accumulation and not self.lazy_adam:
            raise ValueError(
                "When disabling lazy Adam (`lazy_adam=False`), gradient "
                "accumulation must be used: set `use_gradient_accumulation` "
                "to True."
            )

    def updates_all_rows(self) -> bool:
        return not self.lazy_adam

    def update(
        self,
        rows: Tensor,
        slots: Mapping[str, Tensor],
        gradient: Tensor,
        learning_rate: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        momenta = self.beta_1 * slots["momenta"] + (1 - self.beta_1) * gradient
        velocities = self.beta_2 * slots["velocities"] + (1 - self.beta_2) * (
            gradient * gradient
        )
        if self.sum_inside_sqrt:
            denominator = tf.sqrt(velocities + self.epsilon**2)
        else:
            denominator = tf.sqrt(velocities) + self.epsilon
        return rows - learning_rate * momenta / denominator, {
            "momenta": momenta,
            "velocities": velocities,
        }
