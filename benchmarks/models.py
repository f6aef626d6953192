"""The models that candidates and exports build for a workload.

`kte_layers` gives this package's layers for the workload's columns,
`kte_call` and `kte_tables` call them and reach their tables by feature
(bag / single / seq); `PaddedEmbeddings` is the Keras 3 peer: one
`keras.layers.Embedding` per table on padded ids.
"""

from __future__ import annotations

from typing import Any

import keras

import keras_tpu_embed as kte
from benchmarks import workloads

SEQ = workloads.SEQUENCE_FEATURES
MAX_LEN = workloads.MAX_SEQUENCE_LENGTH


def kte_layers(
    spec: workloads.Workload, device: str | None
) -> list[kte.TPUEmbeddingLayer]:
    """The workload's columns: a `TPUEmbeddingLayer` and a shared one."""

    def shape(width: int) -> Any:
        return [None, width] if device else None

    identity = kte.categorical_column_with_identity
    sequence = kte.sequence_categorical_column_with_identity
    config = kte.EmbeddingConfig(
        optimizer=kte.optimizers.Adagrad(
            workloads.LEARNING_RATE,
            initial_accumulator_value=workloads.INITIAL_ACCUMULATOR,
        )
    )
    own = [
        kte.embedding_column(
            identity("bag", spec.rows),
            spec.bag_dim,
            combiner="mean",
            embedding_lookup_device=device,
            tensor_core_shape=shape(workloads.BAG_MAX),
        ),
        kte.embedding_column(
            identity("single", spec.single_rows),
            spec.single_dim,
            combiner="mean",
            embedding_lookup_device=device,
            tensor_core_shape=shape(1),
        ),
    ]
    shared = kte.shared_embedding_columns(
        [sequence(name, spec.rows) for name in SEQ],
        spec.seq_dim,
        combiner="mean",
        max_sequence_lengths=[MAX_LEN] * len(SEQ),
        embedding_lookup_device=device,
        tensor_core_shape=shape(MAX_LEN),
    )
    return [
        kte.TPUEmbeddingLayer(own, config=config, name="own"),
        kte.SharedTPUEmbedding(shared, config=config, name="shared"),
    ]


def kte_call(
    layers: list[Any], features: dict[str, Any], training: bool
) -> Any:
    """The layers' activations of `features`, keyed by feature."""
    out = {}
    for layer in layers:
        keys = {c.feature_key for c in layer.columns}
        values = layer({k: features[k] for k in keys}, training=training)
        for column in layer.columns:
            out[column.feature_key] = values[column.name]
    return out


def kte_tables(layers: list[Any], slot: str | None = None) -> dict[str, Any]:
    """The layers' table (or `slot`) variables, keyed bag / single / seq."""
    tables = {}
    for layer in layers:
        for table in layer.table_specs:
            key = table.columns[0].feature_key
            key = "seq" if key in SEQ else key
            if slot is None:
                tables[key] = layer.table_variable(table.name)
            else:
                tables[key] = layer.slot_variables(table.name)[slot]
    return tables


class PaddedEmbeddings(keras.layers.Layer):
    """`keras.layers.Embedding` per table on padded ids, masked combiners."""

    def __init__(self, spec: workloads.Workload, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tables = {
            name: keras.layers.Embedding(rows, dim, name=name)
            for name, (rows, dim) in spec.table_shapes().items()
        }

    def _masked(self, table: str, ids: Any) -> tuple[Any, Any]:
        mask = keras.ops.expand_dims(keras.ops.cast(ids >= 0, "float32"), -1)
        rows = self.tables[table](keras.ops.maximum(ids, 0))
        return rows * mask, mask

    def call(self, features: dict[str, Any]) -> dict[str, Any]:
        rows, mask = self._masked("bag", features["bag"])
        out = {
            "bag": keras.ops.divide_no_nan(
                keras.ops.sum(rows, 1), keras.ops.sum(mask, 1)
            ),
            "single": self.tables["single"](features["single"]),
        }
        for name in SEQ:
            out[name] = self._masked("seq", features[name])[0]
        return out
