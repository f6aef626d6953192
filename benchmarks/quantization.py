"""The demo's held-out AUC through float32, bfloat16 and int8 exports.

Trains the ranker of `keras_tpu_embed.demo` once (its click log, columns,
model and input pipeline, same seeds), exports it with each table dtype,
loads each export with plain `tf.saved_model.load`, scores the same
held-out raw examples through `serving_default` and computes the AUC of
each (Keras' `AUC`, the metric the demo prints). Reports each export's AUC,
its difference from the float32 export's, its max abs score difference from
the float32 export, and its SavedModel size.

Run as a process of its own (`run.py` does): prints one JSON line.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_tpu_embed as kte  # noqa: E402
from benchmarks import exports  # noqa: E402
from benchmarks import measure  # noqa: E402
from keras_tpu_embed import demo  # noqa: E402


def train(
    directory: str, examples: int, epochs: int
) -> tuple[Any, Any, dict[str, Any], np.ndarray]:
    """The demo's model trained as `demo.run` trains it; held-out data."""
    keras.utils.set_random_seed(0)
    features, labels = demo.make_click_log(examples)
    split = int(0.8 * examples)
    train_set = ({k: v[:split] for k, v in features.items()}, labels[:split])
    held_out = {k: v[split:] for k, v in features.items()}
    own, shared = demo.build_columns(demo.write_user_vocabulary(directory))
    preprocessor = kte.FeaturePreprocessor(own + shared)
    model = demo.build_model(preprocessor, own, shared)
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3), loss="binary_crossentropy"
    )
    model.fit(
        demo.batched_dataset(preprocessor, *train_set, 256, shuffle=True),
        epochs=epochs,
        verbose=0,
    )
    return model, preprocessor, held_out, labels[split:]


def served_scores(path: str, held_out: dict[str, Any]) -> np.ndarray:
    serve = tf.saved_model.load(path).signatures["serving_default"]
    raw = {
        k: tf.constant(v, tf.int64 if v.dtype == np.int64 else None)
        for k, v in held_out.items()
    }
    return np.asarray(serve(**raw)["click"])[:, 0]


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    metric = keras.metrics.AUC()
    metric.update_state(labels, scores[:, None])
    return float(metric.result())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=80_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.epochs = 4_000, 1
    quantized, skipped = exports.quantized_dtypes()
    directory = tempfile.mkdtemp(prefix="quantization_")
    print("quantization: training the demo", file=sys.stderr, flush=True)
    model, preprocessor, held_out, labels = train(
        directory, args.examples, args.epochs
    )
    results: dict[str, Any] = {}
    reference = None
    for dtype in ("float32",) + quantized:
        path = os.path.join(directory, dtype)
        extra = {} if dtype == "float32" else {"table_dtype": dtype}
        try:
            kte.export_saved_model(
                model, path, preprocessor=preprocessor, **extra
            )
            scores = served_scores(path, held_out)
        except Exception as error:  # noqa: BLE001
            # Reported as failed, with its error, beside the others.
            results[dtype] = {"error": measure.describe(error)}
            continue
        if reference is None:
            reference = scores
        results[dtype] = {
            "auc": auc(labels, scores),
            "saved_model_bytes": exports.directory_bytes(path),
            "max_abs_score_diff": float(np.max(np.abs(scores - reference))),
        }
    for record in results.values():
        if "error" in record or "error" in results["float32"]:
            continue
        record["auc_diff"] = record["auc"] - results["float32"]["auc"]
        record["size_ratio"] = (
            record["saved_model_bytes"]
            / results["float32"]["saved_model_bytes"]
        )
    measure.emit(
        {
            "workload": "quantization",
            "examples": args.examples,
            "epochs": args.epochs,
            "held_out": len(labels),
            "quantized_skipped": skipped,
            "demo": results,
        }
    )


if __name__ == "__main__":
    main()
