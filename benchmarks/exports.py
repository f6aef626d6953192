"""SavedModels of the W1 lookups: this package's exports and the peers'.

Every export serves the W1 features from one signature, `serving_default`,
fed dense int64 ids padded with -1: `bag` `[b, 15]`, `single` `[b, 1]`,
`seq_a` / `seq_b` `[b, 20]`; it returns the activations keyed by feature.
All of them hold the same table values (`measure.table_values`), so their
outputs can be compared with one float32 reference computed in numpy.

- `kte_<device>[_<dtype>]`: a Keras model of the package's layers written by
  `kte.export_saved_model(..., lookup_device=device, table_dtype=dtype)`.
- `keras_embedding[_xla]`: `keras.layers.Embedding` per table on padded ids
  with masked combiners, in a `tf.function` (`jit_compile` off / on) saved
  with `tf.saved_model.save`.
- `tpu_embedding_for_serving`: `tf.tpu.experimental.embedding`'s
  `TPUEmbeddingForServing` in a `tf.Module`, its ids made ragged in the
  signature (its faster input form in W1).

Each is written by a process of its own (`export_apart`), loaded back
with plain `tf.saved_model.load`, and the caller keeps the loaded object
alive and calls its signature.

    python benchmarks/exports.py NAME PATH
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import subprocess
import sys
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_tpu_embed as kte  # noqa: E402
from benchmarks import measure  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks import workloads  # noqa: E402

SEQ = workloads.SEQUENCE_FEATURES
MAX_LEN = workloads.MAX_SEQUENCE_LENGTH
QUANTIZED = ("bfloat16", "int8")
FEATURE_TABLE = {
    "bag": "bag",
    "single": "single",
    "seq_a": "seq",
    "seq_b": "seq",
}
"""The table each feature's activation reads (for errors per table)."""


def quantized_dtypes() -> tuple[tuple[str, ...], str]:
    """The table dtypes this package's export accepts besides float32.

    Returns the dtypes and, when there are none, why: the benchmark then
    says that the quantized candidates were not measured instead of
    pretending.
    """
    if "table_dtype" in inspect.signature(kte.export_saved_model).parameters:
        return QUANTIZED, ""
    return (), (
        "not measured: this keras_tpu_embed's export_saved_model has no "
        "table_dtype argument"
    )


def signature_specs() -> dict[str, tf.TensorSpec]:
    specs = {
        name: tf.TensorSpec([None, None], tf.int64, name=name)
        for name in ("bag",) + SEQ
    }
    specs["single"] = tf.TensorSpec([None, 1], tf.int64, name="single")
    return specs


def dense_inputs(batch: workloads.Batch, size: int, start: int) -> dict:
    """Rows `[start, start + size)` of a batch as the signature's inputs."""
    out = {}
    for name, ids in batch.features.items():
        width = 1 if name == "single" else workloads.BAG_MAX
        if name in SEQ:
            width = MAX_LEN
        out[name] = tf.constant(ids.dense(width)[start : start + size])
    return out


def reference(
    values: dict[str, np.ndarray], inputs: dict[str, Any]
) -> dict[str, np.ndarray]:
    """The float32 activations of `inputs` in numpy (float64 sums)."""
    out = {}
    for name, ids in inputs.items():
        ids = np.asarray(ids)
        table = values[FEATURE_TABLE[name]].astype(np.float64)
        mask = (ids >= 0)[..., None]
        rows = table[np.maximum(ids, 0)] * mask
        if name in SEQ:
            out[name] = rows
        else:
            out[name] = rows.sum(1) / np.maximum(mask.sum(1), 1)
    return out


def max_abs_error(
    got: dict[str, Any], want: dict[str, np.ndarray]
) -> dict[str, float]:
    """Max |got - want| per table (features reading a table pooled)."""
    errors: dict[str, float] = {}
    for name, expected in want.items():
        value = np.asarray(got[name], np.float64).reshape(expected.shape)
        error = float(np.max(np.abs(value - expected)))
        table = FEATURE_TABLE[name]
        errors[table] = max(errors.get(table, 0.0), error)
    return errors


def directory_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def _save_module(module: tf.Module, function: Any, path: str) -> None:
    concrete = function.get_concrete_function(signature_specs())
    tf.saved_model.save(module, path, signatures={"serving_default": concrete})


def export_kte(
    spec: workloads.Workload,
    values: dict[str, np.ndarray],
    path: str,
    device: str,
    table_dtype: str = "float32",
    jit: bool = False,
) -> None:
    """The package's layers in a Keras model, exported for serving (with
    `jit`, `jit_compile=True`: the whole model one XLA program)."""
    layers = models.kte_layers(spec, "tpu_tensor_core")
    inputs = {
        name: keras.Input(
            (1,)
            if name == "single"
            else (MAX_LEN if name in SEQ else workloads.BAG_MAX,),
            dtype="int64",
            name=name,
        )
        for name in signature_specs()
    }
    model = keras.Model(inputs, models.kte_call(layers, inputs, False))
    for key, variable in models.kte_tables(layers).items():
        variable.assign(values[key])
    extra = {} if table_dtype == "float32" else {"table_dtype": table_dtype}
    if "inputs" in inspect.signature(kte.export_saved_model).parameters:
        # The model takes ids (dense, as the workload feeds them).
        extra.update(inputs="ids", verbose=False)
    if jit:
        extra["jit_compile"] = True
    kte.export_saved_model(model, path, lookup_device=device, **extra)


