"""SparseCore tables in TensorFlow checkpoints, one SparseCore at a time.

A table container (a layer's `embedding_tables`, `engine_checkpoint`'s
view) holding SparseCore tables writes, for each table `t` and its slots:

- `<t>`, `<t>/<slot>`: `EngineTableHandle`s, nodes with no value under the
  names a CPU layer gives its own variables, so that a CPU model restoring
  the checkpoint binds its variables by table name;
- `_sparse_core/<t>`, `_sparse_core/<t>/<slot>`: `SparseCoreTable`s, whose
  `VARIABLE_VALUE` is the table in TF's internal layout
  (`sparsecore_layout.checkpoint_shape`), saved as one slice per
  SparseCore, each that SparseCore's rows of its chip's shard, a view of
  the variable's buffer rather than a copy (as TF's own
  `TPUEmbeddingShardedSaveable` saves each shard of a stacked variable),
  and `SPARSECORE_LAYOUT`, TF's `SparseCoreTableLayout` of the table.

Why not TF's stacked variables and checkpoint adapter
(`tpu_embedding_v3.py`, `tpu_embedding_v3_checkpoint_adapter.py`): a stack
holds tables of several layers, and TF restores a checkpoint node into one
Python object per restore (`restore.py`, `_queue_children_for_restoration`
skips a node already bound; an object is restored once, `_update_uid`), so
the second layer of a stack would never get its tables on CPU; TF's adapter
applies only to the children of a `TPUEmbeddingV2` restored before they
are created (`_maybe_get_adapter`, reshard callbacks are applied in
`CheckpointPosition.value_tensors` only), reads every table of a stack
whole for each shard, and has no way from sharded to unsharded
("NotImplementedError"). So each table is saved by name, sliced by
SparseCore.

Reading: TF reads every tensor the restored objects declare in one
`RestoreV2` (`functional_saver.MultiDeviceSaver.restore`), which would
hold a whole copy of the tables. Where the layout changes (CPU <->
SparseCore, or before TF created the tables), the readers here declare one
row and read the rest themselves, a block at a time
(`sparsecore_shards`), from the checkpoint that the container learnt
from `_checkpoint_adapter`:

- a CPU container (`TableContainer`) reads a `_sparse_core` node through
  `SparseCoreReader` / `TableReader`, conditional dependencies of
  `_lookup_dependency`, into its variables;
- a container with SparseCore tables reads a `<t>` node written on CPU or
  by an older version (a `[vocabulary_size, dim]` tensor) through the
  table's `SparseCoreTable`, and so does a `SparseCoreTable` restored
  before TF created the tables (the rows then reach TF's per-SparseCore
  initialization, `sparsecore_shards.SparseCoreInitializer`).

A SparseCore checkpoint restored after the first step with the layout it
was saved with is read by TF, a SparseCore's slice each, in one
`RestoreV2`.
"""

from __future__ import annotations

import functools
from typing import Any
from typing import Callable
from typing import Mapping
from typing import Protocol
from typing import Sequence

from keras_tpu_embed._compat import TFSaveableObject
from keras_tpu_embed._compat import TFSaveSpec
from keras_tpu_embed._compat import Trackable
from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_sparse_core_layout_pb2
from keras_tpu_embed._compat import tf_trackable_utils
from keras_tpu_embed.tables import sparsecore_layout
from keras_tpu_embed.tables import sparsecore_shards
from keras_tpu_embed.tables.sparsecore_layout import TableLayout
from keras_tpu_embed.tables.sparsecore_shards import TableRows
from keras_tpu_embed.types import Tensor

SPARSE_CORE = "_sparse_core"
"""The child of a table container holding its SparseCore tables' values."""

VALUE = "VARIABLE_VALUE"
LAYOUT = "SPARSECORE_LAYOUT"
_ATTRIBUTES = "/.ATTRIBUTES/"
_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


class SparseCoreTables(Protocol):
    """What the checkpoint reads of the SparseCore engine
    (`sparsecore_engine.SparseCoreEngine`)."""

    def table_slots(self, table: str) -> dict[str, list[int]]: ...

    def read_tables(
        self, tables: Sequence[str]
    ) -> dict[tuple[str, str], Any]: ...

    def write_tables(self, values: dict[tuple[str, str], Any]) -> None: ...

    def tables_created(self) -> bool: ...

    def table_layout(self, table: str) -> Any: ...

    def stacked_variable(self, table: str, slot: str) -> Any: ...


