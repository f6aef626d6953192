"""What every embedding optimizer has: parameters, their checks, slots.

Each optimizer of this package is a frozen dataclass that mirrors its
`tf.tpu.experimental.embedding` twin: same parameter names and defaults,
checked at construction with TF's rules, and `to_tpu()` builds the twin.
Its `update` is the engine's rule as tensor math on gathered rows;
`row_update.apply_update` runs one whole step on a table.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import ClassVar
from typing import Mapping
from typing import NamedTuple

from keras_tpu_embed._compat import keras
from keras_tpu_embed.types import KerasConfig
from keras_tpu_embed.types import Tensor


class SlotSpec(NamedTuple):
    """An optimizer slot: its name (as TPUEmbedding names it) and init."""

    name: str
    initial_value_attribute: str | None
    """Attribute of the optimizer holding the initial value; None means 0."""


def check_number(owner: str, argument: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"`{argument}` of {owner} must be a number. "
            f"Received: {argument}={value!r} (of type {type(value).__name__})"
        )


def check_range(
    owner: str,
    argument: str,
    value: Any,
    low: float,
    high: float | None,
    high_inclusive: bool = False,
    low_inclusive: bool = True,
) -> None:
    check_number(owner, argument, value)
    ok_low = value >= low if low_inclusive else value > low
    ok_high = high is None or (
        value <= high if high_inclusive else value < high
    )
    if not (ok_low and ok_high):
        lower = "[" if low_inclusive else "("
        upper = "]" if high_inclusive else ")"
        bound = "inf" if high is None else high
        raise ValueError(
            f"`{argument}` of {owner} must be in {lower}{low}, {bound}{upper}. "
            f"Received: {argument}={value!r}"
        )


def check_positive(owner: str, argument: str, value: Any) -> None:
    check_range(owner, argument, value, 0, None, low_inclusive=False)


def check_non_negative(owner: str, argument: str, value: Any) -> None:
    check_range(owner, argument, value, 0, None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddingOptimizer:
    """Parameters every TPU embedding optimizer has.

    Args:
        learning_rate: A float, or a callable taking no arguments for a
            dynamic rate. A column's `learning_rate_fn` overrides it.
        use_gradient_accumulation: Recorded for the TPU engine, where turning
            it off trades accuracy for speed; off-TPU updates are always
            exact, as with accumulation on.
        clip_weight_min: Lower bound on the weights after an update.
        clip_weight_max: Upper bound on the weights after an update.
        clipvalue: Gradient clip: a positive float `c` for `[-c, c]`, or a
            `(min, max)` tuple whose entries may be `None`.
        weight_decay_factor: Decoupled weight decay applied to the updated
            rows before the optimizer's rule; None disables it.
        multiply_weight_decay_factor_by_learning_rate: Multiply
            `weight_decay_factor` by the current learning rate.
    """

    # Positional, as in tf.tpu.experimental.embedding: `Adagrad(0.05)`.
    learning_rate: float | Callable[[], float] = dataclasses.field(
        default=0.01, kw_only=False
    )
    use_gradient_accumulation: bool = True
    clip_weight_min: float | None = None
    clip_weight_max: float | None = None
    clipvalue: float | tuple[float | None, float | None] | None = None
    weight_decay_factor: float | None = None
    multiply_weight_decay_factor_by_learning_rate: bool | None = None

    SLOTS: ClassVar[tuple[SlotSpec, ...]] = ()
    # Whether the rule moves rows that the batch did not touch.
    updates_untouched_rows: ClassVar[bool] = False
    # Whether the rule leaves a row and its slots as they are when its
    # gradient is zero (before weight decay and weight clipping).
    zero_gradient_is_noop: ClassVar[bool] = False

    @classmethod
    def tpu_twin(cls) -> Any:
        """The `tf.tpu.experimental.embedding` class this one mirrors."""
        raise NotImplementedError

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if not callable(self.learning_rate):
            check_number(owner, "learning_rate", self.learning_rate)
        if (
            self.clip_weight_min is not None
            and self.clip_weight_max is not None
            and self.clip_weight_min > self.clip_weight_max
        ):
            raise ValueError(
                f"`clip_weight_min` of {owner} must not exceed "
                f"`clip_weight_max`. Received: clip_weight_min="
                f"{self.clip_weight_min}, clip_weight_max="
                f"{self.clip_weight_max}"
            )
        if not self.use_gradient_accumulation and self.clipvalue is not None:
            raise ValueError(
                "When `use_gradient_accumulation` is False, gradient clipping "
                "cannot be used and `clipvalue` should be left as None. "
                f"Received: clipvalue={self.clipvalue}"
            )
        if isinstance(self.clipvalue, list):
            object.__setattr__(self, "clipvalue", tuple(self.clipvalue))
        if self.clipvalue is not None and not isinstance(self.clipvalue, tuple):
            check_positive(owner, "clipvalue", self.clipvalue)
            # Stored as TF expands it, so that equal clips compare equal.
            value = float(self.clipvalue)
            object.__setattr__(self, "clipvalue", (-value, value))
        if self.weight_decay_factor is not None:
            check_non_negative(
                owner, "weight_decay_factor", self.weight_decay_factor
            )

    @property
    def gradient_clip_bounds(self) -> tuple[float | None, float | None]:
        """`clipvalue` as `(min, max)`; `(None, None)` when unset."""
        if self.clipvalue is None:
            return (None, None)
        return self.clipvalue  # type: ignore[return-value]

    def slot_initial_value(self, slot: SlotSpec) -> float:
        if slot.initial_value_attribute is None:
            return 0.0
        return float(getattr(self, slot.initial_value_attribute))

    def current_learning_rate(self) -> Tensor:
        rate = self.learning_rate
        return rate() if callable(rate) else rate

    def update(
        self,
        rows: Tensor,
        slots: Mapping[str, Tensor],
        gradient: Tensor,
        learning_rate: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The engine's rule on gathered rows: new rows and new slots."""
        raise NotImplementedError

    def updates_all_rows(self) -> bool:
        """Whether a step must update every row of the table."""
        return self.updates_untouched_rows

    def to_tpu(self) -> Any:
        """The `tf.tpu.experimental.embedding` twin with identical values."""
        twin = self.tpu_twin()(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        )
        return protobuf_safe(twin)

    def get_config(self) -> dict[str, Any]:
        config = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self)
        }
        if callable(self.learning_rate):
            config["learning_rate"] = keras.saving.serialize_keras_object(
                self.learning_rate
            )
        if isinstance(self.clipvalue, tuple):
            config["clipvalue"] = list(self.clipvalue)
        return config

    @classmethod
    def from_config(cls, config: KerasConfig) -> Any:
        config = dict(config)
        if isinstance(config.get("learning_rate"), dict):
            config["learning_rate"] = keras.saving.deserialize_keras_object(
                config["learning_rate"]
            )
        return cls(**config)


def protobuf_safe(optimizer: Any) -> Any:
    """`optimizer` with its packing status as the enum TF writes to a proto.

    Under TPUStrategy, TF 2.20/2.21 copy `low_dimensional_packing_status`
    (a bool, default False) straight into an enum field of the engine's
    `OptimizationParameters` (`tpu_embedding_v2_utils.py`,
    `_Optimizer._set_optimization_parameters`). protobuf 5.29 and newer
    refuse a bool there ("Expected an int, got a boolean"), so the
    `TPUEmbedding` build would fail at the first step. The enum value of
    the same meaning (UNSPECIFIED = 0 for False, ENABLED = 1 for True)
    is accepted by every protobuf. Changes the object in place.
    """
    status = getattr(optimizer, "low_dimensional_packing_status", None)
    if isinstance(status, bool):
        optimizer.low_dimensional_packing_status = int(status)
    return optimizer
