"""What the rest of the package asks of a TPU embedding engine.

A TPU system has one embedding engine (`engine_registry.py` makes it per
strategy): `v1/`'s for `TPUEmbedding` and `sparsecore/`'s for
`TPUEmbeddingV2`. The layers, the saving paths and the input pipelines
call an engine only through `Engine`, so that a new TPU generation is a
new engine behind this protocol and an entry of the registry, not a change
to its callers. `EngineTables` is one layer's view of its engine (the
layer's `TableBackend`) and `EngineRows` one table read a block of rows at
a time; both use only `Engine`'s methods.
"""

from __future__ import annotations

from typing import Any
from typing import Iterator
from typing import Mapping
from typing import Protocol
from typing import Sequence
from typing import runtime_checkable

import numpy as np

from keras_tpu_embed._compat import tf
from keras_tpu_embed.backends.table_backend import Activations
from keras_tpu_embed.backends.table_backend import Phase
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.engines.engine_members import EngineMember
from keras_tpu_embed.engines.engine_members import HostShard
from keras_tpu_embed.engines.engine_members import TableSlot
from keras_tpu_embed.placement.hardware import EmbeddingHardware
from keras_tpu_embed.tables.quantization import QuantizedTable
from keras_tpu_embed.tables.quantization import float_serving_table
from keras_tpu_embed.types import Tensor

KERAS_FILE_TABLE_LIMIT_BYTES = 2 * 2**30
"""The largest engine table or slot a `.keras` or `.weights.h5` file
carries (2 GiB): Keras stores each variable whole, so saving or loading one
passes it whole through the process that runs Keras; TensorFlow checkpoints
save each host's shard on its host and have no such limit."""


