"""The workloads' batches as TensorFlow tensors, in each input form.

Conversion runs once, before timing: it is the host input pipeline's work,
the same for every candidate that reads a form.

Forms:
    ragged  `tf.RaggedTensor` `[batch, (n)]` per feature, sequences untruncated.
    sparse  `tf.SparseTensor` `[batch, 15]` (bag), `[batch, 1]` (single),
            `[batch, 24]` (sequences, untruncated).
    dense   int64 padded with -1: bag `[batch, 15]`, single `[batch]`,
            sequences `[batch, 20]` (padded and truncated on the host, as
            `FeaturePreprocessor` does for tensor-core columns).

Also here: the mean over a sequence's valid positions, which the W2 model
applies to each `[batch, 20, dim]` sequence activation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from benchmarks import workloads

FORMS = ("ragged", "sparse", "dense")


@dataclasses.dataclass(frozen=True)
class TensorBatch:
    """Features in one form, sequence lengths (clipped) and labels."""

    features: dict[str, Any]
    lengths: dict[str, tf.Tensor]
    labels: tf.Tensor


def width(feature: str, form: str) -> int:
    if feature == "bag":
        return workloads.BAG_MAX
    if feature == "single":
        return 1
    if form == "dense":
        return workloads.MAX_SEQUENCE_LENGTH
    return workloads.SEQUENCE_MAX


def feature_tensor(feature: str, ids: workloads.Ragged, form: str) -> Any:
    if form == "ragged":
        return tf.RaggedTensor.from_row_lengths(ids.values, ids.lengths)
    size = width(feature, form)
    if form == "sparse":
        return tf.SparseTensor(
            ids.sparse_indices(), ids.values, [len(ids.lengths), size]
        )
    dense = tf.constant(ids.dense(size))
    return dense[:, 0] if feature == "single" else dense


def to_tensors(batch: workloads.Batch, form: str) -> TensorBatch:
    features = {
        name: feature_tensor(name, ids, form)
        for name, ids in batch.features.items()
    }
    lengths = {
        name: tf.constant(
            np.minimum(
                batch.features[name].lengths, workloads.MAX_SEQUENCE_LENGTH
            )
        )
        for name in workloads.SEQUENCE_FEATURES
    }
    return TensorBatch(features, lengths, tf.constant(batch.labels))


def all_tensors(batches: list[workloads.Batch], form: str) -> list[Any]:
    return [to_tensors(batch, form) for batch in batches]


def mean_over_length(sequence: tf.Tensor, length: tf.Tensor) -> tf.Tensor:
    """`[batch, T, dim]` zero-padded -> `[batch, dim]`: mean of the valid."""
    count = tf.maximum(tf.cast(length, sequence.dtype), 1.0)
    return tf.reduce_sum(sequence, axis=1) / count[:, tf.newaxis]


def numpy_outputs(outputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """Activations keyed by feature name, as numpy, for the output check."""
    return {name: np.asarray(value) for name, value in outputs.items()}