def local_name(table: str, slot: str) -> str:
    """The name a container gives a table (`<table>`) or slot
    (`<table>/<slot>`), as TF's mid-level object names them."""
    return table if slot == "parameters" else f"{table}/{slot}"


def _escaped(name: str) -> str:
    return str(tf_trackable_utils.escape_local_name(name))


def _read_or_raise(engine: SparseCoreTables, table: str, slot: str) -> Any:
    try:
        return engine.read_tables([table])[(table, slot)]
    except RuntimeError as error:
        raise ValueError(str(error)) from error


class EngineTableHandle(Trackable):  # type: ignore[misc]
    """A SparseCore table or slot by name, holding no checkpoint value.

    What `engine_checkpoint` lists (`shape`, `read`) and the checkpoint
    node of that name, which a CPU model's variable of that name binds to;
    the values are saved under `_sparse_core` (see the module).
    """

    def __init__(self, engine: SparseCoreTables, table: str, slot: str):
        self.engine = engine
        self.table = table
        self.slot = slot
        self.shape = engine.table_slots(table)[slot]

    def read(self) -> Tensor:
        """The table or slot as it is on the SparseCores now."""
        return tf.constant(_read_or_raise(self.engine, self.table, self.slot))


def checkpoint_rows(
    path: str, key: str, table: str, shape: Sequence[int]
) -> TableRows:
    """The rows of tensor `key` of the checkpoint at `path`, for the table
    `table` of `shape`: a `[vocabulary_size, dim]` tensor (written on CPU)
    or a SparseCore table (`sparsecore_layout.checkpoint_shape`).

    Raises:
        ValueError: the tensor holds a table of another shape; the message
            names the table, the key and both shapes.
    """
    reader = tf.train.load_checkpoint(path)
    stored = [int(d) for d in reader.get_variable_to_shape_map()[key]]
    dtype = reader.get_variable_to_dtype_map()[key]
    want = [int(d) for d in shape]
    saved = stored
    if len(stored) == 3:
        layout_key = key[: key.rindex(_ATTRIBUTES)] + _ATTRIBUTES + LAYOUT
        layout = tf_sparse_core_layout_pb2.SparseCoreTableLayout()
        layout.ParseFromString(reader.get_tensor(layout_key))
        saved = [int(d) for d in layout.unsharded_shape]
    if saved != want or len(stored) not in (2, 3):
        raise ValueError(
            f"Cannot restore table '{table}' of shape {want} from "
            f"'{key}' of checkpoint {path}, which holds a table of shape "
            f"{saved}. Restore a checkpoint of a model with the same columns."
        )
    if len(stored) == 2:
        return sparsecore_shards.CheckpointRows(path, key, want, dtype)
    return sparsecore_shards.SparseCoreCheckpointRows(
        path, key, want, stored, dtype
    )


def _one_row(shape: Sequence[int]) -> str:
    dims = [int(d) for d in shape]
    return " ".join(str(d) for d in dims) + " 0,1" + ":-" * (len(dims) - 1)


class _ReadItself(TFSaveableObject):  # type: ignore[misc]
    """Restores `key` by reading it itself: TF reads only its first row
    (see the module) and `read(path, key)` the rest. Saving it is
    `save_raises`."""

    def __init__(
        self,
        key: str,
        path: str | None,
        read: Callable[[str, str], None],
        save_raises: Callable[[], Any],
    ) -> None:
        shape_and_slice = ""
        dtype = tf.float32
        if path is not None:
            reader = tf.train.load_checkpoint(path)
            shapes = reader.get_variable_to_shape_map()
            if key in shapes:
                shape_and_slice = _one_row(shapes[key])
                dtype = reader.get_variable_to_dtype_map()[key]
        spec = TFSaveSpec(
            save_raises, shape_and_slice, key, dtype=dtype, device=_CPU
        )
        super().__init__(None, [spec], key)
        self._path = path
        self._read = read

    def restore(self, restored_tensors: Any, restored_shapes: Any) -> Any:
        del restored_tensors, restored_shapes
        if self._path is None:
            raise RuntimeError(
                f"No checkpoint path known to restore '{self.name}' from."
            )
        self._read(self._path, self.name)
        return tf.no_op()


