"""Training tables with the embedding optimizer instead of Keras'.

Keras' `train_step` differentiates the loss with respect to the model's
trainable variables and hands the result to the model's optimizer. Embedding
tables must instead be updated by the embedding optimizer, on the rows the
batch touched only. The tables are therefore non-trainable for Keras, and
their gathered rows pass through a "gradient trap": an identity whose
gradient function receives the rows' gradients, applies the sparse engine
update to the tables, and returns zero for a scalar trainable variable that
exists only so that Keras differentiates the path at all. This is how the TPU
mid-level API hooks into a Keras step too (`apply_gradients` in the trap).
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import Tensor

ApplyGradients = Callable[[list[Tensor]], Tensor]


def trap_gradients(
    rows: Sequence[Tensor],
    trap_variable: Tensor,
    apply_gradients: ApplyGradients,
) -> list[Tensor]:
    """Returns `rows` unchanged; their gradients go to `apply_gradients`.

    Args:
        rows: Gathered table rows, one tensor per table, `[n_t, dim_t]`.
        trap_variable: The value of a scalar trainable variable. It is an
            input so that the tape reaches this function; it receives zero.
        apply_gradients: Called inside the backward pass with one dense
            `[n_t, dim_t]` gradient per table; it applies the updates and
            returns a numeric scalar computed after all of them (e.g. the
            incremented step).

    The trap variable's (zero) gradient is computed from that scalar, so the
    updates are a data dependency of the Keras optimizer's step. Control
    dependencies alone are not enough: Grappler prunes updates that hang
    only on control edges in `model.fit` with some Keras optimizers (Adam).
    """

    @tf.custom_gradient  # type: ignore[untyped-decorator]
    def trap(*inputs: Tensor) -> Any:
        outputs = [tf.identity(r) for r in inputs[:-1]]

        def backward(*upstream: Tensor) -> list[Tensor]:
            gradients = [
                tf.convert_to_tensor(g) if g is not None else tf.zeros_like(r)
                for g, r in zip(upstream, outputs)
            ]
            done = apply_gradients(gradients)
            zero = tf.cast(done, inputs[-1].dtype) * 0.0
            return [tf.zeros_like(r) for r in outputs] + [zero]

        return outputs, backward

    return list(trap(*rows, trap_variable))
