"""Warm start: a model's tables from the checkpoint of a legacy model.

`warm_start(model, checkpoint)` finds, for every table the model's embedding
layers hold (itself or on the TPU embedding engine), the variable a
feature-column or TPUEstimator model stored it under, and writes it into
the table (and, optionally, the optimizer slots). Names, from the TF
sources:

- `DenseFeatures` / `input_layer` / `SequenceFeatures`: the embedding
  column's variable `embedding_weights` under the column's scope,
  `<scope>/<column name>/embedding_weights` (`feature_column_v2.py`,
  `EmbeddingColumn.create_state`); object-based checkpoints append
  `/.ATTRIBUTES/VARIABLE_VALUE`, which is ignored here.
- `tf.feature_column.shared_embeddings`: one variable named after the
  collection (`SharedEmbeddingColumnCreator.embedding_weights`).
- TPUEstimator TPU embedding columns: the same names "consistent with CPU
  runs" (TF 1.15 `tpu/feature_column.py`, `_record_variable_scope_and_name`
  with `'embedding_weights'`; `feature_column_v2.py` records shared tables
  by collection name, without scope), and slots named
  `<table>/Adagrad`, `<table>/Adam/m`, `<table>/Adam/v`, `<table>/Ftrl`,
  `<table>/Ftrl_1`, `<table>/Momentum` (tensorflow-estimator
  `_tpu_estimator_embedding.py`, `_get_slot_variable_names`).
- Sharded TPUEstimator tables: TF 1.15 `tpu_embedding.py`
  (`_create_partitioned_variables`) makes each table one variable per host
  with `fixed_size_partitioner(num_hosts)`, which a name-based checkpoint
  stores as one key of the full shape, in one slice per host. With
  `partition_strategy="div"` the rows are in order. With `"mod"` host `i`
  holds the ids `i, i + n, ...` (the `embedding_lookup` convention the TPU
  shards follow; inferred, not run on a TPU here), so the stored rows are
  put back by id.

A vocabulary change moves rows by token, as `tf.compat.v1.train.warm_start`
with `VocabInfo` does (`warm_starting_util.py`, through
`checkpoint_ops._load_and_remap_matrix`): a token's row comes from its old
position; new tokens and OOV buckets keep the table's values.

Every table and slot is checked against the checkpoint's index first, then
each is read a stored piece at a time (`checkpoint_rows.CheckpointRows`)
and written in blocks of rows: into a table the layer holds with a scatter
per block, and into an engine table one host shard at a time on that host
(`write_tables`), then loaded onto the chip once. No table passes whole
through this process unless the checkpoint stored it whole.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any
from typing import Mapping
from typing import Sequence

import numpy as np

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import SharedEmbeddingColumn
from keras_tpu_embed.columns import read_vocabulary_file
from keras_tpu_embed.engines.engine import Engine
from keras_tpu_embed.layers import TPUEmbeddingLayer
from keras_tpu_embed.layers_in_model import embedding_layers
from keras_tpu_embed.saving.checkpoint_rows import CheckpointRows
from keras_tpu_embed.saving.checkpoint_rows import vocabulary_positions
from keras_tpu_embed.tables.table_specs import TableSpec

_OBJECT_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
SLOT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "accumulators": ("Adagrad", "Ftrl"),
    "momenta": ("Adam/m", "Momentum"),
    "velocities": ("Adam/v",),
    "linears": ("Ftrl_1",),
}
"""Our slot name -> TF1 slot suffixes (`_get_slot_variable_names`)."""


@dataclasses.dataclass
class WarmStartReport:
    """What `warm_start` did, per table.

    Attributes:
        loaded: Table name -> the checkpoint tensor it was loaded from.
        slots: Table name -> slot name -> checkpoint tensor.
        not_found: Table (or `table/slot`) -> the names that were looked for.
        remapped: Table name -> how many of its tokens took their row from
            the checkpoint (tables given in `vocabularies=`); the others
            keep their initial values.
    """

    loaded: dict[str, str] = dataclasses.field(default_factory=dict)
    slots: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    not_found: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    remapped: dict[str, int] = dataclasses.field(default_factory=dict)


def _candidates(table: TableSpec) -> list[str]:
    """The names a legacy model gives `table`'s variable."""
    first = table.columns[0]
    if isinstance(first, SharedEmbeddingColumn):
        return [table.name, f"{table.name}/embedding_weights"]
    return [f"{first.name}/embedding_weights"]


