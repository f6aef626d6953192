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
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_tpu_embed as kte  # noqa: E402
from benchmarks import anchors  # noqa: E402
from benchmarks import measure  # noqa: E402
from benchmarks import workloads  # noqa: E402
from benchmarks.measure import Built  # noqa: E402
from benchmarks.measure import Candidate  # noqa: E402

W = workloads
TRAINING_TARGET = 1.5
SERVING_TARGET = 1.0
RSS_TARGET = 1.25


def _pair_index(count: int) -> np.ndarray:
    rows, cols = np.triu_indices(count, 1)
    return rows * count + cols


def interaction(bottom: Any, embeddings: list[Any]) -> Any:
    """DLRM's dot interaction: `[bottom, dots of every pair of vectors]`."""
    ops = keras.ops
    vectors = ops.stack([bottom] + embeddings, axis=1)
    count = len(embeddings) + 1
    dots = ops.matmul(vectors, ops.transpose(vectors, (0, 2, 1)))
    flat = ops.reshape(dots, (-1, count * count))
    pairs = ops.take(flat, _pair_index(count), axis=1)
    return ops.concatenate([bottom, pairs], axis=1)


class Interaction(keras.layers.Layer):
    def call(self, bottom: Any, embeddings: list[Any]) -> Any:
        return interaction(bottom, embeddings)


def _inputs(spec: W.CriteoWorkload) -> dict[str, Any]:
    inputs = {
        name: keras.Input((1,), dtype="int64", name=name)
        for name in spec.features()
    }
    inputs["numeric"] = keras.Input((W.CRITEO_NUMERIC,), name="numeric")
    return inputs


def dlrm_model(
    inputs: dict[str, Any], embeddings: list[Any], jit: bool
) -> keras.Model:
    """The DLRM-like model on `embeddings` (`[batch, dim]` each)."""
    bottom = inputs["numeric"]
    for width in W.CRITEO_BOTTOM:
        bottom = keras.layers.Dense(width, activation="relu")(bottom)
    top = Interaction()(bottom, embeddings)
    for width in W.CRITEO_TOP:
        top = keras.layers.Dense(width, activation="relu")(top)
    model = keras.Model(inputs, keras.layers.Dense(1)(top))
    model.compile(
        keras.optimizers.Adagrad(
            W.LEARNING_RATE, initial_accumulator_value=W.INITIAL_ACCUMULATOR
        ),
        keras.losses.BinaryCrossentropy(from_logits=True),
        jit_compile=jit,
    )
    return model


def kte_model(spec: W.CriteoWorkload, device: str | None) -> keras.Model:
    identity = kte.categorical_column_with_identity
    columns = [
        kte.embedding_column(
            identity(name, rows),
            dim,
            embedding_lookup_device=device,
            tensor_core_shape=[None, 1] if device else None,
        )
        for name, (rows, dim) in spec.table_shapes().items()
    ]
    config = kte.EmbeddingConfig(
        optimizer=kte.optimizers.Adagrad(
            W.LEARNING_RATE, initial_accumulator_value=W.INITIAL_ACCUMULATOR
        )
    )
    layer = kte.TPUEmbeddingLayer(columns, config=config, name="criteo")
    inputs = _inputs(spec)
    out = layer({name: inputs[name] for name in spec.features()})
    embeddings = [out[column.name] for column in columns]
    return dlrm_model(inputs, embeddings, jit=device == "tpu_tensor_core")


def keras_model(spec: W.CriteoWorkload, jit: bool) -> keras.Model:
    inputs = _inputs(spec)
    embeddings = [
        keras.layers.Reshape((dim,))(
            keras.layers.Embedding(rows, dim, name=f"{name}_table")(
                inputs[name]
            )
        )
        for name, (rows, dim) in spec.table_shapes().items()
    ]
    return dlrm_model(inputs, embeddings, jit)


