"""The V1 engine's tables: host shards of TF's `TPUEmbedding` variables.

`TPUEmbedding` keeps a host copy of each table and slot, one shard per
host, which it retrieves from and loads to the chip (`tpu_embedding_v2.py`:
`_retrieve_variables`, `_load_variables`). Every read and write here goes
through those copies one host shard at a time, on the shard's host, so
that no table is ever whole on one process; checkpoints save each shard
on its host (`EngineTableCheckpoint`).
"""

from __future__ import annotations

from typing import Any
from typing import Mapping
from typing import Sequence

import numpy as np

from keras_tpu_embed._compat import TFSaveableObject
from keras_tpu_embed._compat import TFSaveSpec
from keras_tpu_embed._compat import Trackable
from keras_tpu_embed._compat import tf
from keras_tpu_embed._tf_private import mid_level_hosts
from keras_tpu_embed._tf_private import mid_level_load_table
from keras_tpu_embed._tf_private import mid_level_load_variables
from keras_tpu_embed._tf_private import mid_level_retrieve
from keras_tpu_embed._tf_private import mid_level_table_variables
from keras_tpu_embed.engines.engine_members import EngineVariables
from keras_tpu_embed.engines.engine_members import HostShard
from keras_tpu_embed.engines.engine_members import TableSlot
from keras_tpu_embed.engines.engine_members import host_shards
from keras_tpu_embed.engines.engine_members import slice_spec
from keras_tpu_embed.types import Tensor