@runtime_checkable
class Engine(Protocol):
    """One TPU system's embedding engine: the layers it serves and their
    tables, read and written one host shard at a time."""

    hardware: EmbeddingHardware

    @property
    def table_names(self) -> list[str]:
        """Every table of every registered layer, in registration order."""
        ...

    @property
    def input_features(self) -> dict[str, str | None]:
        """Engine feature -> the input feature it reads (None: the layer's
        own raw feature)."""
        ...

    def register(
        self,
        layer_name: str,
        columns: Sequence[AnyEmbeddingColumn],
        input_keys: frozenset[str] | None,
        *,
        config: EmbeddingConfig,
        step: Any,
        trigger: Any,
        counts_step: bool,
        return_sequence_lengths: bool,
        layer_description: str,
    ) -> EngineTables:
        """Adds a layer's columns; returns the layer's backend."""
        ...

    def activations(
        self, member: EngineMember, features: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """One step's activations of a registered layer's columns."""
        ...

    def tables_of(self, layer_name: str) -> list[str]:
        """The tables a registered layer reads."""
        ...

    def table_slots(self, table: str) -> dict[str, list[int]]:
        """Slot name ("parameters" for the table) -> [rows, dimension]."""
        ...

    def shards_of(self, table: str) -> list[HostShard]:
        """The host shards that hold `table`, in row order."""
        ...

    def read_shard(self, table: str, slot: str, shard: HostShard) -> Tensor:
        """One host shard of a table or slot as it is on the chip now."""
        ...

    def read_shard_rows(
        self, table: str, slot: str, shard: HostShard, start: int, stop: int
    ) -> Tensor:
        """Rows `[start, stop)` of one host shard, read on its host."""
        ...

    def current_shard(self, table: str, slot: str, shard: HostShard) -> Tensor:
        """`read_shard`, or before TF creates the tables the values it will
        create that shard with."""
        ...

    def sync_host_copies(self) -> None:
        """Refreshes the host copies from the chip, once per step."""
        ...

    def read_tables(self, tables: Sequence[str]) -> dict[TableSlot, Any]:
        """Every table and slot of `tables`, whole (small tables only)."""
        ...

    def write_tables(
        self, values: Mapping[TableSlot, Any], load: bool = True
    ) -> None:
        """Writes tables or slots; `load` sends them to the chip now."""
        ...

    def load_tables(self, tables: Sequence[str]) -> None:
        """Sends written tables to the chip."""
        ...

    def checkpoint_tables(self, tables: Sequence[str]) -> dict[str, Any]:
        """The trackables that save and restore `tables` shard by shard."""
        ...

    def checkpoint_extras(self, tables: Sequence[str]) -> dict[str, Any]:
        """Trackables a checkpoint of `tables` needs besides them."""
        ...


class EngineTables:
    """One layer's tables on the shared engine; a `TableBackend`.

    Also how the layer's files reach them: the `.keras` weights
    (`file_values`, `load_file_values`) and the TensorFlow object graph
    (`track_checkpoints`) name them as a layer that holds them itself does.
    """

    def __init__(
        self,
        engine: Engine,
        member: EngineMember,
        tables: list[str],
        layer: str,
    ) -> None:
        """The backend of one registered layer.

        Args:
            engine: The engine the layer registered with.
            member: The layer, as the engine knows it.
            tables: The engine tables of the layer's columns, in the
                layer's order (not those of its own
                `feature_to_config_dict` entries).
            layer: The layer's kind and name, for errors.
        """
        self.engine = engine
        self._member = member
        self.table_names = tables
        self._layer = layer

    @property
    def raw_features(self) -> dict[str, Any]:
        """The layer's own `feature_to_config_dict` entries, which only the
        engine serves: their activations are part of the layer's output."""
        return dict(self._member.config.feature_to_config_dict or {})

    def activations(
        self, features: dict[str, Tensor], phase: Phase
    ) -> Activations:
        """The engine's activations of this layer's columns for this step.

        Training or not is the engine's business: TF turns the named enqueue
        into inference when no `apply_gradients` of that name follows.
        """
        return Activations(
            values=self.engine.activations(self._member, features)
        )

    def file_keys(self) -> dict[str, tuple[str, str]]:
        """File key -> (table, slot) of this layer's engine tables.

        The keys of `layer_variables.save_layer_variables`: `<table>` for
        the table, `<table>.S<slot>` for a slot.
        """
        keys = {}
        for table in self.table_names:
            for slot in self.engine.table_slots(table):
                key = table if slot == "parameters" else f"{table}.S{slot}"
                keys[key] = (table, slot)
        return keys

    def _check_file_size(self, action: str) -> None:
        """Refuses tables too large to pass whole through this process.

        Keras' `.keras` and `.weights.h5` files store each variable as one
        array (`saving_lib.H5IOStore`), so each engine table and slot is
        read into this process whole to be saved, and whole to be loaded.

        Raises:
            ValueError: a table or slot of more than
                `KERAS_FILE_TABLE_LIMIT_BYTES`, naming it and the
                checkpoint path that works one host shard at a time.
        """
        for key, (table, slot) in self.file_keys().items():
            rows, dim = self.engine.table_slots(table)[slot]
            size = rows * dim * 4
            if size > KERAS_FILE_TABLE_LIMIT_BYTES:
                raise ValueError(
                    f"Cannot {action} the engine table '{table}' of "
                    f"{self._layer} ('{key}', {rows} x {dim} float32, "
                    f"{size} bytes) in a Keras file: Keras' .keras and "
                    ".weights.h5 files hold each table whole, which would "
                    "pass it through this one process, and tables over "
                    f"KERAS_FILE_TABLE_LIMIT_BYTES={KERAS_FILE_TABLE_LIMIT_BYTES}"
                    " bytes are refused. Use tf.train.Checkpoint(model=model) "
                    "(or tf.train.Checkpoint(embedding=kte.engine_checkpoint("
                    "model)) with kte.restore_tables), which save and restore "
                    "each host's shard on that host."
                )

    def file_values(self) -> Iterator[tuple[str, Any]]:
        """File key -> the table or slot as it is on the TPU now, one at
        a time (each read when the previous one is written).

        Raises:
            ValueError: a table too large for a Keras file
                (`KERAS_FILE_TABLE_LIMIT_BYTES`).
        """
        self._check_file_size("save")
        for key, (table, slot) in self.file_keys().items():
            value = np.concatenate(
                [
                    self.engine.read_shard(table, slot, shard).numpy()
                    for shard in self.engine.shards_of(table)
                ]
            )
            yield key, value

    def split_file(self, store: Any) -> tuple[Any, list[str]]:
        """A `.keras` weights store as (the layer's own, the engine's keys).

        A store of Keras' positional keys (`"0"`, `"1"`, ...) is all the
        layer's own, for its positional rule.

        Raises:
            ValueError: the file lacks a table or slot of the engine's.
        """
        engine_keys = self.file_keys()
        keys = [str(key) for key in store.keys()]
        if not engine_keys or all(key.isdigit() for key in keys):
            return store, []
        missing = sorted(set(engine_keys) - set(keys))
        if missing:
            raise ValueError(
                f"Cannot load the weights of {self._layer}: the file has no "
                f"{missing}, which the TPU embedding engine holds for it. The "
                f"file holds {keys}. Load a file saved from a model with the "
                "same columns."
            )
        own = {key: store[key] for key in keys if key not in engine_keys}
        return own, [key for key in keys if key in engine_keys]

    def serving_tables(
        self, table_dtype: str
    ) -> dict[str, QuantizedTable | tf.Variable]:
        """Serving copies of this layer's engine tables, without slots.

        Each is read from the chip's current values (one retrieve) a block
        of rows at a time, each block from the host that holds it, into a
        table of one copy on this process (`quantization.
        float_serving_table`, or `QuantizedTable` for bfloat16 and int8).

        Raises:
            ValueError: a table with NaN or inf values, naming its rows.
        """
        tables: dict[str, QuantizedTable | tf.Variable] = {}
        for name in self.table_names:
            rows = EngineRows(self.engine, name, "parameters")
            tables[name] = (
                float_serving_table(rows, name)
                if table_dtype == "float32"
                else QuantizedTable(rows, table_dtype, name)
            )
        return tables

    def load_file_values(self, store: Any, keys: Sequence[str]) -> None:
        """Loads `keys` of a weights store onto the TPU, one table or slot
        read at a time (at the engine's first step when TF has not created
        the tables yet).

        Raises:
            ValueError: a table too large for a Keras file
                (`KERAS_FILE_TABLE_LIMIT_BYTES`).
        """
        self._check_file_size("load")
        file_keys = self.file_keys()
        for key in keys:
            self.engine.write_tables({file_keys[key]: store[key]}, load=False)
        self.engine.load_tables(
            list(dict.fromkeys(file_keys[key][0] for key in keys))
        )

    def track_checkpoints(self, module: Any) -> None:
        """Puts this layer's engine tables in `module` (the layer's
        `embedding_tables`) under the names a CPU layer gives its own
        (`<table>`, `<table>/<slot>`), read from the TPU on save and written
        to it on restore, so that `tf.train.Checkpoint(model=...)` moves
        between TPU and CPU models."""
        engine = self.engine
        tables = engine.tables_of(self._member.name)
        # The extras first: a restore deferred until the tables were added
        # finds them (`sparsecore_checkpoint.TableContainer`).
        for name, trackable in {
            **engine.checkpoint_extras(tables),
            **engine.checkpoint_tables(tables),
        }.items():
            if not hasattr(module, name):
                setattr(module, name, trackable)


class EngineRows:
    """One engine table or slot, read a block of rows at a time from the
    host shards that hold them (a `quantization.RowSource`).

    Made after the host copies are refreshed from the chip; each block is
    gathered on its shard's host and only the block comes to this process.
    """

    def __init__(self, engine: Engine, table: str, slot: str) -> None:
        engine.sync_host_copies()
        self._engine = engine
        self._table = table
        self._slot = slot
        rows, dim = engine.table_slots(table)[slot]
        self.shape = (rows, dim)

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows `[start, stop)` as float32."""
        pieces = []
        for shard in self._engine.shards_of(self._table):
            first = max(start, shard.start)
            last = min(stop, shard.start + shard.rows)
            if first >= last:
                continue
            block = self._engine.read_shard_rows(
                self._table,
                self._slot,
                shard,
                first - shard.start,
                last - shard.start,
            )
            pieces.append(block.numpy())
        return np.concatenate(pieces).astype(np.float32, copy=False)
