"""Anchors and bounds in plain TensorFlow, measured in every process.

No Keras here, so the legacy (`tf_keras`) process measures the same anchor
as the Keras 3 processes, and every ratio divides by a time taken in its
own process.

- `safe_lookup`: `tf.nn.safe_embedding_lookup_sparse` as the legacy feature
  columns call it (sequences as 3-D sparse ids `[batch, 20, 1]`). In W2, the
  same forward with TensorFlow's sparse Adagrad kernel
  (`ResourceSparseApplyAdagradV2`, epsilon 0, duplicates summed first as
  Keras 2 optimizers do) and a hand-written dense head: "raw sparse ops".
- `raw_xla`: padded ids, gather and combiner under XLA (W1); in W2 the
  forward and backward under XLA and the same sparse Adagrad kernel outside
  it (XLA has no sparse-apply kernels).
- `tpu_embedding_for_serving`: `tf.tpu.experimental.embedding`'s CPU
  serving object, fed sparse or ragged ids.
- `gather_bound`: the random-row traffic the workload cannot avoid, timed
  with TensorFlow's gather on the anchor's own tables: in W1 one gather of
  every id a batch looks up; in W2, per distinct id, a gather of its row and
  accumulator and a scatter of both.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import tensorflow as tf

from benchmarks import tensors
from benchmarks import workloads
from benchmarks.measure import Built
from benchmarks.measure import Candidate

MEAN = "mean"


BLOCK_ROWS = 65536


def table_variables(spec: workloads.Workload) -> dict[str, tf.Variable]:
    """Tables filled block by block, so that no full-size temporary exists."""
    tables = {}
    for name, (rows, dim) in spec.table_shapes().items():
        variable = tf.Variable(tf.zeros([rows, dim]), name=name)
        for start in range(0, rows, BLOCK_ROWS):
            size = min(BLOCK_ROWS, rows - start)
            values = tf.random.truncated_normal(
                [size, dim], stddev=1 / math.sqrt(dim)
            )
            variable.scatter_update(
                tf.IndexedSlices(values, tf.range(start, start + size))
            )
        tables[name] = variable
    return tables


def _loader(tables: dict[str, Any]) -> Any:
    def load(values: dict[str, np.ndarray]) -> None:
        for name, variable in tables.items():
            variable.assign(values[name])

    return load


def state_size(variables: Any) -> int:
    """Bytes held by `variables` (any nest of variables or tensors)."""
    return sum(
        int(np.prod(v.shape)) * v.dtype.size for v in tf.nest.flatten(variables)
    )


def _three_d(ids: tf.SparseTensor) -> tf.SparseTensor:
    """Sequence ids truncated to 20 and made `[batch, 20, 1]`."""
    keep = ids.indices[:, 1] < workloads.MAX_SEQUENCE_LENGTH
    kept = tf.sparse.retain(ids, keep)
    shaped = tf.SparseTensor(
        kept.indices,
        kept.values,
        tf.stack(
            [
                ids.dense_shape[0],
                tf.constant(workloads.MAX_SEQUENCE_LENGTH, tf.int64),
            ]
        ),
    )
    return tf.sparse.expand_dims(shaped, -1)


def safe_lookups(tables: dict[str, Any], features: dict[str, Any]) -> dict:
    lookup = functools.partial(
        tf.nn.safe_embedding_lookup_sparse, combiner=MEAN
    )
    out = {
        "bag": lookup(tables["bag"], features["bag"]),
        "single": lookup(tables["single"], features["single"]),
    }
    for name in workloads.SEQUENCE_FEATURES:
        out[name] = lookup(tables["seq"], _three_d(features[name]))
    return out


def dense_lookups(tables: dict[str, Any], features: dict[str, Any]) -> dict:
    """Padded ids: gather (padding reads row 0), mask, combine."""

    def gathered(table: Any, ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        mask = tf.cast(ids >= 0, tf.float32)[..., tf.newaxis]
        return tf.gather(table, tf.maximum(ids, 0)) * mask, mask

    rows, mask = gathered(tables["bag"], features["bag"])
    out = {
        "bag": tf.math.divide_no_nan(
            tf.reduce_sum(rows, 1), tf.reduce_sum(mask, 1)
        ),
        "single": tf.gather(tables["single"], features["single"]),
    }
    for name in workloads.SEQUENCE_FEATURES:
        out[name] = gathered(tables["seq"], features[name])[0]
    return out


def _serving(
    spec: workloads.Workload,
    batches: list[workloads.Batch],
    lookups: Any,
    form: str,
    jit: bool = False,
) -> Built:
    tables = table_variables(spec)
    inputs = tensors.all_tensors(batches, form)
    run = tf.function(
        lambda f: lookups(tables, f), jit_compile=jit, reduce_retracing=True
    )

    def step(i: int) -> Any:
        return run(inputs[i % len(inputs)].features)

    return Built(
        step=step,
        state_bytes=state_size(list(tables.values())),
        form=form,
        outputs=lambda i: tensors.numpy_outputs(step(i)),
        load_tables=_loader(tables),
        tables=tables,
    )


def _tpu_serving(
    spec: workloads.Workload, batches: list[workloads.Batch], form: str
) -> Built:
    embedding = tf.tpu.experimental.embedding
    tables = {
        name: embedding.TableConfig(rows, dim, combiner=MEAN, name=name)
        for name, (rows, dim) in spec.table_shapes().items()
    }
    features = {
        "bag": embedding.FeatureConfig(tables["bag"]),
        "single": embedding.FeatureConfig(tables["single"]),
    }
    for name in workloads.SEQUENCE_FEATURES:
        features[name] = embedding.FeatureConfig(
            tables["seq"], max_sequence_length=workloads.MAX_SEQUENCE_LENGTH
        )
    mid_level = embedding.TPUEmbeddingForServing(features, optimizer=None)
    mid_level.build()
    variables = {
        config.name: variable
        for config, variable in mid_level.embedding_tables.items()
    }
    inputs = tensors.all_tensors(batches, form)
    run = tf.function(mid_level.__call__, reduce_retracing=True)

    def step(i: int) -> Any:
        return run(inputs[i % len(inputs)].features)

    return Built(
        step=step,
        state_bytes=state_size(list(variables.values())),
        form=form,
        outputs=lambda i: tensors.numpy_outputs(step(i)),
        load_tables=_loader(variables),
    )


def _flat_ids(batch: workloads.Batch) -> dict[str, tf.Tensor]:
    """Every id each table reads for `batch` (sequences truncated)."""
    seq = [
        batch.features[name].truncated(workloads.MAX_SEQUENCE_LENGTH).values
        for name in workloads.SEQUENCE_FEATURES
    ]
    return {
        "bag": tf.constant(batch.features["bag"].values),
        "single": tf.constant(batch.features["single"].values),
        "seq": tf.constant(np.concatenate(seq)),
    }


def gather_bound(
    spec: workloads.Workload,
    batches: list[workloads.Batch],
    source: Built,
    jit: bool = False,
) -> Built:
    """The bound, timed on `source`'s tables (and slots, in training)."""
    tables, slots = source.tables, source.slots
    ids = [_flat_ids(batch) for batch in batches]
    if spec.training:
        ids = [{k: tf.unique(v)[0] for k, v in i.items()} for i in ids]
    one = tf.constant(1.0)

    def gather(variable: Any, table_ids: tf.Tensor, one: tf.Tensor) -> Any:
        rows = tf.gather(variable, table_ids)
        # Under XLA, the product by a run-time 1 lets the gather fuse into
        # an element-wise loop, its fastest form on CPU (3-4x a lone
        # gather); plain TensorFlow is fastest without it.
        return rows * one if jit else rows

    def traffic(ids: dict[str, tf.Tensor], one: tf.Tensor) -> Any:
        out = []
        for name, table_ids in ids.items():
            rows = gather(tables[name], table_ids, one)
            if slots is None:
                out.append(rows)  # Returned, so that nothing is pruned.
                continue
            accumulators = gather(slots[name], table_ids, one)
            for variable, values in (
                (tables[name], rows),
                (slots[name], accumulators),
            ):
                tf.raw_ops.ResourceScatterUpdate(
                    resource=variable.handle, indices=table_ids, updates=values
                )
        # Stateful ops run in a tf.function whether returned or not.
        return out

    run = tf.function(traffic, jit_compile=jit, reduce_retracing=True)
    return Built(
        step=lambda i: run(ids[i % len(ids)], one),
        state_bytes=0,
        form="ids",
    )


