"""Embedding optimizers with the TPU embedding engine's update rules.

Each optimizer mirrors its `tf.tpu.experimental.embedding` twin: same
parameter names and defaults, `to_tpu()` builds that twin, and `update` is the
engine's rule written as pure tensor math on the rows a batch touched, so the
same model trains the same way on CPU, GPU and TPU.

Sources of the rules: the comments of TensorFlow's
`optimization_parameters.proto` and the SparseCore optimizer computations in
`tensorflow/core/tpu/kernels/sparse_core_ops_utils.cc` (which the TPU tests'
numpy references agree with). Where no public source shows the engine's
behaviour, the choice is marked "inferred" below.

One step of `apply_update`, per table, on the gradient of each distinct row
(duplicate ids in the batch summed, as the engine sums them):

1. clip the gradient to `clipvalue`;
2. decoupled weight decay (inferred from the proto's reference to
   `DecoupledWeightDecayExtension`): `w -= factor * w`, with the factor
   multiplied by the learning rate when
   `multiply_weight_decay_factor_by_learning_rate`;
3. the optimizer's rule on `w` and its slots;
4. clip the weights to `[clip_weight_min, clip_weight_max]`.

Only the touched rows are read and written — a step costs O(ids in the
batch), never O(vocabulary) — except for `Adam(lazy_adam=False)`, whose
non-lazy rule moves every row on every step, as the engine's does.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import ClassVar
from typing import Mapping
from typing import NamedTuple

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import Tensor


class SlotSpec(NamedTuple):
    """An optimizer slot: its name (as TPUEmbedding names it) and init."""

    name: str
    initial_value_attribute: str | None
    """Attribute of the optimizer holding the initial value; None means 0."""


def _check_number(owner: str, argument: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"`{argument}` of {owner} must be a number. "
            f"Received: {argument}={value!r} (of type {type(value).__name__})"
        )


def _check_range(
    owner: str,
    argument: str,
    value: Any,
    low: float,
    high: float | None,
    high_inclusive: bool = False,
    low_inclusive: bool = True,
) -> None:
    _check_number(owner, argument, value)
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


def _check_positive(owner: str, argument: str, value: Any) -> None:
    _check_range(owner, argument, value, 0, None, low_inclusive=False)


def _check_non_negative(owner: str, argument: str, value: Any) -> None:
    _check_range(owner, argument, value, 0, None)


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

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if not callable(self.learning_rate):
            _check_number(owner, "learning_rate", self.learning_rate)
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
            _check_positive(owner, "clipvalue", self.clipvalue)
            # Stored as TF expands it, so that equal clips compare equal.
            value = float(self.clipvalue)
            object.__setattr__(self, "clipvalue", (-value, value))
        if self.weight_decay_factor is not None:
            _check_non_negative(
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
        twin = _tpu_twins()[type(self)]
        return twin(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        )

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
    def from_config(cls, config: dict[str, Any]) -> Any:
        config = dict(config)
        if isinstance(config.get("learning_rate"), dict):
            config["learning_rate"] = keras.saving.deserialize_keras_object(
                config["learning_rate"]
            )
        return cls(**config)


def _register(cls: type) -> type:
    return keras.saving.register_keras_serializable(package="keras_tpu_embed")(
        cls
    )


@_register
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

    def update(
        self,
        rows: Tensor,
        slots: Mapping[str, Tensor],
        gradient: Tensor,
        learning_rate: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return rows - learning_rate * gradient, {}


@_register
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

    learning_rate: float | Callable[[], float] = dataclasses.field(
        default=0.001, kw_only=False
    )
    initial_accumulator_value: float = 0.1

    SLOTS: ClassVar[tuple[SlotSpec, ...]] = (
        SlotSpec("accumulators", "initial_accumulator_value"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(
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


@_register
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

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "AdagradMomentum"
        _check_number(owner, "momentum", self.momentum)
        _check_positive(owner, "epsilon", self.epsilon)
        _check_positive(owner, "exponent", self.exponent)
        _check_range(owner, "beta2", self.beta2, 0, 1, high_inclusive=True)

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


@_register
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

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_range("Adam", "beta_1", self.beta_1, 0, 1)
        _check_range("Adam", "beta_2", self.beta_2, 0, 1)
        _check_positive("Adam", "epsilon", self.epsilon)
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


@_register
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

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "FTRL"
        _check_range(
            owner,
            "learning_rate_power",
            self.learning_rate_power,
            float("-inf"),
            0,
            high_inclusive=True,
        )
        _check_non_negative(
            owner, "l1_regularization_strength", self.l1_regularization_strength
        )
        _check_non_negative(
            owner, "l2_regularization_strength", self.l2_regularization_strength
        )
        _check_non_negative(owner, "beta", self.beta)
        _check_positive(
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


def _tpu_twins() -> dict[type, Any]:
    """Our optimizer classes and their `tf.tpu.experimental.embedding` twins."""
    tpu = tf.tpu.experimental.embedding
    return {
        SGD: tpu.SGD,
        Adagrad: tpu.Adagrad,
        AdagradMomentum: tpu.AdagradMomentum,
        Adam: tpu.Adam,
        FTRL: tpu.FTRL,
    }


def _clip(value: Tensor, bounds: tuple[float | None, float | None]) -> Tensor:
    low, high = bounds
    if low is not None:
        value = tf.maximum(value, tf.cast(low, value.dtype))
    if high is not None:
        value = tf.minimum(value, tf.cast(high, value.dtype))
    return value


def apply_update(
    optimizer: EmbeddingOptimizer,
    table: tf.Variable,
    slots: Mapping[str, tf.Variable],
    unique_ids: Tensor,
    gradient: Tensor,
    learning_rate: Tensor,
    rows: Tensor | None = None,
    guard: Tensor | None = None,
) -> list[Any]:
    """Applies one engine step to `table` (see the module docstring).

    Args:
        optimizer: The table's optimizer.
        table: The table variable, `[vocabulary_size, dim]`.
        slots: The optimizer's slot variables, keyed by slot name.
        unique_ids: Row ids, `[n]`. Repeated ids are allowed when each
            repetition carries the same (total) gradient: they compute the
            same new values, so their scatters agree. For rules that update
            every row, repeated ids' gradients are summed instead.
        gradient: The gradient of each row with duplicate ids already summed,
            as the engine sums them, `[n, dim]`.
        learning_rate: A scalar.
        rows: `table`'s current rows at `unique_ids`, when the caller has
            them already (saves a random gather over the table).
        guard: A boolean scalar; when given, the step runs only if it is
            true (an XLA-compatible `tf.cond`). Skipped where a zero
            gradient changes nothing (`_zero_gradient_is_noop`), which is
            what the update then gets when the guard is false: under XLA the
            conditional made the benchmark's training step 1.2x slower.

    Returns:
        The update ops, for control dependencies.
    """
    if guard is not None and not _zero_gradient_is_noop(optimizer):
        done = tf.cond(
            guard,
            lambda: _with_done(
                apply_update(
                    optimizer,
                    table,
                    slots,
                    unique_ids,
                    gradient,
                    learning_rate,
                    rows,
                )
            ),
            lambda: tf.constant(True),
        )
        return [done]
    gradient = _clip(gradient, optimizer.gradient_clip_bounds)
    if optimizer.updates_all_rows():
        # Non-lazy rules move untouched rows too: a dense step.
        gradient = tf.scatter_nd(
            unique_ids[:, tf.newaxis], gradient, tf.shape(table, tf.int64)
        )
        rows = table.read_value()
        old_slots = {name: var.read_value() for name, var in slots.items()}
    else:
        if rows is None:
            rows = tf.gather(table, unique_ids)
        old_slots = {
            name: tf.gather(var, unique_ids) for name, var in slots.items()
        }
    learning_rate = tf.cast(learning_rate, rows.dtype)
    if optimizer.weight_decay_factor:
        decay = tf.cast(optimizer.weight_decay_factor, rows.dtype)
        if optimizer.multiply_weight_decay_factor_by_learning_rate:
            decay = decay * learning_rate
        rows = rows - decay * rows
    new_rows, new_slots = optimizer.update(
        rows, old_slots, gradient, learning_rate
    )
    new_rows = _clip(
        new_rows, (optimizer.clip_weight_min, optimizer.clip_weight_max)
    )
    if optimizer.updates_all_rows():
        ops = [table.assign(new_rows)]
        ops += [slots[name].assign(value) for name, value in new_slots.items()]
        return ops
    ops = [table.scatter_update(tf.IndexedSlices(new_rows, unique_ids))]
    for name, value in new_slots.items():
        ops.append(
            slots[name].scatter_update(tf.IndexedSlices(value, unique_ids))
        )
    return ops


def _with_done(ops: list[Any]) -> Tensor:
    with tf.control_dependencies(ops):
        return tf.constant(True)


def _zero_gradient_is_noop(optimizer: EmbeddingOptimizer) -> bool:
    """Whether a step with an all-zero gradient leaves rows and slots as is.

    True for SGD and Adagrad (whose accumulator stays > 0) without weight
    decay or weight clipping; momenta, FTRL's linear slot, decay and clipping
    all move a row that receives a zero gradient.
    """
    return (
        type(optimizer) in (SGD, Adagrad)
        and not optimizer.weight_decay_factor
        and optimizer.clip_weight_min is None
        and optimizer.clip_weight_max is None
    )


SUPPORTED_OPTIMIZERS: tuple[type, ...] = (
    SGD,
    Adagrad,
    AdagradMomentum,
    Adam,
    FTRL,
)


def from_tpu(optimizer: Any) -> EmbeddingOptimizer:
    """Our twin of a `tf.tpu.experimental.embedding` optimizer."""
    for ours, theirs in _tpu_twins().items():
        if type(optimizer) is theirs:
            values = {}
            for field in dataclasses.fields(ours):
                if field.name == "clipvalue":
                    low = optimizer.clip_gradient_min
                    high = optimizer.clip_gradient_max
                    values["clipvalue"] = (
                        None if low is None and high is None else (low, high)
                    )
                else:
                    values[field.name] = getattr(optimizer, field.name)
            return ours(**values)  # type: ignore[no-any-return]
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
