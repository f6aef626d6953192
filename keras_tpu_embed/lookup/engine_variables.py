"""The engine's members and tables: shapes, values on the TPU, checkpoints.

`EngineVariables` is the base of the TPU embedding engine
(`embedding_core.SharedEngine`): the layers registered with it
(`EngineMember`), the `FeatureConfig`s they brought, the mid-level object
made from them, and the tables and slots that object holds. Their names
and shapes are known from the configs before TF creates the tables (at
the engine's first step); their values are read from the TPU and written
to it (`read_tables`, `write_tables`), and values written before TF
created them are held until it does. `EngineTableCheckpoint` puts one
table or slot in a TensorFlow checkpoint, read and written through the
engine.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Sequence

from keras_tpu_embed._compat import TFSaveSpec
from keras_tpu_embed._compat import Trackable
from keras_tpu_embed._compat import tf
from keras_tpu_embed._tf_private import engine_optimizer_slot_names
from keras_tpu_embed._tf_private import mid_level_built
from keras_tpu_embed._tf_private import mid_level_load_variables
from keras_tpu_embed._tf_private import mid_level_table_variables
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.tpu.hardware import EmbeddingHardware


@dataclasses.dataclass
class EngineMember:
    """One registered layer: what it reads, its features and its state."""

    name: str
    input_keys: frozenset[str] | None
    features: dict[str, tuple[str, str | None]]  # name -> (ids, weights)
    sequence: frozenset[str]
    config: EmbeddingConfig
    step: Any  # the layer's embedding_step variable
    trigger: Any  # the layer's table_update_trigger variable
    counts_step: bool  # False when the layer's local tables count it


class EngineVariables:
    """The layers one engine serves, and the tables and slots it holds."""

    def __init__(self, hardware: EmbeddingHardware) -> None:
        self.hardware = hardware
        self._members: list[EngineMember] = []
        self._feature_configs: dict[str, Any] = {}
        self._table_owner: dict[str, str] = {}
        self._pipeline: bool | None = None
        self._mid_level: Any = None
        self._optimizer: Any = None
        # Values loaded (`write_tables`) before TF created the tables: they
        # go onto the TPU at the first enqueue, which creates them.
        self._pending: dict[tuple[str, str], Any] = {}

    @property
    def mid_level(self) -> Any:
        """The `TPUEmbedding` all members share."""
        return self._mid_level

    @property
    def table_names(self) -> list[str]:
        """Every table on the engine, sorted (known from the members'
        configs, before TF creates the tables)."""
        return sorted({f.table.name for f in self._feature_configs.values()})

    @property
    def layer_names(self) -> list[str]:
        return [member.name for member in self._members]

    @property
    def input_features(self) -> dict[str, str | None]:
        """The input keys the engine enqueues: ids key -> its weights key."""
        keys: dict[str, str | None] = {}
        for member in self._members:
            for ids_key, weights_key in member.features.values():
                keys[ids_key] = weights_key
        return keys

    def tables_of(self, layer_name: str) -> list[str]:
        """The engine tables that the layer `layer_name` owns."""
        return sorted(
            table
            for table, owner in self._table_owner.items()
            if owner == layer_name
        )

    def table_slots(self, table: str) -> dict[str, list[int]]:
        """`{"parameters": shape, <slot>: shape, ...}` of an engine table.

        Known from the configs, before TF creates the tables.
        """
        for feature in self._feature_configs.values():
            config = feature.table
            if config.name == table:
                shape = [config.vocabulary_size, config.dim]
                optimizer = config.optimizer or self._optimizer
                slots = ["parameters", *engine_optimizer_slot_names(optimizer)]
                return {slot: shape for slot in slots}
        raise KeyError(
            f"No table '{table}' on the TPU embedding engine. Its tables: "
            f"{self.table_names}."
        )

    def read_tables(self, tables: Sequence[str]) -> dict[tuple[str, str], Any]:
        """`{(table, slot): numpy array}`: the values on the TPU now.

        Raises:
            RuntimeError: TF has not created the tables yet (they are
                created at the engine's first step) and none were loaded.
        """
        keys = [(t, slot) for t in tables for slot in self.table_slots(t)]
        if not self._tables_created():
            if all(key in self._pending for key in keys):
                return {key: self._pending[key] for key in keys}
            raise RuntimeError(
                "The TPU embedding engine creates its tables at the first "
                f"step, so the tables {list(tables)} of layers "
                f"{self.layer_names} do not exist yet: run one step "
                "(model.fit, evaluate or predict) before saving."
            )
        return self._read_created(keys)

    def _tables_created(self) -> bool:
        """Whether TF created the tables (at the engine's first step)."""
        return self._mid_level is not None and mid_level_built(self._mid_level)

    def _read_created(
        self, keys: list[tuple[str, str]]
    ) -> dict[tuple[str, str], Any]:
        """`read_tables` once the tables exist."""
        # Under a TPUStrategy the host copies are stale until TF retrieves
        # them from the TPU, as it does before a checkpoint save.
        variables = mid_level_table_variables(self._mid_level)
        return {
            (table, slot): tf.concat(
                [
                    tf.convert_to_tensor(shard)
                    for shard in variables[table][slot].variables
                ],
                0,
            ).numpy()
            for table, slot in keys
        }

    def write_tables(self, values: dict[tuple[str, str], Any]) -> None:
        """Puts `{(table, slot): array}` onto the TPU (or at its creation)."""
        for (table, slot), value in values.items():
            expected = self.table_slots(table).get(slot)
            if expected is None or list(value.shape) != expected:
                raise ValueError(
                    f"Cannot load '{table}' slot '{slot}' of shape "
                    f"{list(value.shape)} into the TPU embedding engine, "
                    f"whose table '{table}' has "
                    f"{self.table_slots(table)} (slot: shape)."
                )
        self._pending.update(values)
        if self._tables_created():
            self._load_pending()

    def _load_pending(self) -> None:
        variables = mid_level_table_variables(self._mid_level)
        for (table, slot), value in self._pending.items():
            variable = variables[table][slot]
            start = 0
            for shard in variable.variables:
                rows = int(shard.shape[0])
                shard.assign(value[start : start + rows])
                start += rows
        self._pending = {}
        mid_level_load_variables(self._mid_level)


class EngineTableCheckpoint(Trackable):  # type: ignore[misc]
    """One engine table or slot in a checkpoint, as it is on the TPU.

    TF refreshes the mid-level object's host copies from the TPU before a
    save, and loads them onto it after a restore, only when the mid-level
    object itself is checkpointed, and the load only for files that a
    mid-level object wrote (`tpu_embedding_v2.py`, the registered
    "TPUEmbeddingCallback" saver). Tracking the host copies instead saved
    stale values, and a file written on CPU never reached the TPU after its
    first step. This reads and writes the TPU itself, through the engine
    (before the first step a restore is held and loaded when TF creates the
    tables; a save raises).
    """

    def __init__(self, engine: EngineVariables, table: str, slot: str) -> None:
        self._engine = engine
        self._table = table
        self._slot = slot
        self.shape = engine.table_slots(table)[slot]

    def read(self) -> Any:
        """The table or slot as it is on the TPU now."""
        try:
            values = self._engine.read_tables([self._table])
        except RuntimeError as error:
            raise ValueError(str(error)) from error
        return tf.constant(values[(self._table, self._slot)])

    def _serialize_to_tensors(self) -> dict[str, Any]:
        # A callable: TF asks for the spec on restore as well, when the
        # tables may not exist yet, and reads the value only to save it.
        return {
            "VARIABLE_VALUE": TFSaveSpec(
                self.read,
                "",
                "VARIABLE_VALUE",
                dtype=tf.float32,
                device="/job:localhost/replica:0/task:0/device:CPU:0",
            )
        }

    def _restore_from_tensors(self, restored_tensors: dict[str, Any]) -> Any:
        value = restored_tensors["VARIABLE_VALUE"]
        self._engine.write_tables({(self._table, self._slot): value.numpy()})
        return tf.no_op()
