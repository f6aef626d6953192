"""Keras 3 candidates: this package and the Keras 3 peers.

One function per candidate builds it for a workload and returns a `Built`.
Lookups (W1) are timed as a call of the layer(s) with `training=False` inside
a `tf.function`, compiled with XLA where the candidate's path supports it;
training (W2, W3) as `model.train_on_batch` on the W2 model, compiled with
`jit_compile` chosen explicitly (Keras' "auto" turns XLA off on CPU).

Run as a process of its own per family (`python benchmarks/candidates.py
--family kte --workload W1`): it measures the anchor and bound of
`anchors.py` first, then the family, and prints one JSON line.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import anchors  # noqa: E402
from benchmarks import measure  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks import serving_candidates  # noqa: E402
from benchmarks import tensors  # noqa: E402
from benchmarks import workloads  # noqa: E402
from benchmarks.measure import Built  # noqa: E402
from benchmarks.measure import Candidate  # noqa: E402

SEQ = workloads.SEQUENCE_FEATURES
MAX_LEN = workloads.MAX_SEQUENCE_LENGTH


def _inputs(example: tensors.TensorBatch, form: str) -> dict[str, Any]:
    """`keras.Input`s for the features and sequence lengths of a batch."""
    out = {}
    for name, value in example.features.items():
        out[name] = keras.Input(
            value.shape[1:],
            dtype="int64",
            name=name,
            sparse=form == "sparse",
            ragged=form == "ragged",
        )
    for name in SEQ:
        out[f"{name}_length"] = keras.Input(
            (), dtype="int64", name=f"{name}_length"
        )
    return out


def _model_inputs(batch: tensors.TensorBatch) -> dict[str, Any]:
    inputs = dict(batch.features)
    inputs.update({f"{n}_length": v for n, v in batch.lengths.items()})
    return inputs


class MeanOverLength(keras.layers.Layer):
    """`[batch, 20, dim]` and lengths -> mean over the valid positions."""

    def call(self, sequence: Any, length: Any) -> Any:
        return tensors.mean_over_length(sequence, length)


def _train_model(
    activations: dict[str, Any], inputs: dict[str, Any], jit: bool
) -> keras.Model:
    """The W2 model on top of the four activations, compiled."""
    parts = [activations["bag"], activations["single"]] + [
        MeanOverLength()(activations[n], inputs[f"{n}_length"]) for n in SEQ
    ]
    hidden = keras.layers.Dense(workloads.HIDDEN, activation="relu")(
        keras.layers.Concatenate()(parts)
    )
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(
        keras.optimizers.Adagrad(
            workloads.LEARNING_RATE,
            initial_accumulator_value=workloads.INITIAL_ACCUMULATOR,
        ),
        keras.losses.BinaryCrossentropy(from_logits=True),
        jit_compile=jit,
    )
    return model


def _state_bytes(model: keras.Model) -> int:
    variables = list(model.weights) + list(model.optimizer.variables)
    return sum(int(np.prod(v.shape)) * 4 for v in variables)


def _trainer(
    model: keras.Model, batches: list[tensors.TensorBatch], form: str
) -> Built:
    data = [(_model_inputs(b), b.labels) for b in batches]

    def step(i: int) -> Any:
        return model.train_on_batch(*data[i % len(data)])

    step(0)  # Builds the optimizer, so that its slots count as state.
    return Built(step=step, state_bytes=_state_bytes(model), form=form)


def _server(
    call: Any,
    batches: list[tensors.TensorBatch],
    form: str,
    jit: bool,
    state_bytes: int,
    tables: dict[str, Any],
) -> Built:
    run = tf.function(call, jit_compile=jit, reduce_retracing=True)

    def step(i: int) -> Any:
        return run(batches[i % len(batches)].features)

    def load(values: dict[str, np.ndarray]) -> None:
        for name, variable in tables.items():
            variable.assign(values[name])

    return Built(
        step=step,
        state_bytes=state_bytes,
        form=form,
        outputs=lambda i: tensors.numpy_outputs(step(i)),
        load_tables=load,
    )


# --------------------------------------------------------------- this package


def kte_candidate(device: str | None, form: str) -> Any:
    jit = device == "tpu_tensor_core"

    def build(
        spec: workloads.Workload, batches: list[workloads.Batch], context: dict
    ) -> Built:
        layers = models.kte_layers(spec, device)
        data = tensors.all_tensors(batches, form)
        if spec.training:
            inputs = _inputs(data[0], form)
            model = _train_model(
                models.kte_call(layers, inputs, None), inputs, jit
            )
            built = _trainer(model, data, form)
            # The TensorFlow variables, for W3's bound on the same tables.
            built.tables = {
                k: v.value for k, v in models.kte_tables(layers).items()
            }
            built.slots = {
                k: v.value
                for k, v in models.kte_tables(layers, "accumulators").items()
            }
            return built
        for layer in layers:
            layer.build()
        tables = models.kte_tables(layers)
        state = sum(int(np.prod(v.shape)) * 4 for v in tables.values())
        return _server(
            lambda f: models.kte_call(layers, f, False),
            data,
            form,
            jit,
            state,
            tables,
        )

    return build


# ------------------------------------------------------------------- Keras 3


def keras_embedding(jit: bool) -> Any:
    def build(
        spec: workloads.Workload, batches: list[workloads.Batch], context: dict
    ) -> Built:
        layer = models.PaddedEmbeddings(spec)
        data = tensors.all_tensors(batches, "dense")
        if spec.training:
            inputs = _inputs(data[0], "dense")
            features = {k: inputs[k] for k in data[0].features}
            model = _train_model(layer(features), inputs, jit)
            return _trainer(model, data, "dense")
        layer(data[0].features)
        tables = {n: t.embeddings for n, t in layer.tables.items()}
        state = sum(int(np.prod(v.shape)) * 4 for v in tables.values())
        return _server(layer, data, "dense", jit, state, tables)

    return build


class KerasRsEmbeddings(keras.layers.Layer):
    """`keras_rs.layers.DistributedEmbedding` on padded ids with weights.

    The weights (1 for an id, 0 for padding) make its "mean" combiner a
    masked mean; sequences are fed as `[batch, 20, 1]` so that each
    position is combined alone and comes out `[batch, 20, dim]`.
    """

    def __init__(self, spec: workloads.Workload, **kwargs: Any) -> None:
        # Only the keras_rs family needs it: the other families run
        # where it is not installed.
        import keras_rs

        super().__init__(**kwargs)
        rs = keras_rs.layers
        tables = {
            name: rs.TableConfig(
                name=name,
                vocabulary_size=rows,
                embedding_dim=dim,
                combiner="mean",
                placement="default_device",
            )
            for name, (rows, dim) in spec.table_shapes().items()
        }
        size = spec.batch_size
        features = {
            "bag": rs.FeatureConfig(
                name="bag",
                table=tables["bag"],
                input_shape=(size, workloads.BAG_MAX),
                output_shape=(size, spec.bag_dim),
            ),
            "single": rs.FeatureConfig(
                name="single",
                table=tables["single"],
                input_shape=(size,),
                output_shape=(size, spec.single_dim),
            ),
        }
        for name in SEQ:
            features[name] = rs.FeatureConfig(
                name=name,
                table=tables["seq"],
                input_shape=(size, MAX_LEN, 1),
                output_shape=(size, MAX_LEN, spec.seq_dim),
            )
        self.embedding = rs.DistributedEmbedding(features)

    def call(self, features: dict[str, Any]) -> dict[str, Any]:
        ids, weights = {}, {}
        for name, value in features.items():
            if name == "single":
                ids[name] = value
                weights[name] = keras.ops.ones_like(value, "float32")
                continue
            if name in SEQ:
                value = keras.ops.expand_dims(value, -1)
            ids[name] = keras.ops.maximum(value, 0)
            weights[name] = keras.ops.cast(value >= 0, "float32")
        return self.embedding(ids, weights)

    def tables(self) -> dict[str, Any]:
        layers = self.embedding._default_device_embedding_layers
        return {
            "bag": layers["bag"].embeddings,
            "single": layers["single"].embeddings,
            "seq": layers[SEQ[0]].embeddings,
        }


def keras_rs_candidate(
    spec: workloads.Workload, batches: list[workloads.Batch], context: dict
) -> Built:
    layer = KerasRsEmbeddings(spec)
    data = tensors.all_tensors(batches, "dense")
    if spec.training:
        inputs = _inputs(data[0], "dense")
        features = {k: inputs[k] for k in data[0].features}
        model = _train_model(layer(features), inputs, jit=False)
        return _trainer(model, data, "dense")
    layer(data[0].features)
    tables = layer.tables()
    state = sum(int(np.prod(v.shape)) * 4 for v in tables.values())
    return _server(layer, data, "dense", False, state, tables)


# ------------------------------------------------------------------ families


def families(spec: workloads.Workload) -> dict[str, list[Candidate]]:
    """Candidates by family; each family is measured in a process of its own."""
    if spec.name == "W3":
        quick = spec.batch_size < workloads.Workload.batch_size
        rows = workloads.QUICK_SCALE_ROWS if quick else workloads.SCALE_ROWS
        return {
            "kte": scale_candidates(None, "dense", rows, quick),
            "kte_tensor_core": scale_candidates(
                "tpu_tensor_core", "dense", rows, quick
            ),
        }
    kte_forms = ["ragged", "dense"]
    return {
        "tf": anchors.tf_candidates(spec),
        "kte": [
            Candidate(
                f"kte_cpu_{form}",
                f"this package, cpu path (sparse host lookup), {form} ids",
                kte_candidate(None, form),
            )
            for form in kte_forms
        ]
        + [
            Candidate(
                "kte_tensor_core_xla",
                "this package, tensor-core path (padded dense) under XLA",
                kte_candidate("tpu_tensor_core", "dense"),
            )
        ]
        + (serving_candidates.candidates()[0] if not spec.training else [])
        + paired_peers(spec),
        "keras": [
            Candidate(
                "keras_embedding",
                "keras.layers.Embedding on padded ids, no XLA",
                keras_embedding(jit=False),
            ),
            Candidate(
                "keras_embedding_xla",
                "keras.layers.Embedding on padded ids, jit_compile=True",
                keras_embedding(jit=True),
            ),
        ],
        "keras_rs": [
            Candidate(
                "keras_rs",
                "keras_rs.layers.DistributedEmbedding, default_device",
                keras_rs_candidate,
            )
        ],
    }


def paired_peers(spec: workloads.Workload) -> list[Candidate]:
    """The fastest peers again, in the package's own process (role
    "peer": not in the table), so that the targets are ratios paired round
    by round in one process; across processes the anchors themselves drift
    by 10-20% here. W1: `raw_xla` and `keras_embedding_xla`; W2: `raw_xla`
    (the training target is against the plain-TensorFlow anchors)."""
    raw = [c for c in anchors.tf_candidates(spec) if c.name == "raw_xla"]
    peers = [
        Candidate(c.name, c.description, c.build, role="peer") for c in raw
    ]
    if not spec.training:
        peers.append(
            Candidate(
                "keras_embedding_xla",
                "keras.layers.Embedding on padded ids, jit_compile=True",
                keras_embedding(jit=True),
                role="peer",
            )
        )
    return peers


def scale_candidates(
    device: str | None, form: str, rows: Any, quick: bool
) -> list[Candidate]:
    """W3: the package's W2 at each vocabulary size, in one process.

    After each size, its gather bound on the same tables: the random-row
    traffic of the update, which no implementation avoids, so that the
    ratio of the bounds shows what the memory hierarchy alone costs when
    the tables grow from cache-resident to far beyond it.
    """
    cache: dict[int, Any] = {}

    def data(size: int) -> Any:
        if size not in cache:
            scaled = workloads.workload("W2", quick=quick, rows=size)
            cache[size] = (scaled, workloads.make_batches(scaled))
        return cache[size]

    def at(size: int) -> Any:
        def build(spec: Any, batches: Any, context: dict) -> Built:
            return kte_candidate(device, form)(*data(size), context)

        return build

    def bound(size: int) -> Any:
        def build(spec: Any, batches: Any, context: dict) -> Built:
            return anchors.gather_bound(*data(size), context["previous"])

        return build

    path = "tensor_core_xla" if device else f"cpu_{form}"
    out = []
    for size in rows:
        out.append(Candidate(f"kte_{path}@{size}", f"rows={size}", at(size)))
        out.append(
            Candidate(
                f"gather_bound_{path}@{size}",
                f"gather + scatter of each distinct row, rows={size}",
                bound(size),
                role="bound",
            )
        )
    return out


def notes(spec: workloads.Workload, family: str) -> dict[str, str]:
    """Why a candidate of `family` is not measured, by name."""
    if spec.name != "W1" or family not in ("kte", "all"):
        return {}
    return serving_candidates.candidates()[1]


if __name__ == "__main__":
    measure.process_main(families, anchors.candidates, notes)