def model_data(batches: list[W.CriteoBatch]) -> list[tuple[dict, Any]]:
    """The batches as (features, labels) tensors, as the models take them."""
    out = []
    for batch in batches:
        features = {k: tf.constant(v[:, None]) for k, v in batch.ids.items()}
        features["numeric"] = tf.constant(batch.numeric)
        out.append((features, tf.constant(batch.labels)))
    return out


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
        Candidate("kte_cpu", "host path", keras_candidate("kte_cpu")),
        Candidate(
            "kte_tensor_core_xla",
            "tpu_tensor_core columns, XLA",
            keras_candidate("kte_tensor_core_xla"),
        ),
    ]


def paired(records: dict, candidate: str, anchor: str) -> float:
    """Median over rounds of the anchor's round median over the candidate's."""
    ours = records[candidate]["round_medians_s"]
    theirs = records[anchor]["round_medians_s"]
    return statistics.median(t / o for t, o in zip(theirs, ours))


# ------------------------------------------------------------------ serving


def _export_kte(spec: W.CriteoWorkload, path: str) -> None:
    model = kte_model(spec, "cpu")
    kte.export_saved_model(
        model, path, inputs="ids", lookup_device="cpu", verbose=False
    )


def _export_keras(spec: W.CriteoWorkload, path: str) -> None:
    model = keras_model(spec, jit=True)
    signature = {
        name: tf.TensorSpec([None, 1], tf.int64, name=name)
        for name in spec.features()
    }
    signature["numeric"] = tf.TensorSpec(
        [None, W.CRITEO_NUMERIC], tf.float32, name="numeric"
    )
    module = tf.Module()
    module.model = model

    @tf.function(input_signature=[signature], jit_compile=True)
    def serve(features: dict) -> Any:
        return {"output_0": model(features, training=False)}

    module.serve = serve
    tf.saved_model.save(module, path, signatures={"serving_default": serve})


