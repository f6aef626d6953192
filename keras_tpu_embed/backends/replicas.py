"""Row gradients of every replica, combined: one update per step for all.

Under a replicated strategy (`MirroredStrategy`, `MultiWorkerMirroredStrategy`;
a `TPUStrategy` without an embedding engine runs the same code, but never ran
on a TPU here) every replica holds its own copy
of each table and slot (Keras' default variable aggregation, `"none"`). Each
replica sees a slice of the global batch, but the TPU embedding engine's rule
is one update per step on the global batch's summed row gradient. So the
backward pass of every replica gathers all replicas' (id, gradient) entries
(`ReplicaContext.all_gather`, which accepts a different number of entries per
replica), the lookup sums them per row, and each replica then applies the
same update to its own copy: the copies stay identical, with no merge call.
TensorFlow updates a `"none"`-aggregated mirrored variable written in a
replica context on that replica's copy only
(`tensorflow/python/distribute/values.py`, `_on_write_update_replica`).

Keras scales each replica's loss by `1 / num_replicas_in_sync`
(`keras/src/losses/loss.py`, `scale_loss_for_distribution`), so the sum over
replicas is the gradient of the mean loss over the global batch: N replicas
on a global batch make the update one device makes on that batch.
"""

from __future__ import annotations

from typing import Callable

from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import Tensor

Gather = Callable[..., list[Tensor]]
"""Concatenates tensors (along axis 0) over every replica of the step."""


def replica_count() -> int:
    """Replicas whose row gradients this call combines (1 outside any)."""
    context = tf.distribute.get_replica_context()
    if context is None:
        # Cross-replica context: no replica runs this code.
        return 1
    return int(context.num_replicas_in_sync)


def row_gradient_gather() -> Gather | None:
    """The gather of every replica's entries; `None` with one replica.

    Returns:
        A function of tensors `[n_i, ...]` (a replica's entries: ids,
        gradients, flags) returning each concatenated over the replicas in
        replica order, the same on every replica; or `None` when the call
        runs in no replicated step (one device, or the default strategy),
        where there is nothing to combine.
    """
    if replica_count() == 1:
        return None
    context = tf.distribute.get_replica_context()

    def gather(*tensors: Tensor) -> list[Tensor]:
        # Collectives carry numbers: booleans travel as int32.
        booleans = [t.dtype == tf.bool for t in tensors]
        sent = [
            tf.cast(t, tf.int32) if b else t for t, b in zip(tensors, booleans)
        ]
        received = context.all_gather(sent, axis=0)
        return [
            tf.cast(r, tf.bool) if b else r for r, b in zip(received, booleans)
        ]

    return gather
