"""The embedding engine's optimizer step, read from TF's own config proto.

The emulated chip (`emulated_chip.py`) receives what a real TPU receives:
the serialized `TPUEmbeddingConfiguration` that
`tf.tpu.experimental.embedding.TPUEmbedding` builds, with one
`OptimizationParameters` per table. This module applies those parameters to
the distinct rows of a step, each with its gradient summed over the global
batch, in the order the proto's comments give
(`tensorflow/core/protobuf/tpu/optimization_parameters.proto`):
gradient clipping, weight decay, the optimizer's rule, weight clipping.

It reads the proto, never this package's optimizer objects: a parameter
that `keras_tpu_embed` fails to hand to TF's optimizer is then missing here
as it would be on the chip, and training under the emulation drifts from
the host path that applies the package's own `optimizers/row_update.py`.
"""

from __future__ import annotations

from typing import Any
from typing import Mapping

from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import Tensor

# Slot names in the order of TF's load/retrieve ops, per proto field.
SLOT_NAMES: dict[str, tuple[str, ...]] = {
    "stochastic_gradient_descent": (),
    "adagrad": ("accumulators",),
    "adagrad_momentum": ("accumulators", "momenta"),
    "adam": ("momenta", "velocities"),
    "ftrl": ("accumulators", "linears"),
}


def optimizer_kind(parameters: Any) -> str:
    """The proto's `parameters` oneof, refused unless the chip has it."""
    kind = parameters.WhichOneof("parameters")
    if kind not in SLOT_NAMES:
        raise NotImplementedError(
            f"The emulated TPU embedding engine has no rule for the "
            f"optimizer '{kind}'; it runs {sorted(SLOT_NAMES)}."
        )
    return str(kind)


def learning_rate(parameters: Any, dynamic_rates: list[Tensor]) -> Tensor:
    """The step's learning rate: constant, or a dynamic rate by its tag."""
    rate = parameters.learning_rate
    if rate.WhichOneof("learning_rate") == "dynamic":
        return tf.cast(dynamic_rates[rate.dynamic.tag], tf.float32)
    return tf.constant(rate.constant, tf.float32)


def _clip(value: Tensor, limits: Any, has: bool) -> Tensor:
    if not has:
        return value
    if limits.HasField("lower"):
        value = tf.maximum(value, limits.lower.value)
    if limits.HasField("upper"):
        value = tf.minimum(value, limits.upper.value)
    return value


def step(
    parameters: Any,
    rows: Tensor,
    slots: Mapping[str, Tensor],
    gradient: Tensor,
    rate: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """New rows and slots from old ones and their summed gradients."""
    kind = optimizer_kind(parameters)
    gradient = _clip(
        gradient,
        parameters.gradient_clipping_limits,
        parameters.HasField("gradient_clipping_limits"),
    )
    if parameters.weight_decay_factor:
        decay = parameters.weight_decay_factor
        if parameters.multiply_weight_decay_factor_by_learning_rate:
            decay = decay * rate
        rows = rows - decay * rows
    rows, new_slots = _RULES[kind](
        getattr(parameters, kind), rows, slots, gradient, rate
    )
    rows = _clip(
        rows,
        parameters.clipping_limits,
        parameters.HasField("clipping_limits"),
    )
    return rows, new_slots


def _sgd(_: Any, w: Tensor, s: Mapping[str, Tensor], g: Tensor, lr: Tensor):  # type: ignore[no-untyped-def]
    return w - lr * g, {}


def _adagrad(_: Any, w: Tensor, s: Mapping[str, Tensor], g: Tensor, lr: Tensor):  # type: ignore[no-untyped-def]
    accumulators = s["accumulators"] + g * g
    return w - lr * g / tf.sqrt(accumulators), {"accumulators": accumulators}


def _adagrad_momentum(  # type: ignore[no-untyped-def]
    p: Any, w: Tensor, s: Mapping[str, Tensor], g: Tensor, lr: Tensor
):
    if p.beta2 == 1.0:
        accumulators = s["accumulators"] + g * g
    else:
        accumulators = p.beta2 * s["accumulators"] + (1 - p.beta2) * g * g
    scaled = g * tf.pow(accumulators + p.epsilon, -1.0 / p.exponent)
    momenta = p.momentum * s["momenta"] + scaled
    update = p.momentum * momenta + scaled if p.use_nesterov else momenta
    return w - lr * update, {"accumulators": accumulators, "momenta": momenta}


def _adam(p: Any, w: Tensor, s: Mapping[str, Tensor], g: Tensor, lr: Tensor):  # type: ignore[no-untyped-def]
    momenta = p.beta1 * s["momenta"] + (1 - p.beta1) * g
    velocities = p.beta2 * s["velocities"] + (1 - p.beta2) * g * g
    if p.use_sum_inside_sqrt:
        denominator = tf.sqrt(velocities + p.epsilon * p.epsilon)
    else:
        denominator = tf.sqrt(velocities) + p.epsilon
    return w - lr * momenta / denominator, {
        "momenta": momenta,
        "velocities": velocities,
    }


def _ftrl(p: Any, w: Tensor, s: Mapping[str, Tensor], g: Tensor, lr: Tensor):  # type: ignore[no-untyped-def]
    old = s["accumulators"]
    new = old + g * g
    power_new = tf.pow(new, -p.lr_power)
    power_old = tf.pow(old, -p.lr_power)
    if p.multiply_linear_by_lr:
        linears = s["linears"] + lr * g - (power_new - power_old) * w
        l1 = p.l1 * lr
        denominator = power_new + 2 * lr * p.l2 + p.beta
    else:
        linears = s["linears"] + g - (power_new - power_old) * w / lr
        l1 = p.l1
        denominator = (power_new + p.beta) / lr + 2 * p.l2
    w = (tf.clip_by_value(linears, -l1, l1) - linears) / denominator
    return w, {"accumulators": new, "linears": linears}


_RULES = {
    "stochastic_gradient_descent": _sgd,
    "adagrad": _adagrad,
    "adagrad_momentum": _adagrad_momentum,
    "adam": _adam,
    "ftrl": _ftrl,
}