def _match(names: Sequence[str], wanted: Sequence[str]) -> list[str]:
    return sorted(
        {
            name
            for name in names
            for want in wanted
            if name == want or name.endswith("/" + want)
        }
    )


def _check_num_shards(partition_strategy: str, num_shards: Any) -> None:
    if num_shards is None and partition_strategy == "div":
        return
    if num_shards is None:
        raise ValueError(
            "partition_strategy='mod' needs num_shards: the number of hosts "
            "the TPUEstimator run sharded its tables over."
        )
    # A bool is an int to Python; 0, negatives and fractions would leave
    # rows of the table unwritten (uninitialised memory).
    if (
        isinstance(num_shards, bool)
        or not isinstance(num_shards, (int, np.integer))
        or num_shards < 1
    ):
        raise ValueError(
            "`num_shards` must be a positive integer: the number of hosts "
            "the TPUEstimator run sharded its tables over. Received: "
            f"num_shards={num_shards!r}"
        )


def _check_table_keys(
    argument: str, mapping: Mapping[str, Any], tables: Sequence[str]
) -> None:
    unknown = [key for key in mapping if key not in tables]
    if unknown:
        raise ValueError(
            f"`{argument}` names no table of the model: "
            f"{', '.join(repr(key) for key in unknown)}. Its keys must be "
            f"table names: {sorted(tables)} (a shared table is named after "
            "its collection, any other after its categorical column's key)."
        )


def _remap_vocabularies(
    table: TableSpec, vocabularies: tuple[Any, Any]
) -> tuple[list[Any], list[Any]]:
    """Checked `(old, new)` token lists for `table`.

    Raises:
        ValueError: the table's column has no vocabulary, `new` is not the
            column's own vocabulary, or `old` holds tokens of another type,
            a token twice, or no token of `new`.
    """
    try:
        old, new = vocabularies
    except (TypeError, ValueError):
        raise ValueError(
            f"vocabularies['{table.name}'] must be an (old, new) pair of "
            "token lists or vocabulary files. Received: "
            f"{vocabularies!r}"
        ) from None
    found = [column.categorical_column.vocabulary() for column in table.columns]
    owns = [own for own in found if own is not None]
    if len(owns) != len(found):
        raise ValueError(
            f"vocabularies= remaps rows by token, but table '{table.name}' "
            "is read by a column without a vocabulary (identity, hashed, "
            "bucketized or crossed), whose rows are ids: drop "
            f"'{table.name}' from vocabularies=."
        )
    own, string = owns[0]
    if any(other != (own, string) for other in owns[1:]):
        raise ValueError(
            f"Table '{table.name}' is shared by columns with different "
            "vocabularies, so its rows cannot be moved by token: warm start "
            f"it without vocabularies= or give its columns one vocabulary."
        )
    kind = str if string else int

    def tokens(vocabulary: Any, which: str) -> list[Any]:
        if isinstance(vocabulary, str):
            read = read_vocabulary_file(
                vocabulary, table.name, "string" if string else "int64"
            )
            return read if string else [int(token) for token in read]
        result = list(vocabulary)
        for token in result:
            ok = (
                isinstance(token, str)
                if string
                else isinstance(token, (int, np.integer))
                and not isinstance(token, bool)
            )
            if not ok:
                raise ValueError(
                    f"The {which} vocabulary of table '{table.name}' holds "
                    f"{token!r} (of type {type(token).__name__}), but the "
                    f"column's tokens are {kind.__name__}: they would never "
                    f"match. Give {kind.__name__} tokens."
                )
        return result if string else [int(token) for token in result]

    old_tokens = tokens(old, "old")
    new_tokens = own if new is None else tokens(new, "new")
    if new_tokens != own:
        raise ValueError(
            f"The new vocabulary of table '{table.name}' is not the column's "
            f"own vocabulary ({len(own)} tokens, starting {own[:5]!r}; "
            f"received {len(new_tokens)}, starting {new_tokens[:5]!r}): rows "
            "would land on other tokens' ids. Pass the column's vocabulary "
            f"(or None) as new: vocabularies={{'{table.name}': (old, None)}}."
        )
    seen: dict[Any, int] = {}
    for position, token in enumerate(old_tokens):
        if token in seen:
            raise ValueError(
                f"The old vocabulary of table '{table.name}' holds {token!r} "
                f"twice (positions {seen[token]} and {position}): its rows "
                "cannot be told apart. Give the vocabulary the checkpoint "
                "was trained with."
            )
        seen[token] = position
    if not set(old_tokens) & set(new_tokens):
        raise ValueError(
            f"The old and new vocabularies of table '{table.name}' have no "
            f"token in common (old starts {old_tokens[:5]!r}, new starts "
            f"{new_tokens[:5]!r}), so no row would be loaded. Check that "
            "the old vocabulary is the one the checkpoint was trained with."
        )
    return old_tokens, new_tokens