class _TakeWhole(TFSaveableObject):  # type: ignore[misc]
    """Restores `key`, a tensor saved whole, from the value TF reads: TF's
    bundle reader reads a whole stored tensor for any slice of it, so
    reading it again a block at a time would only read it more. Saving it
    is `save_raises`."""

    def __init__(
        self,
        key: str,
        take: Callable[[Tensor], None],
        save_raises: Callable[[], Any],
    ) -> None:
        spec = TFSaveSpec(save_raises, "", key, dtype=tf.float32, device=_CPU)
        super().__init__(None, [spec], key)
        self._take = take

    def restore(self, restored_tensors: Any, restored_shapes: Any) -> Any:
        del restored_shapes
        self._take(restored_tensors[0])
        return tf.no_op()


class _Constant(TFSaveableObject):  # type: ignore[misc]
    """A value saved for readers (the layout), restored as nothing."""

    def __init__(self, key: str, value: Callable[[], Any], dtype: Any):
        spec = TFSaveSpec(value, "", key, dtype=dtype, device=_CPU)
        super().__init__(None, [spec], key)

    def restore(self, restored_tensors: Any, restored_shapes: Any) -> Any:
        del restored_tensors, restored_shapes
        return tf.no_op()


class _SparseCoreSlices(TFSaveableObject):  # type: ignore[misc]
    """A SparseCore table as one slice per SparseCore (see the module)."""

    def __init__(self, key: str, variable: Any, layout: TableLayout) -> None:
        shape = sparsecore_layout.checkpoint_shape(layout)
        shards = list(variable.values)
        specs = []
        for place in sparsecore_layout.core_rows(layout):
            spec = tf.Variable.SaveSliceInfo(
                full_name=key,
                full_shape=shape,
                var_offset=[place.first, 0, 0],
                var_shape=[1, *shape[1:]],
            ).spec
            specs.append(
                TFSaveSpec(
                    functools.partial(
                        sparsecore_shards.core_slice,
                        variable,
                        layout,
                        place.core,
                    ),
                    spec,
                    key,
                    dtype=tf.float32,
                    device=shards[place.shard].device,
                )
            )
        super().__init__(None, specs, key)
        self._variable = variable
        self._layout = layout

    def restore(self, restored_tensors: Any, restored_shapes: Any) -> Any:
        del restored_shapes
        for place, value in zip(
            sparsecore_layout.core_rows(self._layout), restored_tensors
        ):
            sparsecore_shards.write_core(
                self._variable, self._layout, place.core, value
            )
        return tf.no_op()


