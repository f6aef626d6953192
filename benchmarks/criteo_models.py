"""W4's models: the DLRM-like model on this package's layer or on Keras
`Embedding`s, and the batches as the models take them (`criteo.py`)."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte
from benchmarks import workloads

W = workloads


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


def model_inputs(spec: W.CriteoWorkload) -> dict[str, Any]:
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
    inputs = model_inputs(spec)
    out = layer({name: inputs[name] for name in spec.features()})
    embeddings = [out[column.name] for column in columns]
    return dlrm_model(inputs, embeddings, jit=device == "tpu_tensor_core")


def keras_model(spec: W.CriteoWorkload, jit: bool) -> keras.Model:
    inputs = model_inputs(spec)
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