def serving_latency(
    spec: W.CriteoWorkload,
    batches: list[W.CriteoBatch],
    rounds: int,
    calls: int,
) -> dict[str, Any]:
    """p50 / p99 per batch size of the two loaded exports, paired."""
    directory = tempfile.mkdtemp(prefix="criteo_")
    served: dict[str, Any] = {}
    for name, export in (
        ("kte_cpu", _export_kte),
        ("keras_embedding_xla", _export_keras),
    ):
        path = os.path.join(directory, name)
        export(spec, path)
        keras.backend.clear_session()
        served[name] = tf.saved_model.load(path).signatures["serving_default"]
    features, _ = model_data(batches[:1])[0]
    results: dict[str, Any] = {}
    sizes = [b for b in (1, 64, 4096) if b <= spec.batch_size]
    for size in sizes:
        batch = {k: v[:size] for k, v in features.items()}
        times: dict[str, list[float]] = {n: [] for n in served}
        medians: dict[str, list[float]] = {n: [] for n in served}
        for call in served.values():
            for _ in range(3):
                call(**batch)
        names = list(served)
        count = calls if size < 4096 else max(calls // 4, 3)
        for index in range(rounds):
            for name in names[index % 2 :] + names[: index % 2]:
                own = []
                for _ in range(count):
                    begin = time.perf_counter()
                    served[name](**batch)
                    own.append(time.perf_counter() - begin)
                times[name] += own
                medians[name].append(statistics.median(own))
        results[str(size)] = {
            name: {
                "p50_ms": 1e3 * float(np.percentile(times[name], 50)),
                "p99_ms": 1e3 * float(np.percentile(times[name], 99)),
            }
            for name in names
        }
        results[str(size)]["x_peer"] = statistics.median(
            p / o
            for p, o in zip(medians["keras_embedding_xla"], medians["kte_cpu"])
        )
        print(f"served batch {size}", file=sys.stderr, flush=True)
    return results


# ------------------------------------------------------------------- report


def report(result: dict[str, Any]) -> str:
    spec = result["spec"]
    records = result["training"]
    lines = [
        f"W4 (Criteo-shaped: 26 tables capped at {spec['row_cap']:,} rows, "
        f"dim {spec['dim']}, Zipf {W.ZIPF_EXPONENT}, batch "
        f"{spec['batch_size']:,}; state {result['table_bytes'] / 2**20:,.0f}"
        " MiB of tables)",
        f"{'candidate':<22}{'ms':>9}{'examples/s':>13}{'x anchor':>10}"
        f"{'RSS+MiB':>10}{'RSS/state':>11}",
    ]
    anchors_ = [
        n
        for n, r in records.items()
        if r["role"] == "anchor" and "error" not in r
    ]
    fastest = (
        min(anchors_, key=lambda n: records[n]["median_step_s"])
        if anchors_
        else None
    )

    def x_anchor(name: str) -> str:
        return (
            "-" if fastest is None else f"{paired(records, name, fastest):.2f}"
        )

    for name, record in records.items():
        if "error" in record:
            lines.append(f"{name:<22} failed: {record['error']}")
            continue
        ms = record["median_step_s"] * 1e3
        lines.append(
            f"{name:<22}{ms:>9.2f}"
            f"{spec['batch_size'] / record['median_step_s']:>13,.0f}"
            f"{x_anchor(name):>10}"
            f"{record['peak_rss_added_bytes'] / 2**20:>10,.0f}"
            f"{record['peak_rss_added_bytes'] / record['state_bytes']:>11.2f}"
        )
    targets = []
    ours = [n for n in ("kte_cpu", "kte_tensor_core_xla") if n in records]
    ours = [n for n in ours if "error" not in records[n]]
    if ours and fastest is None:
        targets.append(
            "W4 training: not measured (no anchor ran: --only), so no "
            "paired ratio"
        )
    elif ours:
        best = max(ours, key=lambda n: paired(records, n, fastest))
        ratio = paired(records, best, fastest)
        targets.append(
            f"W4 training: {best} / {fastest} (fastest anchor) = {ratio:.2f}x,"
            f" paired per round (target >= {TRAINING_TARGET}): "
            + ("met" if ratio >= TRAINING_TARGET else "NOT met")
        )
    for name in ours:
        record = records[name]
        rss = record["peak_rss_added_bytes"] / record["state_bytes"]
        targets.append(
            f"W4 RSS {name}: {rss:.2f}x state (target <= {RSS_TARGET}): "
            + ("met" if rss <= RSS_TARGET else "NOT met")
        )
    serving = result.get("serving")
    if serving:
        lines.append(
            "W4 latency (loaded SavedModels, serving_default, 1 thread)"
        )
        lines.append(
            f"{'batch':>6}  {'kte_cpu p50/p99 ms':>20}  "
            f"{'keras_embedding_xla p50/p99 ms':>31}  x peer"
        )
        for size, cell in serving.items():
            ours_cell, peer = cell["kte_cpu"], cell["keras_embedding_xla"]
            lines.append(
                f"{size:>6}  {ours_cell['p50_ms']:>9.2f} / "
                f"{ours_cell['p99_ms']:<8.2f}  {peer['p50_ms']:>14.2f} / "
                f"{peer['p99_ms']:<14.2f}  {cell['x_peer']:.2f}"
            )
            met = (
                ours_cell["p50_ms"] <= peer["p50_ms"] / SERVING_TARGET
                and ours_cell["p99_ms"] <= peer["p99_ms"] / SERVING_TARGET
            )
            targets.append(
                f"W4 serving batch {size}: kte_cpu p50 "
                f"{ours_cell['p50_ms']:.2f} / p99 {ours_cell['p99_ms']:.2f} ms "
                "vs keras_embedding_xla "
                f"{peer['p50_ms']:.2f} / {peer['p99_ms']:.2f} ms, paired "
                f"{cell['x_peer']:.2f}x (target >= {SERVING_TARGET} at p50 "
                "and p99): " + ("met" if met else "NOT met")
            )
    return "\n".join(lines + ["Targets"] + targets)


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
