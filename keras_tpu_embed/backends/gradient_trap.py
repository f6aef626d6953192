"""Training tables with the embedding optimizer instead of Keras'.

Keras' `train_step` differentiates the loss with respect to the model's
trainable variables and hands the result to the model's optimizer. Embedding
tables must instead be updated by the embedding optimizer, on the rows the
batch touched only. So the tables are non-trainable for Keras, and the
activations that come from them are produced inside a "gradient trap": a
custom-gradient function of a scalar trainable variable (the layer's
`table_update_trigger`, which stays 0). Its backward pass receives the
activations' gradients, applies the embedding update (local tables: the
sparse row update; the TPU engine: `apply_gradients`), and returns zero for
the scalar, which exists only so that Keras differentiates the path at all.
TF's own Keras layers for the engine hook into a step the same way.

Both backends use this one trap.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import Tensor

ApplyGradients = Callable[[list[Tensor]], Tensor]


def trap_gradients(
    trapped: Sequence[Tensor] | Callable[[], Sequence[Tensor]],
    trap_variables: Tensor | Sequence[Tensor],
    apply_gradients: ApplyGradients,
) -> list[Tensor]:
    """Returns the trapped tensors; their gradients go to `apply_gradients`.

    Args:
        trapped: The tensors to trap: either given (gathered rows: they
            pass through unchanged and get a zero gradient themselves), or
            a function that makes them inside the trap (the engine's
            dequeue, which has no input to differentiate).
        trap_variables: The value of a scalar trainable variable, or
            several. They are the trap's inputs, so that the tape reaches
            it; each gets a zero gradient.
        apply_gradients: Called inside the backward pass with one dense
            gradient per trapped tensor (zeros where none flowed); it applies
            the updates and returns a numeric scalar computed after all of
            them (e.g. the incremented step).

    The trap variables' (zero) gradients are computed from that scalar, so
    the updates are a data dependency of the Keras optimizer's step. Control
    dependencies alone are not enough: Grappler prunes updates that hang
    only on control edges in `model.fit` with some Keras optimizers (Adam).
    """
    produce = trapped if callable(trapped) else None
    given = [] if produce is not None else list(trapped)  # type: ignore[arg-type]
    if isinstance(trap_variables, (list, tuple)):
        scalars = list(trap_variables)
    else:
        scalars = [trap_variables]

    @tf.custom_gradient  # type: ignore[untyped-decorator]
    def trap(*inputs: Tensor) -> Any:
        rows, dummies = inputs[: len(given)], inputs[len(given) :]
        outputs = [tf.identity(t) for t in (produce() if produce else rows)]

        def backward(*upstream: Tensor, variables: Any = None) -> Any:
            gradients = [
                tf.zeros_like(o) if g is None else tf.convert_to_tensor(g)
                for g, o in zip(upstream, outputs)
            ]
            done = apply_gradients(gradients)
            zeros = [tf.zeros_like(r) for r in rows] + [
                tf.zeros_like(d) + tf.cast(done, d.dtype) * 0 for d in dummies
            ]
            if variables:
                # Variables read inside `produce` (a mid-level object that
                # looks up from variables itself) are trained by
                # `apply_gradients`, not by Keras.
                return zeros, [None] * len(variables)
            return zeros

        return outputs, backward

    return list(trap(*given, *scalars))
