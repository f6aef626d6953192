"""Keras 2 candidates: feature columns in `DenseFeatures`, and TFRS.

Runs as its own process with `TF_USE_LEGACY_KERAS=1`, so that `tf.keras` is
`tf_keras` (Keras 2), where `DenseFeatures`, `SequenceFeatures` and
`tensorflow_recommenders` live; prints one JSON line like `candidates.py`.

- `dense_features` (W1): `tf.feature_column` embedding columns in
  `DenseFeatures`, the sequences as shared sequence columns in
  `SequenceFeatures` (truncated to 20 in the graph). Shared embedding columns
  exist only in graph mode, so this one runs in a `tf.compat.v1.Session`,
  as TF1 input pipelines did, with each batch's ids as graph constants;
  a step fetches a scalar that reads every output row (a few microseconds).
- `tfrs` (W1, W2): `tfrs.layers.embedding.TPUEmbedding`, which on CPU keeps
  its tables as ordinary trainable variables; W2 trains them with the
  `tf_keras` Adagrad of the model, as its documentation says to on CPU.
"""

from __future__ import annotations

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import anchors  # noqa: E402
from benchmarks import measure  # noqa: E402
from benchmarks import tensors  # noqa: E402
from benchmarks import workloads  # noqa: E402
from benchmarks.measure import Built  # noqa: E402
from benchmarks.measure import Candidate  # noqa: E402

SEQ = workloads.SEQUENCE_FEATURES


def _columns(spec: workloads.Workload) -> tuple[list[Any], list[Any]]:
    fc = tf.feature_column
    identity = fc.categorical_column_with_identity
    own = [
        fc.embedding_column(identity("bag", spec.rows), spec.bag_dim, "mean"),
        fc.embedding_column(
            identity("single", spec.single_rows), spec.single_dim, "mean"
        ),
    ]
    shared = fc.shared_embeddings(
        [
            fc.sequence_categorical_column_with_identity(n, spec.rows)
            for n in SEQ
        ],
        spec.seq_dim,
        combiner="mean",
    )
    return own, shared


def _truncated(ids: tf.SparseTensor) -> tf.SparseTensor:
    kept = tf.sparse.retain(
        ids, ids.indices[:, 1] < workloads.MAX_SEQUENCE_LENGTH
    )
    return tf.SparseTensor(
        kept.indices,
        kept.values,
        [ids.dense_shape[0], workloads.MAX_SEQUENCE_LENGTH],
    )


def dense_features(
    spec: workloads.Workload, batches: list[workloads.Batch], context: dict
) -> Built:
    graph = tf.Graph()
    with graph.as_default():
        own, shared = _columns(spec)
        dense = tf.keras.layers.DenseFeatures(own)
        sequences = tf.keras.experimental.SequenceFeatures(shared)
        fetches = []
        for batch in batches:
            features = tensors.to_tensors(batch, "sparse").features
            for name in SEQ:
                features[name] = _truncated(features[name])
            pooled = dense(features)
            sequence, _ = sequences(features)
            outputs = {
                "bag": pooled[:, : spec.bag_dim],
                "single": pooled[:, spec.bag_dim :],
            }
            for index, name in enumerate(SEQ):
                part = slice(index * spec.seq_dim, (index + 1) * spec.seq_dim)
                outputs[name] = sequence[:, :, part]
            # Grappler prunes lookups that only feed a `tf.group`: fetch a
            # scalar that reads one float of every output row instead.
            touch = tf.reduce_sum(pooled[:, 0]) + tf.reduce_sum(
                sequence[:, :, 0]
            )
            fetches.append((touch, outputs))
        variables = tf.compat.v1.global_variables()
        session = tf.compat.v1.Session(graph=graph)
        session.run(tf.compat.v1.global_variables_initializer())

    def by_table(name: str) -> str:
        if "shared" in name:
            return "seq"
        return "bag" if "bag" in name else "single"

    def load(values: dict[str, np.ndarray]) -> None:
        with graph.as_default():
            for variable in variables:
                variable.load(values[by_table(variable.name)], session)

    return Built(
        step=lambda i: session.run(fetches[i % len(fetches)][0]),
        state_bytes=sum(
            int(np.prod(v.shape)) * v.dtype.size for v in variables
        ),
        form="sparse",
        outputs=lambda i: session.run(fetches[i % len(fetches)][1]),
        load_tables=load,
    )