def export_keras_embedding(
    spec: workloads.Workload,
    values: dict[str, np.ndarray],
    path: str,
    jit: bool,
) -> None:
    layer = models.PaddedEmbeddings(spec)
    module = tf.Module()
    module.layer = layer

    def serve(features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        features = dict(features)
        features["single"] = features["single"][:, 0]
        return layer(features)

    function = tf.function(serve, jit_compile=jit)
    function(dense_inputs(workloads.make_batches(spec)[0], 2, 0))
    for name, table in layer.tables.items():
        table.embeddings.assign(values[name])
    _save_module(module, function, path)


def export_tpu_embedding_for_serving(
    spec: workloads.Workload, values: dict[str, np.ndarray], path: str
) -> None:
    embedding = tf.tpu.experimental.embedding
    tables = {
        name: embedding.TableConfig(rows, dim, combiner="mean", name=name)
        for name, (rows, dim) in spec.table_shapes().items()
    }
    features = {
        "bag": embedding.FeatureConfig(tables["bag"]),
        "single": embedding.FeatureConfig(tables["single"]),
    }
    for name in SEQ:
        features[name] = embedding.FeatureConfig(
            tables["seq"], max_sequence_length=MAX_LEN
        )
    mid_level = embedding.TPUEmbeddingForServing(features, optimizer=None)
    mid_level.build()
    for config, variable in mid_level.embedding_tables.items():
        variable.assign(values[config.name])
    module = tf.Module()
    module.mid_level = mid_level

    def serve(features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        ragged = {
            name: tf.RaggedTensor.from_tensor(ids, padding=-1)
            for name, ids in features.items()
        }
        return mid_level(ragged)

    _save_module(module, tf.function(serve), path)


def exporters(quantized: tuple[str, ...]) -> dict[str, Any]:
    """Name -> `export(spec, values, path)`, this package's first."""
    out: dict[str, Any] = {
        "kte_cpu": lambda s, v, p: export_kte(s, v, p, "cpu"),
        "kte_cpu_xla": lambda s, v, p: export_kte(s, v, p, "cpu", jit=True),
        "kte_tensor_core": lambda s, v, p: export_kte(
            s, v, p, "tpu_tensor_core"
        ),
    }
    for dtype in quantized:
        out[f"kte_cpu_{dtype}"] = lambda s, v, p, d=dtype: export_kte(
            s, v, p, "cpu", d
        )
    if "int8" in quantized:
        out["kte_tensor_core_int8"] = lambda s, v, p: export_kte(
            s, v, p, "tpu_tensor_core", "int8"
        )
    out["keras_embedding"] = lambda s, v, p: export_keras_embedding(
        s, v, p, jit=False
    )
    out["keras_embedding_xla"] = lambda s, v, p: export_keras_embedding(
        s, v, p, jit=True
    )
    out["tpu_embedding_for_serving"] = export_tpu_embedding_for_serving
    return out


def export_apart(name: str, quick: bool, path: str) -> None:
    """Writes export `name` of W1 from a process of its own.

    Building the model, filling and quantizing its tables and saving them
    takes several copies of the tables; in a child process that memory is
    returned when it ends, and the caller holds only what it loads. A quick
    run's tables are tiny, and a process start costs seconds of imports:
    it exports in this process.

    Raises:
        RuntimeError: the export failed; its last line of stderr.
    """
    if quick:
        spec = workloads.workload("W1", quick=True)
        exporters(quantized_dtypes()[0])[name](
            spec, measure.table_values(spec), path
        )
        return
    command = [sys.executable, os.path.abspath(__file__), name, path]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"export {name} failed: {tail[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=export_apart.__doc__)
    parser.add_argument("name")
    parser.add_argument("path")
    args = parser.parse_args()
    spec = workloads.workload("W1")
    quantized, _ = quantized_dtypes()
    exporters(quantized)[args.name](spec, measure.table_values(spec), args.path)


class Loaded:
    """A SavedModel loaded with `tf.saved_model.load`, its files removed.

    The loaded object holds its variables in memory, so the directory can
    go once it is loaded (the disk of a long run stays small).
    """

    def __init__(self, path: str, remove: bool = True) -> None:
        self.bytes = directory_bytes(path)
        self.module = tf.saved_model.load(path)
        self.serve = self.module.signatures["serving_default"]
        if remove:
            shutil.rmtree(path, ignore_errors=True)

    def __call__(self, inputs: dict[str, tf.Tensor]) -> dict[str, Any]:
        return self.serve(**inputs)


if __name__ == "__main__":
    main()