class V1HostShards(EngineVariables):
    """An engine's tables as `TPUEmbedding`'s host shards (V1)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The members' steps when the host copies last equalled the chip:
        # the chip changes only in a training step, which counts them.
        self._synced_steps: tuple[int, ...] | None = None
        # The shards of each table or slot a restore has written so far.
        self._restored_shards: dict[TableSlot, set[int]] = {}

    def shards_of(self, table: str) -> list[HostShard]:
        """The host shards of `table`, as TF creates them (known before)."""
        rows = self.table_slots(table)["parameters"][0]
        return host_shards(rows, mid_level_hosts(self._mid_level))

    def sync_host_copies(self) -> None:
        """Makes the host copies hold the chip's values, retrieving at most
        once after each training step (one retrieve of every table).

        Runs eagerly, also while a save is traced: the trace then reads the
        refreshed host copies.
        """
        if not self._tables_created():
            return
        steps = self._steps_now()
        if steps != self._synced_steps:
            with tf.init_scope():
                mid_level_retrieve(self._mid_level)
            self._synced_steps = steps

    def shard_variable(self, table: str, slot: str, shard: HostShard) -> Any:
        """The host copy of one shard (created tables only)."""
        sharded = mid_level_table_variables(self._mid_level)[table][slot]
        index = self.shards_of(table).index(shard)
        return sharded.variables[index]

    def read_shard(self, table: str, slot: str, shard: HostShard) -> Tensor:
        """One shard as it is on the TPU now, read on its host.

        Raises:
            RuntimeError: TF has not created the tables yet and nothing
                was written to this shard.
        """
        if self._tables_created():
            self.sync_host_copies()
            with tf.device(shard.host):
                return tf.identity(self.shard_variable(table, slot, shard))
        pending = self._pending.get((table, slot), {})
        if shard.start in pending:
            value = pending[shard.start]
            with tf.device(shard.host):
                return tf.identity(
                    value.read_value()
                    if isinstance(value, tf.Variable)
                    else value
                )
        raise self._not_created_error([table])

    def read_shard_rows(
        self, table: str, slot: str, shard: HostShard, start: int, stop: int
    ) -> Tensor:
        """Rows `[start, stop)` of one shard (counted in the shard), as on
        the TPU now, gathered on the shard's host."""
        positions = tf.range(start, stop)
        if self._tables_created():
            self.sync_host_copies()
            values = self.shard_variable(table, slot, shard)
        else:
            values = self.read_shard(table, slot, shard)
        with tf.device(shard.host):
            return tf.gather(values, positions)

    def read_tables(self, tables: Sequence[str]) -> dict[TableSlot, Any]:
        """`{(table, slot): numpy array}`: whole tables, as on the TPU now.

        Holds every listed table at once on this process: for small
        tables; the save paths read one shard at a time (`read_shard`).

        Raises:
            RuntimeError: TF has not created the tables yet (they are
                created at the engine's first step) and none were loaded.
        """
        return {
            (table, slot): np.concatenate(
                [
                    self.read_shard(table, slot, shard).numpy()
                    for shard in self.shards_of(table)
                ]
            )
            for table in tables
            for slot in self.table_slots(table)
        }

    def write_tables(
        self, values: Mapping[TableSlot, Any], load: bool = True
    ) -> None:
        """Puts `{(table, slot): array}` onto the TPU (or at its creation).

        A value is read one host shard of rows at a time (`value[a:b]`: an
        h5py dataset is read from its file block by block); each table is
        loaded onto the chip once, after all of its values are written
        (with `load=False`, by a later `load_tables`).
        """
        self.check_values(values)
        # The chip loads a table with all its slots: the slots not written
        # here must be current on the host first (no need when all are).
        partial = any(
            (table, slot) not in values
            for table, _ in values
            for slot in self.table_slots(table)
        )
        if self._tables_created() and partial:
            self.sync_host_copies()
        for (table, slot), value in values.items():
            for shard in self.shards_of(table):
                rows = value[shard.start : shard.start + shard.rows]
                if not tf.is_tensor(rows):
                    rows = np.asarray(rows)
                self._write_shard(table, slot, shard, rows)
        if load:
            self.load_tables(list(dict.fromkeys(table for table, _ in values)))

    def load_tables(self, tables: Sequence[str]) -> None:
        """Sends the tables' host copies to the chip (once TF created them;
        before, what was written waits for their creation)."""
        if self._tables_created():
            for table in tables:
                self._load_table(table)

    def _write_shard(
        self, table: str, slot: str, shard: HostShard, rows: Any
    ) -> Any:
        """Writes one shard on its host: into the host copy, or held for
        the tables' creation. Returns the assignment (an op in a graph)."""
        if self._tables_created():
            with tf.device(shard.host):
                return self.shard_variable(table, slot, shard).assign(rows)
        pending = self._pending.setdefault((table, slot), {})
        if tf.executing_eagerly() or isinstance(rows, np.ndarray):
            with tf.init_scope(), tf.device(shard.host):
                # A copy: a tensor read from a variable can share its buffer,
                # which a later write to the variable may change in place.
                pending[shard.start] = tf.raw_ops.DeepCopy(
                    x=tf.convert_to_tensor(rows, tf.float32)
                )
            return None
        # A traced restore: the value exists only when the trace runs, so
        # it is held in a variable of the shard's host.
        with tf.init_scope(), tf.device(shard.host):
            holder = tf.Variable(
                tf.zeros([shard.rows, rows.shape[1]], tf.float32),
                trainable=False,
            )
        pending[shard.start] = holder
        with tf.device(shard.host):
            return holder.assign(rows)

    def _load_table(self, table: str) -> Any:
        """One table's host copies onto the chip (TF's load op per host)."""
        return mid_level_load_table(self._mid_level, table)

    def restore_shard(
        self, table: str, slot: str, shard: HostShard, value: Tensor
    ) -> Any:
        """Writes a checkpoint's slice of one host shard, on its host; once
        every shard of the table or slot is written, loads the table onto
        the chip.

        The other slots of the table are first made current (the chip's,
        when a step ran since the last read), since the chip loads a table
        with all its slots at once. Each restored table or slot loads its
        table: TF loads once after a restore only through a saver that it
        registers for its own object, which a checkpoint written by a CPU
        model does not carry.

        Returns:
            The restore's op when traced, else None.
        """
        created = self._tables_created()
        if created:
            self.sync_host_copies()
        write = self._write_shard(table, slot, shard, value)
        restored = self._restored_shards.setdefault((table, slot), set())
        restored.add(shard.start)
        if not created or len(restored) < len(self.shards_of(table)):
            return write
        del self._restored_shards[(table, slot)]
        with tf.control_dependencies([] if write is None else [write]):
            return self._load_table(table)

    def shard_specs(self, table: str, slot: str) -> list[tuple[HostShard, str]]:
        """Each host shard of a table or slot with its checkpoint slice
        (one host: the whole table, no slice, as a variable saves)."""
        shape = self.table_slots(table)[slot]
        shards = self.shards_of(table)
        if len(shards) == 1:
            return [(shards[0], "")]
        return [(shard, slice_spec(shape, shard)) for shard in shards]

    def _load_pending(self) -> None:
        """Writes what was held for the tables' creation into them, then
        loads every table onto the chip once."""
        for (table, slot), pieces in self._pending.items():
            for shard in self.shards_of(table):
                if shard.start in pieces:
                    value = pieces[shard.start]
                    if isinstance(value, tf.Variable):
                        value = value.read_value()
                    with tf.device(shard.host):
                        self.shard_variable(table, slot, shard).assign(value)
        self._pending = {}
        mid_level_load_variables(self._mid_level)
        self._synced_steps = self._steps_now()