@dataclasses.dataclass(frozen=True)
class _Load:
    """A checked table or slot: its checkpoint rows and where they go."""

    name: str  # `<table>` or `<table>/<slot>`, for messages
    table: str
    slot: str  # "parameters" or the slot's name
    rows: CheckpointRows
    keeps_rows: bool  # a remap: rows the checkpoint lacks keep their values
    variable: Any = None  # a table or slot the layer holds
    engine: Engine | None = None  # or the engine that holds it


class _EngineRows:
    """A checkpoint's table or slot as the engine's `write_tables` reads
    it: `value[start:stop]` is read from the checkpoint when asked, on the
    host of the shard that holds those rows, one stored piece at a time.

    Made for each host shard once, so no table passes whole through this
    process. With a remap, rows the checkpoint lacks keep the engine's
    values (its initial values before its first step).
    """

    def __init__(self, load: _Load, engine: Engine) -> None:
        self._load = load
        self._engine = engine
        self.shape = load.rows.shape

    def __getitem__(self, rows: slice) -> np.ndarray:
        # Eager even when asked inside a trace: a SparseCore engine builds
        # its tables at its first step, which `fit` or `predict` traces.
        with tf.init_scope():
            return self._read(rows)

    def _read(self, rows: slice) -> np.ndarray:
        start, stop, _ = rows.indices(self.shape[0])
        load = self._load
        result = np.empty((max(stop - start, 0), self.shape[1]), np.float32)
        for shard in self._engine.shards_of(load.table):
            low = max(start, shard.start)
            high = min(stop, shard.start + shard.rows)
            if low >= high:
                continue
            if load.keeps_rows:
                current = self._engine.current_shard(
                    load.table, load.slot, shard
                )
                result[low - start : high - start] = current.numpy()[
                    low - shard.start : high - shard.start
                ]
            for ids, values in load.rows.blocks(low, high, shard.host):
                result[ids - start] = values.numpy()
        return result

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # An engine that takes tables whole (SparseCore) reads it so.
        return np.asarray(self[:], dtype=dtype)


def _write_variable(variable: Any, rows: CheckpointRows) -> None:
    """Writes the rows into a table or slot the layer holds, in place."""
    with tf.init_scope():
        target = variable.value if hasattr(variable, "value") else variable
        for ids, values in rows.blocks(0, rows.shape[0]):
            # A scatter writes in place; an assign would copy the table.
            target.scatter_update(
                tf.IndexedSlices(tf.cast(values, target.dtype), ids)
            )