class SparseCoreTable(Trackable):  # type: ignore[misc]
    """One SparseCore table or slot in a checkpoint (see the module).

    Saved under `_sparse_core/<name>` one slice per SparseCore; restored
    from there (by TF, once the tables exist), from a `<table>` node written
    on CPU (read a SparseCore's rows at a time), or, before the first step,
    held as the checkpoint's rows until TF creates the tables.
    """

    def __init__(self, engine: SparseCoreTables, table: str, slot: str):
        self.engine = engine
        self.table = table
        self.slot = slot
        self.name = local_name(table, slot)
        self.restore_path: str | None = None

    def _gather_saveables_for_checkpoint(self) -> dict[str, Any]:
        return {VALUE: self._value, LAYOUT: self._layout}

    def _is_own(self, key: str) -> bool:
        return key.endswith(
            f"/{SPARSE_CORE}/{_escaped(self.name)}{_ATTRIBUTES}{VALUE}"
        )

    def _not_created(self) -> Any:
        raise ValueError(
            "The TPU embedding engine creates its tables at the first step, "
            f"so the SparseCore table '{self.table}' does not exist yet: run "
            "one step (model.fit, evaluate or predict) before saving."
        )

    def _read(self, path: str, key: str) -> None:
        shape = self.engine.table_slots(self.table)[self.slot]
        rows = checkpoint_rows(path, key, self.name, shape)
        self.engine.write_tables({(self.table, self.slot): rows})

    def _take(self, value: Tensor) -> None:
        shape = self.engine.table_slots(self.table)[self.slot]
        if list(value.shape) != list(shape):
            raise ValueError(
                f"Cannot restore table '{self.name}' of shape {list(shape)} "
                f"from a tensor of shape {list(value.shape)}. Restore a "
                "checkpoint of a model with the same columns."
            )
        self.engine.write_tables(
            {(self.table, self.slot): sparsecore_shards.ArrayRows(value)}
        )

    def _value(self, name: str) -> Any:
        # TF asks for the saveable to save and to restore alike; the path,
        # given just before a restore asks (`_checkpoint_adapter`), is used
        # once.
        path, self.restore_path = self.restore_path, None
        created = self.engine.tables_created()
        if not self._is_own(name):
            # A `<table>` tensor saved whole (on CPU, or by an older
            # version): TF reads it whole anyway. Into the SparseCores now;
            # before TF created them, read again then, a table at a time,
            # rather than held.
            if created:
                return _TakeWhole(name, self._take, self._not_created)
            return _ReadItself(name, path, self._read, self._not_created)
        if not created:
            return _ReadItself(name, path, self._read, self._not_created)
        layout = self.engine.table_layout(self.table)
        if path is not None:
            stored = tf.train.load_checkpoint(path).get_variable_to_shape_map()
            shape = stored.get(name)
            if shape is not None and list(shape) != (
                sparsecore_layout.checkpoint_shape(layout)
            ):
                # Saved on another number of SparseCores.
                return _ReadItself(name, path, self._read, self._not_created)
        return _SparseCoreSlices(
            name, self.engine.stacked_variable(self.table, self.slot), layout
        )

    def _layout(self, name: str) -> Any:
        def serialized() -> Any:
            if not self.engine.tables_created():
                self._not_created()
            layout = self.engine.table_layout(self.table)
            return tf.constant(layout.SerializeToString())

        return _Constant(name, serialized, tf.string)


class SparseCoreTableValues(Trackable):  # type: ignore[misc]
    """A container's `_sparse_core` child: its SparseCore tables' values."""

    def __init__(self, tables: Mapping[str, SparseCoreTable]) -> None:
        self.tables = dict(tables)

    def _trackable_children(
        self, save_type: Any = "checkpoint", **kwargs: Any
    ) -> dict[str, Any]:
        if save_type != "checkpoint":
            return {}  # A SavedModel has no use for training state.
        return dict(self.tables)

    def restoring_from(self, path: str) -> None:
        """Tells the tables which checkpoint is being restored."""
        for table in self.tables.values():
            table.restore_path = path

    def _checkpoint_adapter(self, path: str) -> None:
        # TF calls it with the checkpoint's path before restoring the
        # children: the readers read their rows from it. No adapter.
        self.restoring_from(path)
        return None


class TableReader(Trackable):  # type: ignore[misc]
    """Reads a SparseCore table's checkpoint into a CPU variable, a block
    at a time (a conditional dependency of `SparseCoreReader`)."""

    def __init__(self, variable: Any, name: str, path: str) -> None:
        self.variable = variable
        self.name = name
        self.path = path

    def _gather_saveables_for_checkpoint(self) -> dict[str, Any]:
        return {VALUE: self._value, LAYOUT: self._layout}

    def _never_saved(self) -> Any:
        raise RuntimeError(f"TableReader of '{self.name}' is never saved.")

    def _read(self, path: str, key: str) -> None:
        shape = [int(d) for d in self.variable.shape]
        rows = checkpoint_rows(path, key, self.name, shape)
        sparsecore_shards.fill_variable(self.variable, rows)

    def _value(self, name: str) -> Any:
        return _ReadItself(name, self.path, self._read, self._never_saved)

    def _layout(self, name: str) -> Any:
        return _Constant(name, self._never_saved, tf.string)


class SparseCoreReader(Trackable):  # type: ignore[misc]
    """A CPU container's reader of a `_sparse_core` node: each of its
    children is a table the container holds by that name."""

    def __init__(self, variables: Mapping[str, Any], path: str) -> None:
        self.variables = dict(variables)
        self.path = path

    def _lookup_dependency(
        self, name: str, cached_dependencies: Any = None
    ) -> Any:
        variable = self.variables.get(name)
        if variable is None:
            return None
        return TableReader(variable, name, self.path)


