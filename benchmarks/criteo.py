"""W4, a Criteo-shaped workload: training examples/s, serving latency, RSS.

The workload (`workloads.CriteoWorkload`): 26 one-id categorical features
with the Criteo Kaggle cardinalities, each capped at `--row-cap` (10^7 by
default), dim 16; 13 numeric features; Zipf ids (exponent 1.1) from a fixed
seed; a DLRM-like model: bottom MLP 13 -> 64 -> 16 on the numeric features,
the pairwise dot products of the 27 vectors (26 embeddings and the bottom
output, 351 products) beside the bottom output, top MLP 256 -> 64 -> 1,
binary cross-entropy; tables and dense weights learn with Adagrad (0.05,
initial accumulator 0.1).

Training (one process, candidates in rounds whose order rotates,
`measure.measure`): the anchors of W2 in plain TensorFlow,
`safe_lookup` (`tf.nn.safe_embedding_lookup_sparse`, TF's sparse Adagrad
kernel) and `raw_xla` (gathers and the model's forward and backward under
XLA, the same sparse kernel outside it); the peer `keras_embedding_xla`
(`keras.layers.Embedding`, Keras Adagrad, `jit_compile=True`); this
package's host path `kte_cpu` and tensor-core path `kte_tensor_core_xla`.
"x anchor" is paired per round: the fastest anchor's round median over the
candidate's, then the median over rounds. RSS/state as in `measure.py`.

Serving (same process, after training): `kte_cpu` (`export_saved_model`,
`inputs="ids"`, `lookup_device="cpu"`) and the fastest float32 peer of the
W1 latency table, `keras_embedding_xla` (`tf.saved_model.save` of the
Keras model in a `jit_compile` `tf.function`), both loaded with
`tf.saved_model.load` and called through `serving_default` at batch 1, 64
and 4,096 from one thread, in rounds whose order rotates: p50 / p99 over
every call, "x peer" the median over rounds of the peer's round median over
ours.

The models live in `criteo_models.py`, serving in `criteo_serving.py`, the
table and its targets in `criteo_report.py`.

Targets: training >= 1.5x the fastest anchor (best package path); serving
>= 1.0x the peer at p50 and p99 in every batch; RSS <= 1.25x state.

    python benchmarks/criteo.py [--quick] [--row-cap N] [--rounds 3]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import math  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import anchors  # noqa: E402
from benchmarks import measure  # noqa: E402
from benchmarks import workloads  # noqa: E402
from benchmarks.criteo_models import interaction  # noqa: E402
from benchmarks.criteo_models import keras_model  # noqa: E402
from benchmarks.criteo_models import kte_model  # noqa: E402
from benchmarks.criteo_models import model_data  # noqa: E402
from benchmarks.criteo_report import report  # noqa: E402
from benchmarks.criteo_serving import serving_latency  # noqa: E402
from benchmarks.measure import Built  # noqa: E402
from benchmarks.measure import Candidate  # noqa: E402

W = workloads


def _keras_trainer(model: keras.Model, batches: list[W.CriteoBatch]) -> Built:
    data = model_data(batches)

    def step(i: int) -> Any:
        return model.train_on_batch(*data[i % len(data)])

    step(0)  # Builds the optimizer, so that its slots count as state.
    variables = list(model.weights) + list(model.optimizer.variables)
    state = sum(int(np.prod(v.shape)) * 4 for v in variables)
    return Built(step=step, state_bytes=state, form="dense")


def keras_candidate(kind: str) -> Any:
    def build(spec: W.CriteoWorkload, batches: list, context: dict) -> Built:
        if kind == "keras_embedding_xla":
            model = keras_model(spec, jit=True)
        else:
            model = kte_model(
                spec, "tpu_tensor_core" if kind.endswith("_xla") else "cpu"
            )
        return _keras_trainer(model, batches)

    return build


class _DlrmHead:
    """The DLRM-like model as plain variables, with dense Adagrad."""

    def __init__(self, dim: int, features: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        widths = [W.CRITEO_NUMERIC, *W.CRITEO_BOTTOM]
        pairs = (features + 1) * features // 2
        widths += [W.CRITEO_BOTTOM[-1] + pairs, *W.CRITEO_TOP, 1]
        self.layers = []
        self.variables: list[tf.Variable] = []
        shapes = list(zip(widths[:2], widths[1:3])) + list(
            zip(widths[3:-1], widths[4:])
        )
        for fan_in, fan_out in shapes:
            limit = math.sqrt(6 / (fan_in + fan_out))
            kernel = rng.uniform(-limit, limit, (fan_in, fan_out))
            pair = (
                tf.Variable(kernel.astype(np.float32)),
                tf.Variable(tf.zeros([fan_out])),
            )
            self.layers.append(pair)
            self.variables.extend(pair)
        self.bottom_layers = len(W.CRITEO_BOTTOM)
        self.accumulators = [
            tf.Variable(tf.fill(v.shape, W.INITIAL_ACCUMULATOR))
            for v in self.variables
        ]

    def loss(self, numeric: Any, embeddings: list, labels: Any) -> Any:
        x = numeric
        for kernel, bias in self.layers[: self.bottom_layers]:
            x = tf.nn.relu(tf.matmul(x, kernel) + bias)
        x = interaction(x, embeddings)
        top = self.layers[self.bottom_layers :]
        for index, (kernel, bias) in enumerate(top):
            x = tf.matmul(x, kernel) + bias
            if index < len(top) - 1:
                x = tf.nn.relu(x)
        return tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels, x)
        )

    def apply(self, gradients: list) -> list:
        return [
            tf.raw_ops.ResourceApplyAdagradV2(
                var=v.handle,
                accum=a.handle,
                lr=W.LEARNING_RATE,
                epsilon=1e-7,
                grad=g,
            )
            for v, a, g in zip(self.variables, self.accumulators, gradients)
        ]


def anchor_candidate(sparse: bool) -> Any:
    """W2's anchors on W4: `safe_lookup` (sparse) or `raw_xla`."""

    def build(spec: W.CriteoWorkload, batches: list, context: dict) -> Built:
        tables = anchors.table_variables(spec)
        slots = {
            name: tf.Variable(tf.fill(v.shape, W.INITIAL_ACCUMULATOR))
            for name, v in tables.items()
        }
        names = list(tables)
        head = _DlrmHead(spec.dim, len(names))
        data = []
        for batch in batches:
            if sparse:
                ids = {
                    k: tf.sparse.from_dense(tf.constant(v[:, None] + 1))
                    for k, v in batch.ids.items()
                }
                # Ids were shifted by one so that id 0 is not dropped.
                ids = {
                    k: tf.SparseTensor(s.indices, s.values - 1, s.dense_shape)
                    for k, s in ids.items()
                }
            else:
                ids = {k: tf.constant(v) for k, v in batch.ids.items()}
            data.append(
                (ids, tf.constant(batch.numeric), tf.constant(batch.labels))
            )

        def lookups(ids: dict) -> list:
            if sparse:
                return [
                    tf.nn.safe_embedding_lookup_sparse(
                        tables[n], ids[n], combiner="mean"
                    )
                    for n in names
                ]
            return [tf.gather(tables[n], ids[n]) for n in names]

        def forward_backward(ids: dict, numeric: Any, labels: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = head.loss(numeric, lookups(ids), labels)
            watched = [tables[n] for n in names] + head.variables
            return loss, tape.gradient(loss, watched)

        if not sparse:
            forward_backward = tf.function(forward_backward, jit_compile=True)

        @tf.function(reduce_retracing=True)
        def train(ids: dict, numeric: Any, labels: Any) -> Any:
            loss, gradients = forward_backward(ids, numeric, labels)
            updates = head.apply(gradients[len(names) :])
            for name, gradient in zip(names, gradients):
                updates.append(
                    anchors.sparse_adagrad(tables[name], slots[name], gradient)
                )
            with tf.control_dependencies(updates):
                return tf.identity(loss)

        def step(i: int) -> Any:
            return train(*data[i % len(data)])

        state = anchors.state_size([tables, slots, head.variables])
        state += anchors.state_size([head.accumulators])
        return Built(
            step=step,
            state_bytes=state,
            form="sparse" if sparse else "dense",
        )

    return build


def dense_head_candidate() -> Any:
    """The bound: `raw_xla`'s dense model alone, its 26 embeddings fixed
    inputs (no lookup, no table update). No embedding path can make a
    step faster than this, so the fastest anchor's time over it is the
    most any of them can reach against that anchor."""

    def build(spec: W.CriteoWorkload, batches: list, context: dict) -> Built:
        names = spec.features()
        head = _DlrmHead(spec.dim, len(names))
        rng = np.random.default_rng(0)
        data = [
            (
                [
                    tf.constant(
                        rng.normal(size=(spec.batch_size, spec.dim)).astype(
                            np.float32
                        )
                    )
                    for _ in names
                ],
                tf.constant(batch.numeric),
                tf.constant(batch.labels),
            )
            for batch in batches
        ]

        @tf.function(jit_compile=True)
        def forward_backward(
            embeddings: list, numeric: Any, labels: Any
        ) -> Any:
            with tf.GradientTape() as tape:
                loss = head.loss(numeric, embeddings, labels)
            return loss, tape.gradient(loss, head.variables)

        @tf.function(reduce_retracing=True)
        def train(embeddings: list, numeric: Any, labels: Any) -> Any:
            loss, gradients = forward_backward(embeddings, numeric, labels)
            with tf.control_dependencies(head.apply(gradients)):
                return tf.identity(loss)

        def step(i: int) -> Any:
            return train(*data[i % len(data)])

        state = anchors.state_size([head.variables, head.accumulators])
        return Built(step=step, state_bytes=state, form="dense")

    return build


def training_candidates() -> list[Candidate]:
    return [
        Candidate(
            "safe_lookup",
            "safe_embedding_lookup_sparse + TF sparse Adagrad",
            anchor_candidate(sparse=True),
            role="anchor",
        ),
        Candidate(
            "raw_xla",
            "gathers + model under XLA, TF sparse Adagrad",
            anchor_candidate(sparse=False),
            role="anchor",
        ),
        Candidate(
            "keras_embedding_xla",
            "keras.layers.Embedding, Keras Adagrad, jit_compile",
            keras_candidate("keras_embedding_xla"),
            role="peer",
        ),
        Candidate(
            "dense_head_xla",
            "raw_xla's dense model alone (embeddings fixed): the bound",
            dense_head_candidate(),
            role="bound",
        ),
        Candidate("kte_cpu", "host path", keras_candidate("kte_cpu")),
        Candidate(
            "kte_tensor_core_xla",
            "tpu_tensor_core columns, XLA",
            keras_candidate("kte_tensor_core_xla"),
        ),
    ]


# ------------------------------------------------------------------ serving


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--row-cap", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--skip-serving", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated candidates (e.g. kte_cpu): measures them in a "
        "process of their own, for an RSS that no other candidate's freed "
        "memory hides (no anchor, so no paired ratio)",
    )
    args = parser.parse_args(argv)
    tf.get_logger().setLevel("ERROR")
    spec = W.criteo_workload(quick=args.quick, row_cap=args.row_cap)
    batches = W.make_criteo_batches(spec)
    chosen = training_candidates()
    if args.only:
        names = args.only.split(",")
        chosen = [c for c in chosen if c.name in names]
    records = measure.measure(
        chosen,
        spec,  # type: ignore[arg-type]
        batches,  # type: ignore[arg-type]
        args.rounds,
        args.steps,
        warmup=1 if args.quick else 3,
        check=False,
    )
    for record in records.values():
        record.pop("step_times_s", None)
    result: dict[str, Any] = {
        "workload": "W4",
        "spec": {
            "row_cap": spec.row_cap,
            "dim": spec.dim,
            "batch_size": spec.batch_size,
            "cardinalities": list(spec.cardinalities()),
        },
        "table_bytes": spec.table_bytes(),
        "training": records,
    }
    if not args.skip_serving:
        result["serving"] = serving_latency(
            spec, batches, args.rounds, args.calls
        )
    text = report(result)
    if args.json:
        # `run.py` reads the last line of stdout as this process's result.
        result["table"] = text
        print(text, file=sys.stderr, flush=True)
        measure.emit(result)
    else:
        print(text, flush=True)


if __name__ == "__main__":
    main()
