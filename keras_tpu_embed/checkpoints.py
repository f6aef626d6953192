"""Checkpoints interchangeable with the TPU embedding mid-level API.

`tf.tpu.experimental.embedding.TPUEmbedding` checkpoints each table as a
dependency named after the table and each slot as `<table>/<slot>` (keys
`<table>/.ATTRIBUTES/...` and `<table>.S<slot>/.ATTRIBUTES/...`). The view
built here tracks the layers' own variables under exactly those names, so
`tf.train.Checkpoint(embedding=engine_checkpoint(model))` on CPU and
`tf.train.Checkpoint(embedding=mid_level_object)` on TPU read and write the
same checkpoint. For layers built on the TPU engine (`engine.py`), the
engine's mid-level object holds the tables: `engine_checkpoint` returns it
(or tracks its variables under the same names next to the layers' own), so a
checkpoint written on TPU restores on CPU and the other way round.
"""

from __future__ import annotations

from typing import Any

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf


def _embedding_layers(model_or_layers: Any) -> list[Any]:
    from keras_tpu_embed.layers import TPUEmbeddingLayer

    if isinstance(model_or_layers, TPUEmbeddingLayer):
        return [model_or_layers]
    if isinstance(model_or_layers, keras.layers.Layer):
        return [
            layer
            for layer in model_or_layers._flatten_layers(include_self=False)
            if isinstance(layer, TPUEmbeddingLayer)
        ]
    return [
        layer for item in model_or_layers for layer in _embedding_layers(item)
    ]


def engine_checkpoint(model_or_layers: Any) -> tf.Module:
    """A trackable holding every table and slot under the engine's names.

    Args:
        model_or_layers: A Keras model, an embedding layer, or a list of
            them. Layers must be built.

    Returns:
        A `tf.Module` to put in a `tf.train.Checkpoint`; restoring into it
        writes into the layers' variables.

    Raises:
        ValueError: two layers hold tables of one name, or a layer is not
            built yet.

    Example:

    >>> item = categorical_column_with_identity("item", 10)
    >>> layer = TPUEmbeddingLayer(
    ...     [embedding_column(item, 4)],
    ...     config=EmbeddingConfig(optimizer=optimizers.Adagrad(0.1)))
    >>> layer.build()
    >>> sorted(name for name, _ in engine_checkpoint(layer).named_variables())
    ['item', 'item/accumulators']
    """
    view = tf.Module(name="embedding_engine_checkpoint")
    owners: dict[str, str] = {}
    names: list[tuple[str, Any]] = []
    layers = _embedding_layers(model_or_layers)
    if not layers:
        raise ValueError(
            "No TPUEmbeddingLayer or SharedTPUEmbedding found in "
            f"{model_or_layers!r}."
        )
    for layer in layers:
        if not layer.built:
            raise ValueError(
                f"{type(layer).__name__} '{layer.name}' is not built yet; "
                "call it on data (or `build()`) first."
            )
    engines = {
        id(layer.engine): layer.engine
        for layer in layers
        if layer.engine is not None
    }
    if len(engines) > 1:
        raise ValueError(
            "These layers are built on different TPU embedding engines "
            "(different strategies); checkpoint each model on its own."
        )
    engine = next(iter(engines.values()), None)
    local = [(layer, layer.local_table_specs) for layer in layers]
    if engine is not None and not any(tables for _, tables in local):
        # Everything is in the engine: its own object is the checkpoint,
        # which also restores into it before its first step.
        return engine.mid_level
    if engine is not None:
        children = engine.mid_level._trackable_children("checkpoint")
        if not children:
            raise ValueError(
                "The TPU embedding engine builds its tables at the first "
                "step; run one step before checkpointing a model that also "
                "has tensor-core tables."
            )
        for name, variable in children.items():
            owners[name] = "the TPU embedding engine"
            names.append((name, variable))
    for layer, tables in local:
        for table in tables:
            if table.name in owners:
                raise ValueError(
                    f"Table '{table.name}' is held by both layers "
                    f"'{owners[table.name]}' and '{layer.name}'; the TPU "
                    "engine needs one table per name."
                )
            owners[table.name] = layer.name
            names.append((table.name, layer.table_variable(table.name)))
            for slot, variable in layer.slot_variables(table.name).items():
                names.append((f"{table.name}/{slot}", variable))
    for name, variable in names:
        # Track the tf.Variable itself: that is what the engine saves.
        if isinstance(variable, keras.Variable):
            variable = variable.value
        setattr(view, name, variable)
    view.named_variables = lambda: list(names)  # type: ignore[attr-defined]
    return view