class _ShardSaveable(TFSaveableObject):  # type: ignore[misc]
    """One host shard of an engine table or slot in a checkpoint: a slice
    of the table, saved and restored on the shard's host."""

    def __init__(
        self,
        engine: V1HostShards,
        table: str,
        slot: str,
        shard: HostShard,
        spec: str,
        name: str,
    ) -> None:
        self._engine = engine
        self._table = table
        self._slot = slot
        self._shard = shard
        super().__init__(
            None,
            [
                TFSaveSpec(
                    self._read,
                    spec,
                    name,
                    dtype=tf.float32,
                    device=shard.host,
                )
            ],
            name,
        )

    def _read(self) -> Tensor:
        # The values are read only when TF saves: at a restore TF asks for
        # the specs alone, also before the tables exist.
        try:
            return self._engine.read_shard(self._table, self._slot, self._shard)
        except RuntimeError as error:
            raise ValueError(str(error)) from error

    def restore(self, restored_tensors: Any, restored_shapes: Any) -> Any:
        with tf.device(self._shard.host):
            value = tf.reshape(
                restored_tensors[0], [self._shard.rows, self.shape[1]]
            )
        restored = self._engine.restore_shard(
            self._table, self._slot, self._shard, value
        )
        return tf.no_op() if restored is None else restored

    @property
    def shape(self) -> list[int]:
        return self._engine.table_slots(self._table)[self._slot]


class EngineTableCheckpoint(Trackable):  # type: ignore[misc]
    """One engine table or slot in a checkpoint, as it is on the TPU.

    TF refreshes the mid-level object's host copies from the TPU before a
    save, and loads them onto it after a restore, only when the mid-level
    object itself is checkpointed, and the load only for files that a
    mid-level object wrote (`tpu_embedding_v2.py`, the registered
    "TPUEmbeddingCallback" saver). Tracking the host copies instead saved
    stale values, and a file written on CPU never reached the TPU after its
    first step. This saves each host's shard as a slice of the table, on
    that host, refreshed from the TPU first (once per save), and restores
    each slice on its host and then onto the TPU (before the first step a
    restore is held until TF creates the tables; a save raises). The keys
    are a whole variable's, which a CPU model reads as one tensor.

    One saveable per shard, as TF's `ShardedVariable` does: TF's restore of
    a trackable's `_serialize_to_tensors` hands it one tensor per name,
    so a table of several slices would get only the last
    (`saveable_object_util.TrackableSaveable.restore`).
    """

    def __init__(self, engine: V1HostShards, table: str, slot: str) -> None:
        self._engine = engine
        self._table = table
        self._slot = slot
        self.shape = engine.table_slots(table)[slot]

    def shards(self) -> list[HostShard]:
        """The host shards of the table or slot."""
        return self._engine.shards_of(self._table)

    def read_shard(self, shard: HostShard) -> Tensor:
        """One shard as it is on the TPU now."""
        try:
            return self._engine.read_shard(self._table, self._slot, shard)
        except RuntimeError as error:
            raise ValueError(str(error)) from error

    def _gather_saveables_for_checkpoint(self) -> dict[str, Any]:
        def saveables(name: str) -> list[_ShardSaveable]:
            return [
                _ShardSaveable(
                    self._engine, self._table, self._slot, shard, spec, name
                )
                for shard, spec in self._engine.shard_specs(
                    self._table, self._slot
                )
            ]

        return {"VARIABLE_VALUE": saveables}