# ----------------------------------------------------------------- training


class _Head:
    """Dense(256, relu) -> Dense(1) as variables, with Adagrad slots."""

    def __init__(self, width: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        limit1 = math.sqrt(6 / (width + workloads.HIDDEN))
        limit2 = math.sqrt(6 / (workloads.HIDDEN + 1))
        self.variables = [
            tf.Variable(
                rng.uniform(-limit1, limit1, (width, workloads.HIDDEN)).astype(
                    np.float32
                )
            ),
            tf.Variable(tf.zeros([workloads.HIDDEN])),
            tf.Variable(
                rng.uniform(-limit2, limit2, (workloads.HIDDEN, 1)).astype(
                    np.float32
                )
            ),
            tf.Variable(tf.zeros([1])),
        ]
        self.accumulators = [
            tf.Variable(tf.fill(v.shape, workloads.INITIAL_ACCUMULATOR))
            for v in self.variables
        ]

    def loss(self, activations: dict, lengths: dict, labels: tf.Tensor) -> Any:
        parts = [activations["bag"], activations["single"]] + [
            tensors.mean_over_length(activations[name], lengths[name])
            for name in workloads.SEQUENCE_FEATURES
        ]
        w1, b1, w2, b2 = self.variables
        hidden = tf.nn.relu(tf.matmul(tf.concat(parts, 1), w1) + b1)
        logits = tf.matmul(hidden, w2) + b2
        return tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels, logits)
        )

    def apply(self, gradients: list[tf.Tensor]) -> list[Any]:
        return [
            tf.raw_ops.ResourceApplyAdagradV2(
                var=v.handle,
                accum=a.handle,
                lr=workloads.LEARNING_RATE,
                epsilon=1e-7,
                grad=g,
            )
            for v, a, g in zip(self.variables, self.accumulators, gradients)
        ]