def _tfrs_layer(spec: workloads.Workload) -> Any:
    # Only the tfrs candidate needs it: the others run without it.
    import tensorflow_recommenders as tfrs

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
            tables["seq"], max_sequence_length=workloads.MAX_SEQUENCE_LENGTH
        )
    optimizer = embedding.Adagrad(
        workloads.LEARNING_RATE,
        initial_accumulator_value=workloads.INITIAL_ACCUMULATOR,
    )
    return tfrs.layers.embedding.TPUEmbedding(features, optimizer)


def tfrs_candidate(
    spec: workloads.Workload, batches: list[workloads.Batch], context: dict
) -> Built:
    layer = _tfrs_layer(spec)
    data = tensors.all_tensors(batches, "ragged")
    if not spec.training:
        layer(data[0].features)
        run = tf.function(layer.__call__, reduce_retracing=True)

        def step(i: int) -> Any:
            return run(data[i % len(data)].features)

        tables = {
            config.name: variable
            for config, variable in layer.embedding_tables.items()
        }

        def load(values: dict[str, np.ndarray]) -> None:
            for name, variable in tables.items():
                variable.assign(values[name])

        return Built(
            step=step,
            state_bytes=sum(int(np.prod(v.shape)) * 4 for v in tables.values()),
            form="ragged",
            outputs=lambda i: tensors.numpy_outputs(step(i)),
            load_tables=load,
        )
    keras2 = tf.keras
    inputs = {
        name: keras2.Input((None,), dtype=tf.int64, name=name, ragged=True)
        for name in data[0].features
    }
    inputs.update(
        {
            f"{n}_length": keras2.Input((), dtype=tf.int64, name=f"{n}_length")
            for n in SEQ
        }
    )
    activations = layer({k: inputs[k] for k in data[0].features})
    pool = keras2.layers.Lambda(lambda a: tensors.mean_over_length(*a))
    parts = [activations["bag"], activations["single"]] + [
        pool([activations[n], inputs[f"{n}_length"]]) for n in SEQ
    ]
    hidden = keras2.layers.Dense(workloads.HIDDEN, activation="relu")(
        keras2.layers.Concatenate()(parts)
    )
    model = keras2.Model(inputs, keras2.layers.Dense(1)(hidden))
    model.compile(
        keras2.optimizers.Adagrad(
            workloads.LEARNING_RATE,
            initial_accumulator_value=workloads.INITIAL_ACCUMULATOR,
        ),
        keras2.losses.BinaryCrossentropy(from_logits=True),
    )
    samples = []
    for batch in data:
        x = dict(batch.features)
        x.update({f"{n}_length": v for n, v in batch.lengths.items()})
        samples.append((x, batch.labels))

    def train(i: int) -> Any:
        return model.train_on_batch(*samples[i % len(samples)])

    train(0)
    variables = model.weights + model.optimizer.variables()
    return Built(
        step=train,
        state_bytes=sum(
            int(np.prod(v.shape)) * v.dtype.size for v in variables
        ),
        form="ragged",
    )


def families(spec: workloads.Workload) -> dict[str, list[Candidate]]:
    tfrs = Candidate(
        "tfrs",
        "tensorflow_recommenders TPUEmbedding layer (CPU), ragged ids",
        tfrs_candidate,
    )
    if spec.training:
        return {"legacy": [tfrs]}
    return {
        "legacy": [
            Candidate(
                "dense_features",
                "tf_keras DenseFeatures/SequenceFeatures + feature columns",
                dense_features,
            ),
            tfrs,
        ]
    }


if __name__ == "__main__":
    measure.process_main(families, anchors.candidates)