def _write_engine(engine: Engine, loads: list[_Load], done: list[str]) -> None:
    """Writes one engine's tables and slots, a table at a time (each host
    shard on its host), then loads them onto the chip once; also when a
    read fails part way, so the chip holds what the host copies hold."""
    tables = list(dict.fromkeys(load.table for load in loads))
    try:
        for table in tables:
            mine = [load for load in loads if load.table == table]
            engine.write_tables(
                {
                    (load.table, load.slot): _EngineRows(load, engine)
                    for load in mine
                },
                load=False,
            )
            done.extend(load.name for load in mine)
    finally:
        engine.load_tables(tables)


@dataclasses.dataclass(frozen=True)
class _LegacyCheckpoint:
    """A checkpoint's index (its tensors' shapes and dtypes, read without
    their values) and how the run that wrote it sharded its tables."""

    path: str
    prefix: str
    keys: dict[str, str]  # tensor name (no object suffix) -> its key
    shapes: dict[str, list[int]]  # by key
    dtypes: dict[str, Any]  # by key
    num_shards: int
    mod: bool

    @classmethod
    def open(
        cls, path: str, partition_strategy: str, num_shards: int | None
    ) -> _LegacyCheckpoint:
        """Reads the index of the checkpoint at `path` (path or prefix).

        Raises:
            ValueError: the checkpoint cannot be read.
        """
        try:
            reader = tf.train.load_checkpoint(path)
            shapes = reader.get_variable_to_shape_map()
            dtypes = reader.get_variable_to_dtype_map()
        except (ValueError, tf.errors.OpError) as error:
            raise ValueError(
                f"Cannot read the checkpoint {path}: {error}"
            ) from error
        return cls(
            path=path,
            prefix=(
                tf.train.latest_checkpoint(path)
                if tf.io.gfile.isdir(path)
                else path
            ),
            keys={
                key[: -len(_OBJECT_SUFFIX)]
                if key.endswith(_OBJECT_SUFFIX)
                else key: key
                for key in shapes
            },
            shapes={key: list(shape) for key, shape in shapes.items()},
            dtypes=dict(dtypes),
            num_shards=int(num_shards or 1),
            mod=partition_strategy == "mod",
        )

    def rows(
        self,
        tensor_name: str,
        table: str,
        shape: list[int],
        remap: tuple[list[Any], list[Any]] | None,
    ) -> CheckpointRows:
        """The tensor as rows of `table` (or its slot) of `shape`.

        Raises:
            ValueError: the shapes differ (any dimension; with a remap,
                the dimension), the tensor holds no floats, or the remap's
                old vocabulary has more tokens than the tensor has rows.
        """
        key = self.keys[tensor_name]
        stored = self.shapes[key]
        if stored[1:] != shape[1:] or (remap is None and stored != shape):
            raise ValueError(
                f"Tensor '{tensor_name}' of checkpoint {self.path} has shape "
                f"{stored}, but table '{table}' has shape {shape}. Give the "
                "columns the checkpoint's vocabulary and dimension, or pass "
                "vocabularies= to remap rows."
            )
        dtype = tf.as_dtype(self.dtypes[key])
        if not dtype.is_floating:
            raise ValueError(
                f"Tensor '{tensor_name}' of checkpoint {self.path} holds "
                f"{dtype.name} values, not floats: it is not an embedding "
                f"table. Pass variable_names={{'{table}': <the table's "
                "tensor>}."
            )
        positions = None
        if remap is not None:
            old, new = remap
            if len(old) > stored[0]:
                raise ValueError(
                    f"The old vocabulary of table '{table}' has {len(old)} "
                    f"tokens, but tensor '{tensor_name}' of checkpoint "
                    f"{self.path} has {stored[0]} rows: it is not the "
                    "vocabulary this checkpoint was trained with. Give that "
                    "vocabulary."
                )
            positions = vocabulary_positions(old, new, stored[0], shape[0])
        return CheckpointRows(
            self.prefix,
            key,
            (stored[0], stored[1]),
            dtype,
            rows=shape[0],
            num_shards=self.num_shards,
            mod=self.mod,
            remap=positions,
        )


