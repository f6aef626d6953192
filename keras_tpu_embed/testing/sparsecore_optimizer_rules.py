"""The per-row optimizer rules of the emulated SparseCore.

The updates of TF's `sparse_core_xla_ops.cc`, one function per optimizer,
applied to the rows of a stacked table that received ids: each takes the
summed gradient of those rows, their `[table, *slots]` values, the
learning rate and the optimizer's hyperparameters (as `TPUEmbeddingV2`
passes them to the op), and returns the new `[table, *slots]`. Adam has no
bias correction; FTRL is FTRL-Proximal with `beta`.
"""

from __future__ import annotations

from typing import Any
from typing import Callable

from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import Tensor


def clip_rows(table: Tensor, low: float, high: float) -> Tensor:
    return tf.clip_by_value(table, low, high)


def sgd_rows(
    gradient: Tensor, slots: list[Tensor], rate: Tensor, hp: dict[str, Any]
) -> list[Tensor]:
    return [slots[0] - rate * gradient]


def adagrad_rows(
    gradient: Tensor, slots: list[Tensor], rate: Tensor, hp: dict[str, Any]
) -> list[Tensor]:
    table, accumulator = slots
    accumulator = accumulator + gradient * gradient
    return [table - rate * gradient / tf.sqrt(accumulator), accumulator]


def adagrad_momentum_rows(
    gradient: Tensor, slots: list[Tensor], rate: Tensor, hp: dict[str, Any]
) -> list[Tensor]:
    table, accumulator, momenta = slots
    beta1, beta2 = hp["beta1"], hp["beta2"]
    if beta2 == 1.0:
        accumulator = accumulator + gradient * gradient
    else:
        accumulator = beta2 * accumulator + (1.0 - beta2) * gradient**2
    scaled = tf.pow(accumulator + hp["epsilon"], -1.0 / hp["exponent"])
    scaled = scaled * gradient
    momenta = beta1 * momenta + scaled
    if hp["use_nesterov"]:
        table = table - rate * (beta1 * momenta + scaled)
    else:
        table = table - rate * momenta
    return [table, accumulator, momenta]


def adam_rows(
    gradient: Tensor, slots: list[Tensor], rate: Tensor, hp: dict[str, Any]
) -> list[Tensor]:
    table, momenta, velocity = slots
    beta1, beta2, epsilon = hp["beta1"], hp["beta2"], hp["epsilon"]
    momenta = beta1 * momenta + (1.0 - beta1) * gradient
    velocity = beta2 * velocity + (1.0 - beta2) * gradient * gradient
    if hp["use_sum_inside_sqrt"]:
        denominator = tf.sqrt(velocity + epsilon * epsilon)
    else:
        denominator = tf.sqrt(velocity) + epsilon
    return [table - rate * momenta / denominator, momenta, velocity]


def ftrl_rows(
    gradient: Tensor, slots: list[Tensor], rate: Tensor, hp: dict[str, Any]
) -> list[Tensor]:
    table, accumulator, linear = slots
    power = hp["learning_rate_power"]
    l1 = hp["l1_regularization_strength"]
    l2 = hp["l2_regularization_strength"]
    beta = hp["beta"]
    new_accumulator = accumulator + gradient * gradient
    delta = tf.pow(new_accumulator, -power) - tf.pow(accumulator, -power)
    if hp["multiply_linear_by_learning_rate"]:
        linear = linear + rate * gradient - delta * table
        bound = rate * l1
        denominator = tf.pow(new_accumulator, -power) + 2 * rate * l2 + beta
    else:
        linear = linear + gradient - delta * table / rate
        bound = tf.constant(l1, tf.float32)
        denominator = (tf.pow(new_accumulator, -power) + beta) / rate + 2 * l2
    numerator = tf.clip_by_value(linear, -bound, bound) - linear
    return [numerator / denominator, new_accumulator, linear]


# Optimizer name in the op (`xla_sparse_dense_matmul_grad_with_<name>_and_
# static_buffer_size`) -> (its rule, its slot arguments in order).
OPTIMIZER_RULES: dict[
    str, tuple[Callable[..., list[Tensor]], tuple[str, ...]]
] = {
    "sgd": (sgd_rows, ()),
    "adagrad": (adagrad_rows, ("accumulator",)),
    "adagrad_momentum": (adagrad_momentum_rows, ("accumulator", "momenta")),
    "adam": (adam_rows, ("momenta", "velocity")),
    "ftrl": (ftrl_rows, ("accumulator", "linear")),
}