class TableContainer(tf.Module):  # type: ignore[misc]
    """Tables and slots by name (`<table>`, `<table>/<slot>`), as TF's
    mid-level object names them, that also reads SparseCore checkpoints.

    On CPU its variables are its children; SparseCore tables add
    `EngineTableHandle`s and a `_sparse_core` child (see the module).
    """

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self._restoring_from: str | None = None
        self._saved_keys: frozenset[str] | None = None

    def table_variables(self) -> dict[str, Any]:
        """The children by name (tables, slots, and any other)."""
        return dict(self._trackable_children())

    def _sparse_core_values(self) -> SparseCoreTableValues | None:
        child = self._trackable_children().get(SPARSE_CORE)
        return child if isinstance(child, SparseCoreTableValues) else None

    def _checkpoint_adapter(self, path: str) -> None:
        # TF calls it with the checkpoint's path before restoring the
        # children (`restore.py`, `_queue_children_for_restoration`): the
        # readers below read their rows from it. No adapter.
        self._restoring_from = path
        self._saved_keys = None
        values = self._sparse_core_values()
        if values is not None:
            values.restoring_from(path)
        return None

    def _saved_on_sparse_core(self, name: str) -> bool:
        if self._restoring_from is None:
            return False
        if self._saved_keys is None:
            self._saved_keys = frozenset(
                key for key, _ in tf.train.list_variables(self._restoring_from)
            )
        suffix = f"/{SPARSE_CORE}/{_escaped(name)}{_ATTRIBUTES}{VALUE}"
        return any(key.endswith(suffix) for key in self._saved_keys)

    def _lookup_dependency(
        self, name: str, cached_dependencies: Any = None
    ) -> Any:
        found = super()._lookup_dependency(name, cached_dependencies)
        path = self._restoring_from
        # A restore asks with the children it knows (`restore.py`,
        # `_queue_children_for_restoration`); adding a child asks without
        # (`_track_trackable`), and must find only the real ones.
        if path is None or cached_dependencies is None:
            return found
        if name == SPARSE_CORE and found is None:
            variables = {
                child: value
                for child, value in self.table_variables().items()
                if self._saved_on_sparse_core(child)
            }
            # Else the node waits for the SparseCore tables a layer adds
            # after a restore deferred until its build.
            return SparseCoreReader(variables, path) if variables else None
        values = self._sparse_core_values()
        if (
            values is not None
            and name in values.tables
            and not self._saved_on_sparse_core(name)
        ):
            # Written on CPU (or by an older version): the table's own
            # SparseCore reader restores it.
            return values.tables[name]
        return found

    def _handle_deferred_dependencies(self, name: str, trackable: Any) -> Any:
        # A checkpoint read before the SparseCore tables were added: a
        # `<table>` node with a value was written on CPU, and is the table's.
        values = self._sparse_core_values()
        if values is not None and name in values.tables:
            positions = self._deferred_dependencies.get(name, [])
            if any(p.object_proto.attributes for p in positions):
                table = values.tables[name]
                table.restore_path = positions[0].checkpoint.save_path_string
                trackable = table
        return super()._handle_deferred_dependencies(name, trackable)


def saved_table_shapes(path: str, prefix: str) -> dict[str, list[int]]:
    """`{<prefix>/<table>/.ATTRIBUTES/VARIABLE_VALUE: shape}` of the tables
    (and slots) saved on SparseCore under `prefix` in the checkpoint at
    `path`: the keys and shapes the same tables have when saved on CPU."""
    reader = tf.train.load_checkpoint(path)
    start = f"{prefix}/{SPARSE_CORE}/"
    shapes = {}
    for key in reader.get_variable_to_shape_map():
        if not (key.startswith(start) and key.endswith(_ATTRIBUTES + LAYOUT)):
            continue
        layout = tf_sparse_core_layout_pb2.SparseCoreTableLayout()
        layout.ParseFromString(reader.get_tensor(key))
        name = key[len(start) : -len(_ATTRIBUTES + LAYOUT)]
        shapes[f"{prefix}/{name}{_ATTRIBUTES}{VALUE}"] = [
            int(d) for d in layout.unsharded_shape
        ]
    return shapes
