"""The embedding layers' own variables in a `.keras` file, by name.

`TPUEmbeddingLayer.save_own_variables` / `load_own_variables` store the
tables, slots, step and update trigger under what they are, not under
Keras' creation-order positions.
"""

from __future__ import annotations

from typing import Any
from typing import Iterator
from typing import Protocol
from typing import Sequence

from keras_tpu_embed.tables.table_specs import TableSpec


class EmbeddingLayerState(Protocol):
    """What these functions read of an embedding layer (`layers.py`)."""

    name: str
    built: bool
    embedding_step: Any
    gradient_trap: Any

    @property
    def local_table_specs(self) -> list[TableSpec]:
        """The tables the layer holds itself."""

    def table_variable(self, table_name: str) -> Any:
        """The table's variable."""

    def slot_variables(self, table_name: str) -> dict[str, Any]:
        """The table's optimizer slots, by slot name."""


class EngineFileTables(Protocol):
    """The layer's tables on the TPU embedding engine, in a `.keras` file
    (`engines/engine.py`'s `EngineTables`)."""

    def file_values(self) -> Iterator[tuple[str, Any]]:
        """File key -> the table or slot as it is on the TPU now, one at a
        time."""

    def split_file(self, store: Any) -> tuple[Any, list[str]]:
        """A weights store as (the layer's own, the engine's keys)."""

    def load_file_values(self, store: Any, keys: Sequence[str]) -> None:
        """Loads the store's `keys` onto the TPU, one at a time."""


def _named_layer_variables(layer: EmbeddingLayerState) -> dict[str, Any]:
    """A built embedding layer's own variables, keyed by what they are.

    Tables by table name, slots as `<table>.S<slot>` (the mid-level API's
    checkpoint spelling; `/` would make HDF5 groups), then the step and
    the update trigger.
    """
    named: dict[str, Any] = {}
    for table in layer.local_table_specs:
        named[table.name] = layer.table_variable(table.name)
        for slot, variable in layer.slot_variables(table.name).items():
            named[f"{table.name}.S{slot}"] = variable
    named["embedding_step"] = layer.embedding_step
    named["table_update_trigger"] = layer.gradient_trap
    return named


def save_layer_variables(
    layer: EmbeddingLayerState,
    store: Any,
    engine: EngineFileTables | None = None,
) -> None:
    """`save_own_variables` of the embedding layers: by name, not position.

    Keras' `Layer.save_own_variables` stores variables as `"0"`, `"1"`, ...
    in creation order, so a layer whose columns are listed in another order
    would load one table into another of the same shape. Tables on the TPU
    embedding engine are read from the TPU and stored under the same names
    as a layer that holds them itself, so the file loads on CPU as well.
    """
    for key, variable in _named_layer_variables(layer).items():
        # As numpy: the store would call np.array on a tf.Variable, whose
        # `__array__` takes no `copy` (a DeprecationWarning under numpy 2).
        store[key] = variable.numpy()
    if engine is not None:
        # One table or slot at a time: each is written before the next is
        # read from the TPU.
        for key, value in engine.file_values():
            store[key] = value


def load_layer_variables(
    layer: EmbeddingLayerState,
    store: Any,
    engine: EngineFileTables | None = None,
) -> bool:
    """`load_own_variables` by name; False for a file stored by position.

    Files written before the layers saved by name hold `"0"`, `"1"`, ...:
    the caller loads those with Keras' positional rule. Tables on the TPU
    embedding engine are loaded onto the TPU (at the engine's first step
    when TF has not created them yet).

    Raises:
        ValueError: the file's tables or slots differ from the layer's in
            name or shape; the message lists both sides.
    """
    own, on_engine = (store, []) if engine is None else engine.split_file(store)
    loaded = _load_named(layer, own)
    if engine is not None and on_engine:
        engine.load_file_values(store, on_engine)
    return loaded


def _load_named(layer: EmbeddingLayerState, own: Any) -> bool:
    """`load_layer_variables` of the layer's own tables."""
    keys = sorted(str(key) for key in own.keys())
    if keys and all(key.isdigit() for key in keys):
        return False
    if not layer.built:
        raise ValueError(
            f"{type(layer).__name__} '{layer.name}' is not built, so it has "
            "no tables to load into; build the model (call it once) first."
        )
    named = _named_layer_variables(layer)
    values = {key: own[key] for key in keys}
    in_file = {key: list(value.shape) for key, value in values.items()}
    in_layer = {key: list(var.shape) for key, var in named.items()}
    if in_file != in_layer:
        differ = sorted(
            key
            for key in set(in_file) | set(in_layer)
            if in_file.get(key) != in_layer.get(key)
        )
        raise ValueError(
            f"Cannot load the weights of {type(layer).__name__} "
            f"'{layer.name}': the tables {differ!r} differ in name or shape. "
            f"The file holds {in_file}; the layer has {in_layer}. Load into "
            "a model built with the same columns (names and sizes)."
        )
    for key, variable in named.items():
        variable.assign(values[key])
    return True
