"""W4 serving: the package's exports and the fastest peer's, loaded and
called at batch 1, 64 and 4,096 in rotating rounds (`criteo.py`).

`kte_cpu` is the default export; `kte_cpu_xla` the same with
`jit_compile=True` (the DLRM interaction and MLP as one XLA program, the
lookups checked apart), as the peer compiles its whole model."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_tpu_embed as kte  # noqa: E402
from benchmarks import workloads  # noqa: E402
from benchmarks.criteo_models import keras_model  # noqa: E402
from benchmarks.criteo_models import kte_model  # noqa: E402
from benchmarks.criteo_models import model_data  # noqa: E402

W = workloads


OURS = ("kte_cpu", "kte_cpu_xla")
PEER = "keras_embedding_xla"
ANSWER_TOLERANCE = 1e-4
"""Largest |difference| from the peer's answer (logits) that still counts
as the same model."""


def same_weights(source: keras.Model, target: keras.Model) -> None:
    """Gives the peer's model `target` the tables and dense weights of our
    `source`, so that the exports timed against each other compute one
    function (their answers are compared before any timing)."""
    layer = source.get_layer("criteo")
    for spec in layer.local_table_specs:
        target.get_layer(f"{spec.name}_table").set_weights(
            [layer.table_variable(spec.name).numpy()]
        )
    ours = [x for x in source.layers if isinstance(x, keras.layers.Dense)]
    theirs = [x for x in target.layers if isinstance(x, keras.layers.Dense)]
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for mine, peer in zip(ours, theirs, strict=True):
        peer.set_weights(mine.get_weights())


def export_kte(spec: W.CriteoWorkload, path: str, jit: bool = False) -> None:
    keras.utils.set_random_seed(W.SEED)
    model = kte_model(spec, "cpu")
    kte.export_saved_model(
        model,
        path,
        inputs="ids",
        lookup_device="cpu",
        verbose=False,
        jit_compile=jit,
    )


def export_keras(spec: W.CriteoWorkload, path: str) -> None:
    keras.utils.set_random_seed(W.SEED)
    source = kte_model(spec, "cpu")
    model = keras_model(spec, jit=True)
    same_weights(source, model)
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
    """p50 / p99 per batch size of the loaded exports, and each of ours
    paired with the peer (`x_peer`: the median over rounds of the peer's
    median call time over ours)."""
    directory = tempfile.mkdtemp(prefix="criteo_")
    served: dict[str, Any] = {}
    for name, export in (
        ("kte_cpu", export_kte),
        ("kte_cpu_xla", lambda s, p: export_kte(s, p, jit=True)),
        (PEER, export_keras),
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
        answers = {}
        for name, call in served.items():
            for _ in range(3):
                (answer,) = call(**batch).values()
                answers[name] = answer.numpy()
        # Speed never changes an answer: exports that disagree are not
        # compared (float32; XLA may reorder sums, hence not bit for bit).
        differences = {
            name: float(np.max(np.abs(answers[name] - answers[PEER])))
            for name in OURS
        }
        if max(differences.values()) > ANSWER_TOLERANCE:
            raise AssertionError(
                f"batch {size}: the exports disagree with the peer's "
                f"(max |difference| by export: {differences}); their "
                "times would compare different models."
            )
        names = list(served)
        count = calls if size < 4096 else max(calls // 4, 3)
        for index in range(rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
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
        results[str(size)]["max_difference"] = differences
        results[str(size)]["x_peer"] = {
            name: statistics.median(
                p / o for p, o in zip(medians[PEER], medians[name])
            )
            for name in OURS
        }
        print(f"served batch {size}", file=sys.stderr, flush=True)
    return results