def _load(
    source: _LegacyCheckpoint,
    layer: TPUEmbeddingLayer,
    table: str,
    on_engine: bool,
    tensor_name: str,
    remap: tuple[list[Any], list[Any]] | None,
    slot: str = "parameters",
) -> _Load:
    """A checked table or slot of `layer`, from `tensor_name`."""
    shape = _table_shapes(layer, table, on_engine)[slot]
    rows = source.rows(tensor_name, table, shape, remap)
    name = table if slot == "parameters" else f"{table}/{slot}"
    keeps_rows = remap is not None
    if on_engine:
        return _Load(name, table, slot, rows, keeps_rows, engine=layer.engine)
    variable = (
        layer.table_variable(table)
        if slot == "parameters"
        else layer.slot_variables(table)[slot]
    )
    return _Load(name, table, slot, rows, keeps_rows, variable=variable)


def _table_shapes(
    layer: TPUEmbeddingLayer, table: str, on_engine: bool
) -> dict[str, list[int]]:
    """`{"parameters": shape, <slot>: shape, ...}` of a table."""
    if on_engine and layer.engine is not None:
        return dict(layer.engine.table_slots(table))
    return {
        "parameters": list(layer.table_variable(table).shape),
        **{
            slot: list(variable.shape)
            for slot, variable in layer.slot_variables(table).items()
        },
    }