def sparse_adagrad(
    table: tf.Variable, accumulator: tf.Variable, gradient: Any
) -> Any:
    """TF's sparse Adagrad kernel on a gradient with duplicates summed."""
    unique, index = tf.unique(gradient.indices)
    summed = tf.math.unsorted_segment_sum(
        gradient.values, index, tf.size(unique)
    )
    return tf.raw_ops.ResourceSparseApplyAdagradV2(
        var=table.handle,
        accum=accumulator.handle,
        lr=workloads.LEARNING_RATE,
        epsilon=0.0,
        grad=summed,
        indices=unique,
    )


def _training(
    spec: workloads.Workload,
    batches: list[workloads.Batch],
    lookups: Any,
    form: str,
    jit: bool,
) -> Built:
    tables = table_variables(spec)
    slots = {
        name: tf.Variable(tf.fill(v.shape, workloads.INITIAL_ACCUMULATOR))
        for name, v in tables.items()
    }
    head = _Head(spec.bag_dim + spec.single_dim + 2 * spec.seq_dim)
    inputs = tensors.all_tensors(batches, form)
    names = list(tables)

    def forward_backward(features: dict, lengths: dict, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = head.loss(lookups(tables, features), lengths, labels)
        watched = [tables[n] for n in names] + head.variables
        return loss, tape.gradient(loss, watched)

    if jit:
        forward_backward = tf.function(forward_backward, jit_compile=True)

    @tf.function(reduce_retracing=True)
    def train(features: dict, lengths: dict, labels: Any) -> Any:
        loss, gradients = forward_backward(features, lengths, labels)
        updates = head.apply(gradients[len(names) :])
        for name, gradient in zip(names, gradients):
            updates.append(sparse_adagrad(tables[name], slots[name], gradient))
        with tf.control_dependencies(updates):
            return tf.identity(loss)

    def step(i: int) -> Any:
        batch = inputs[i % len(inputs)]
        return train(batch.features, batch.lengths, batch.labels)

    return Built(
        step=step,
        state_bytes=state_size(
            [tables, slots, head.variables, head.accumulators]
        ),
        form=form,
        tables=tables,
        slots=slots,
    )


def candidates(spec: workloads.Workload) -> list[Candidate]:
    """The anchor and the bound, which every process measures first."""
    if spec.training:
        anchor = Candidate(
            "safe_lookup",
            "raw sparse ops: safe_embedding_lookup_sparse + TF sparse Adagrad",
            lambda s, b, c: _training(s, b, safe_lookups, "sparse", False),
            role="anchor",
        )
        bound = "gather + scatter of each distinct row and accumulator"
    else:
        anchor = Candidate(
            "safe_lookup",
            "tf.nn.safe_embedding_lookup_sparse, as feature columns call it",
            lambda s, b, c: _serving(s, b, safe_lookups, "sparse"),
            role="anchor",
        )
        bound = "one TF gather of every id looked up"
    return [
        anchor,
        Candidate(
            "gather_bound_tf",
            f"{bound} (TF ops)",
            lambda s, b, c: gather_bound(s, b, c["anchor"], jit=False),
            role="bound",
        ),
        Candidate(
            "gather_bound_xla",
            f"{bound} (XLA, gathers fused)",
            lambda s, b, c: gather_bound(s, b, c["anchor"], jit=True),
            role="bound",
        ),
    ]


def tf_candidates(spec: workloads.Workload) -> list[Candidate]:
    """The plain-TensorFlow peers (family `tf`)."""
    if spec.training:
        return [
            Candidate(
                "raw_xla",
                "raw ops: padded gather fwd/bwd under XLA + TF sparse Adagrad",
                lambda s, b, c: _training(s, b, dense_lookups, "dense", True),
            )
        ]
    return [
        Candidate(
            "raw_xla",
            "raw ops: padded gather + mask + mean under XLA",
            lambda s, b, c: _serving(s, b, dense_lookups, "dense", jit=True),
        ),
        Candidate(
            "tpu_embedding_for_serving_sparse",
            "tf.tpu.experimental.embedding.TPUEmbeddingForServing, sparse ids",
            lambda s, b, c: _tpu_serving(s, b, "sparse"),
        ),
        Candidate(
            "tpu_embedding_for_serving_ragged",
            "tf.tpu.experimental.embedding.TPUEmbeddingForServing, ragged ids",
            lambda s, b, c: _tpu_serving(s, b, "ragged"),
        ),
    ]
