"""The engine's members and tables: shapes, host shards, checkpoints.

`EngineVariables` is the base of the TPU embedding engine
(`v1_engine.V1Engine`): the layers registered with it
(`EngineMember`), the `FeatureConfig`s they brought, the mid-level object
made from them, and the tables and slots that object holds. Their names
and shapes are known from the configs before TF creates the tables (at
the engine's first step).

On a pod TF keeps each table and slot as one shard per host, on that host
(`make_sharded_variable_creator` in `tpu_embedding_v2.py`), plus the chip's
own copy. Everything here works one host shard at a time, where the shard
lives: a checkpoint saves each shard as a slice of the table on its host
and restores it there (`EngineTableCheckpoint`), so no table passes whole
through one host. The host copies are refreshed from the chip at most
once between two training steps (`sync_host_copies`), and a table written
on the host is loaded onto the chip before anything reads the chip again.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from typing import Any
from typing import Mapping
from typing import Sequence

from keras_tpu_embed._compat import TFShardInfo
from keras_tpu_embed._compat import tf
from keras_tpu_embed._tf_private import engine_optimizer_slot_initializers
from keras_tpu_embed._tf_private import engine_optimizer_slot_names
from keras_tpu_embed._tf_private import mid_level_built
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.engines.engine_host_ids import HostIdRule
from keras_tpu_embed.placement.hardware import EmbeddingHardware
from keras_tpu_embed.types import Tensor

TableSlot = tuple[str, str]
"""`(table name, "parameters" or a slot name)`."""


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


@dataclasses.dataclass(frozen=True)
class HostShard:
    """Rows `[start, start + rows)` of a table, held by `host`."""

    host: str
    start: int
    rows: int


def host_shards(vocabulary_size: int, hosts: Sequence[str]) -> list[HostShard]:
    """Where TF's sharded variable creator puts a table's rows.

    `make_sharded_variable_creator` (`tpu_embedding_v2.py`): contiguous
    blocks, one per host in order, the first `rows % hosts` one row
    longer; a host with no row gets no shard.
    """
    base, extra = divmod(vocabulary_size, len(hosts))
    shards = []
    start = 0
    for index, host in enumerate(hosts):
        rows = base + (1 if index < extra else 0)
        if rows:
            shards.append(HostShard(host, start, rows))
        start += rows
    return shards


def slice_spec(shape: Sequence[int], shard: HostShard) -> str:
    """The checkpoint slice of `shard` in a table of `shape`, spelled by
    TF (`tf.Variable.SaveSliceInfo`, as `ShardedVariable` saves)."""
    spec: str = tf.Variable.SaveSliceInfo(
        full_name="",
        full_shape=list(shape),
        var_offset=[shard.start, 0],
        var_shape=[shard.rows, shape[1]],
    ).spec
    return spec


class EngineVariables(abc.ABC):
    """The layers one engine serves, and the tables and slots it holds.

    How an engine reads and writes its tables is its own (`v1/v1_variables.py`,
    `sparsecore/sparsecore_engine.py`): the abstract methods below.
    """

    def __init__(self, hardware: EmbeddingHardware) -> None:
        self.hardware = hardware
        self._members: list[EngineMember] = []
        self._feature_configs: dict[str, Any] = {}
        # Each column's id rules, applied on the host at the enqueue
        # (`engine_host_ids.py`), by feature name.
        self._host_rules: dict[str, HostIdRule] = {}
        self._table_owner: dict[str, str] = {}
        self._pipeline: bool | None = None
        self._mid_level: Any = None
        self._optimizer: Any = None
        # Values written (checkpoint restores, `write_tables`) before TF
        # created the tables, per host shard: they go onto the TPU at the
        # first enqueue, which creates them. (table, slot) -> start -> value.
        self._pending: dict[TableSlot, Any] = {}

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

    # ----------------------------------------------------------- host shards

    @abc.abstractmethod
    def shards_of(self, table: str) -> list[HostShard]:
        """The host shards of `table`, as TF creates them (known before)."""

    def _tables_created(self) -> bool:
        """Whether TF created the tables (at the engine's first step)."""
        return self._mid_level is not None and mid_level_built(self._mid_level)

    def _steps_now(self) -> tuple[int, ...]:
        with tf.init_scope():
            return tuple(int(m.step.numpy()) for m in self._members)

    @abc.abstractmethod
    def sync_host_copies(self) -> None:
        """Makes the host copies hold the chip's values, retrieving at most
        once after each training step (one retrieve of every table)."""

    def _not_created_error(self, tables: Sequence[str]) -> RuntimeError:
        return RuntimeError(
            "The TPU embedding engine creates its tables at the first "
            f"step, so the tables {list(tables)} of layers "
            f"{self.layer_names} do not exist yet: run one step "
            "(model.fit, evaluate or predict) before saving or exporting."
        )

    @abc.abstractmethod
    def read_shard(self, table: str, slot: str, shard: HostShard) -> Tensor:
        """One shard as it is on the TPU now, read on its host."""

    @abc.abstractmethod
    def read_shard_rows(
        self, table: str, slot: str, shard: HostShard, start: int, stop: int
    ) -> Tensor:
        """Rows `[start, stop)` of one shard (counted in the shard), as on
        the TPU now, gathered on the shard's host."""

    def current_shard(self, table: str, slot: str, shard: HostShard) -> Tensor:
        """One shard as the engine holds it now, on its host, also before
        TF creates the tables: as `read_shard` reads it, else (nothing
        written for it yet) the values TF will create it with.

        TF's sharded variable creator (`make_sharded_variable_creator` in
        `tpu_embedding_v2.py`) gives an initializer that takes `shard_info`
        the table's full shape and the shard's place, any other (the
        optimizer's slot initializers) the shard's shape.
        """
        try:
            return self.read_shard(table, slot, shard)
        except RuntimeError:
            pass  # Not created, and nothing was written to this shard.
        config = next(
            feature.table
            for feature in self._feature_configs.values()
            if feature.table.name == table
        )
        full = (config.vocabulary_size, config.dim)
        initializer = (
            config.initializer
            if slot == "parameters"
            else engine_optimizer_slot_initializers(
                config.optimizer or self._optimizer
            )[slot]
        )
        with tf.device(shard.host):
            if "shard_info" in inspect.signature(initializer).parameters:
                place = TFShardInfo((shard.rows, full[1]), (shard.start, 0))
                value = initializer(full, dtype=tf.float32, shard_info=place)
            else:
                value = initializer((shard.rows, full[1]), dtype=tf.float32)
            return tf.convert_to_tensor(value)

    @abc.abstractmethod
    def read_tables(self, tables: Sequence[str]) -> dict[TableSlot, Any]:
        """`{(table, slot): numpy array}`: whole tables, as on the TPU now."""

    @abc.abstractmethod
    def write_tables(
        self, values: Mapping[TableSlot, Any], load: bool = True
    ) -> None:
        """Puts `{(table, slot): array}` onto the TPU (or at its creation)."""

    def check_values(self, values: Mapping[TableSlot, Any]) -> None:
        """Raises unless each value has its table's or slot's shape.

        Raises:
            ValueError: naming the table, the slot and both shapes.
        """
        for (table, slot), value in values.items():
            expected = self.table_slots(table).get(slot)
            if expected is None or list(value.shape) != expected:
                raise ValueError(
                    f"Cannot load '{table}' slot '{slot}' of shape "
                    f"{list(value.shape)} into the TPU embedding engine, "
                    f"whose table '{table}' has "
                    f"{self.table_slots(table)} (slot: shape)."
                )

    @abc.abstractmethod
    def load_tables(self, tables: Sequence[str]) -> None:
        """Sends the tables' host copies to the chip (once TF created them;
        before, what was written waits for their creation)."""

    @abc.abstractmethod
    def restore_shard(
        self, table: str, slot: str, shard: HostShard, value: Tensor
    ) -> Any:
        """Writes a checkpoint's slice of one host shard, on its host; once
        every shard of the table or slot is written, loads the table onto
        the chip."""

    @abc.abstractmethod
    def checkpoint_tables(self, tables: Sequence[str]) -> dict[str, Any]:
        """`{<table> or <table>/<slot>: trackable}`: `tables` by name in a
        checkpoint."""

    @abc.abstractmethod
    def checkpoint_extras(self, tables: Sequence[str]) -> dict[str, Any]:
        """Other children a checkpoint of `tables` needs."""

    @abc.abstractmethod
    def _load_pending(self) -> None:
        """Writes what was held for the tables' creation into them, then
        loads every table onto the chip once."""