def warm_start(
    model: keras.Model,
    checkpoint: str,
    *,
    variable_names: Mapping[str, str] | None = None,
    partition_strategy: str = "div",
    num_shards: int | None = None,
    vocabularies: Mapping[str, tuple[Any, Any]] | None = None,
    slots: bool = False,
) -> WarmStartReport:
    """Loads a model's tables from a feature-column or TPUEstimator checkpoint.

    Tables the layers hold and tables on the TPU embedding engine alike:
    an engine table is written one host shard at a time on its host, and
    loaded onto the chip once (before the engine's first step, TF creates
    it from these values). Every table and slot is checked (names, shapes,
    dtypes, vocabularies, from the checkpoint's index) before any is
    written, so a call that raises for one of those leaves the model
    unchanged. Each is then read one stored piece at a time and written
    in blocks of rows (see `checkpoint_rows.py`).

    Args:
        model: A built model (or layer, or list) with embedding layers.
        checkpoint: The legacy checkpoint (path or prefix).
        variable_names: Table name -> checkpoint tensor name, for names the
            conventions above do not find.
        partition_strategy: `"div"` or `"mod"`: how the TPUEstimator run
            sharded its tables.
        num_shards: The TPUEstimator run's number of hosts (shards), a
            positive integer: it saved each table in that many slices,
            which are then read one at a time. Needed for `"mod"`; without
            it (`"div"`) each tensor is read as one piece.
        vocabularies: Table name -> `(old, new)` vocabularies (token lists
            or text files): rows move by token. `old` is the checkpoint's
            vocabulary; `new` must be the table's column's own vocabulary
            (or `None`, meaning it).
        slots: Also load the optimizer slots (TF1 slot names).

    Returns:
        A `WarmStartReport`. Tables and slots not found are listed there
        and in one warning.

    Raises:
        ValueError: the checkpoint cannot be read, a name matches several
            tensors, a shape differs (both are named), a tensor is not of
            floats, `"mod"` comes without a positive integer `num_shards`,
            a key of `variable_names` or `vocabularies` is not a table of
            the model, or a vocabulary pair cannot move rows (see
            `vocabularies`); the model is then unchanged. Also when a data
            file of the checkpoint fails to read part way, naming the
            tensor and the tables and slots already loaded.
        RuntimeError: a layer is not built yet.
    """
    if partition_strategy not in ("div", "mod"):
        raise ValueError(
            "`partition_strategy` must be 'div' or 'mod'. Received: "
            f"partition_strategy={partition_strategy!r}"
        )
    _check_num_shards(partition_strategy, num_shards)
    layers = list(embedding_layers(model))
    for layer in layers:
        if not layer.built:
            raise RuntimeError(
                f"Layer '{layer.name}' is not built: build the model (call it "
                "once) before warm_start, so that its tables exist."
            )
    table_names = [t.name for layer in layers for t in layer.table_specs]
    explicit = dict(variable_names or {})
    remaps = dict(vocabularies or {})
    _check_table_keys("variable_names", explicit, table_names)
    _check_table_keys("vocabularies", remaps, table_names)
    source = _LegacyCheckpoint.open(checkpoint, partition_strategy, num_shards)
    report = WarmStartReport()
    # Checked before any is written.
    plan: list[_Load] = []
    for layer in layers:
        local = {t.name for t in layer.local_table_specs}
        for table in layer.table_specs:
            on_engine = table.name not in local
            wanted = (
                [explicit[table.name]]
                if table.name in explicit
                else _candidates(table)
            )
            found = _match(list(source.keys), wanted)
            if len(found) > 1:
                raise ValueError(
                    f"Checkpoint {checkpoint} has several tensors for table "
                    f"'{table.name}': {found}. Pass variable_names="
                    f"{{'{table.name}': <one of them>}}."
                )
            if not found:
                report.not_found[table.name] = wanted
                continue
            name = found[0]
            remap = (
                _remap_vocabularies(table, remaps[table.name])
                if table.name in remaps
                else None
            )
            shapes = _table_shapes(layer, table.name, on_engine)
            plan.append(
                _load(source, layer, table.name, on_engine, name, remap)
            )
            report.loaded[table.name] = name
            if remap is not None:
                report.remapped[table.name] = len(set(remap[0]) & set(remap[1]))
            if not slots:
                continue
            for slot in shapes:
                if slot == "parameters":
                    continue
                options = [f"{name}/{s}" for s in SLOT_SUFFIXES.get(slot, ())]
                present = [o for o in options if o in source.keys]
                if not present:
                    report.not_found[f"{table.name}/{slot}"] = options
                    continue
                plan.append(
                    _load(
                        source,
                        layer,
                        table.name,
                        on_engine,
                        present[0],
                        remap,
                        slot,
                    )
                )
                report.slots.setdefault(table.name, {})[slot] = present[0]
    _write(plan, checkpoint)
    if report.not_found:
        warnings.warn(
            f"warm_start: not found in {checkpoint}: "
            + "; ".join(
                f"{table} (looked for {names})"
                for table, names in report.not_found.items()
            )
            + ". Those keep their initial values; pass variable_names= for "
            "other names.",
            stacklevel=2,
        )
    return report


def _write(plan: list[_Load], checkpoint: str) -> None:
    """Writes every checked table and slot: those the layers hold, then
    each engine's.

    Raises:
        ValueError: a read failed part way (a damaged data file), naming
            the tables and slots already loaded.
    """
    done: list[str] = []
    engines: dict[int, tuple[Engine, list[_Load]]] = {}
    current = ""
    try:
        for load in plan:
            if load.engine is not None:
                engines.setdefault(id(load.engine), (load.engine, []))[
                    1
                ].append(load)
                continue
            current = load.name
            _write_variable(load.variable, load.rows)
            done.append(load.name)
        for engine, loads in engines.values():
            current = ", ".join(load.name for load in loads)
            _write_engine(engine, loads, done)
    except tf.errors.OpError as error:
        raise ValueError(
            f"warm_start could not read checkpoint {checkpoint} for "
            f"{current}: {error}. Already loaded from it: {done or 'nothing'}; "
            "the other tables and slots keep their values. Check the "
            "checkpoint's data files."
        ) from error
