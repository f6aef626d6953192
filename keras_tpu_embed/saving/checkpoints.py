"""Checkpoints interchangeable with the TPU embedding mid-level API.

`tf.tpu.experimental.embedding.TPUEmbedding` checkpoints each table as a
dependency named after the table and each slot as `<table>/<slot>` (keys
`<table>/.ATTRIBUTES/...` and `<table>.S<slot>/.ATTRIBUTES/...`). The view
built here tracks the layers' own variables under exactly those names, so
`tf.train.Checkpoint(embedding=engine_checkpoint(model))` on CPU and
`tf.train.Checkpoint(embedding=mid_level_object)` on TPU read and write the
same checkpoint. For layers built on the TPU engine
(`engines/v1/v1_engine.py`), the tables live on the TPU: the view tracks
each engine table and slot under the same name as an
`EngineTableCheckpoint`, which reads the TPU when saved and writes the TPU
when restored, so a checkpoint
written on TPU restores on CPU and the other way round.
"""

from __future__ import annotations

import functools
from typing import Any
from typing import Callable
from typing import Iterator
from typing import NamedTuple

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.engines.v1.v1_variables import EngineTableCheckpoint
from keras_tpu_embed.layers_in_model import embedding_layers
from keras_tpu_embed.saving.export_records import damaged_file_error
from keras_tpu_embed.saving.loading import LOAD_ERRORS
from keras_tpu_embed.tables.sparsecore_checkpoint import EngineTableHandle
from keras_tpu_embed.tables.sparsecore_checkpoint import TableContainer
from keras_tpu_embed.tables.sparsecore_checkpoint import saved_table_shapes


class EngineCheckpointView(TableContainer):
    """Tables as `<table>` and slots as `<table>/<slot>`, for checkpoints;
    each layer's `embedding_step` under `embedding_steps/<table>`."""

    def __init__(self) -> None:
        super().__init__(name="embedding_engine_checkpoint")
        self._named: list[tuple[str, Any]] = []

    def track_steps(self, steps: dict[str, Any]) -> None:
        """Tracks `{table name: its layer's embedding_step variable}`.

        The step drives `learning_rate_fn` schedules: a restore without it
        would start them over. Keyed by table name, as the tables are
        (layer names may differ between the models that write and read):
        a layer's step is one variable, saved once. A TPU mid-level
        object's checkpoint has no steps: `restore_tables` then leaves them
        as they are; restoring one of these into a mid-level object leaves
        the steps unread.
        """
        module = tf.Module(name="embedding_steps")
        for table, variable in sorted(steps.items()):
            if isinstance(variable, keras.Variable):
                variable = variable.value
            setattr(module, table, variable)
        self.embedding_steps = module

    def track(self, name: str, variable: Any) -> None:
        """Tracks `variable` (its tf.Variable, which the engine saves)."""
        if isinstance(variable, keras.Variable):
            variable = variable.value
        setattr(self, name, variable)
        self._named.append((name, variable))

    def named_variables(self) -> list[tuple[str, Any]]:
        """Every `(name, variable)` tracked, tables and slots."""
        return list(self._named)


def engine_checkpoint(model_or_layers: Any, steps: bool = True) -> Any:
    """A trackable holding every table and slot under the engine's names.

    Args:
        model_or_layers: A Keras model, an embedding layer, or a list of
            them. Layers must be built.
        steps: Also hold each layer's `embedding_step` (under
            `embedding_steps/<table name>` for each of its tables), which
            `learning_rate_fn` schedules read. A checkpoint of TF's TPU
            mid-level object has none: read one with `restore_tables`
            (which then keeps the steps) or a view made with
            `steps=False`, whose checkpoints TF's mid-level object reads
            with nothing left over.

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
    view = EngineCheckpointView()
    owners: dict[str, str] = {}
    names: list[tuple[str, Any]] = []
    layers = embedding_layers(model_or_layers)
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
    if engine is not None:
        for table_name in engine.table_names:
            owners[table_name] = "the TPU embedding engine"
        names.extend(engine.checkpoint_tables(engine.table_names).items())
        for name, extra in engine.checkpoint_extras(engine.table_names).items():
            setattr(view, name, extra)
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
        view.track(name, variable)
    if steps:
        view.track_steps(
            {
                table.name: layer.embedding_step
                for layer in layers
                for table in layer.table_specs
            }
        )
    return view


_KEY_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


class _NamedTable(NamedTuple):
    """A table or slot as `restore_tables` and `validate_tables` see it."""

    name: str
    shape: list[int]
    # Its rows in pieces, `(first row, values)`: one per host shard for the
    # engine's tables (read on their hosts), the whole variable otherwise.
    pieces: Callable[[], Iterator[tuple[int, Any]]]


def _engine_pieces(
    table: EngineTableCheckpoint,
) -> Iterator[tuple[int, Any]]:
    for shard in table.shards():
        yield shard.start, table.read_shard(shard)


def _whole(variable: Any) -> Iterator[tuple[int, Any]]:
    """A variable, or a SparseCore table read (a callable), whole."""
    yield (
        0,
        tf.convert_to_tensor(variable() if callable(variable) else variable),
    )


def _pieces_of(variable: Any) -> Callable[[], Iterator[tuple[int, Any]]]:
    """How a view's table or slot is read: the engine's a host shard at a
    time, a SparseCore table whole (one at a time), a variable whole."""
    if isinstance(variable, EngineTableCheckpoint):
        return functools.partial(_engine_pieces, variable)
    if isinstance(variable, EngineTableHandle):
        return lambda: iter([(0, variable.read())])
    return functools.partial(_whole, variable)


def _named_tables(view: EngineCheckpointView) -> list[_NamedTable]:
    """Every table and slot of an `engine_checkpoint` view, read when its
    pieces are asked for."""
    return [
        _NamedTable(name, list(variable.shape), _pieces_of(variable))
        for name, variable in view.named_variables()
    ]


def restore_tables(
    model_or_layers: Any, path: str, prefix: str = "embedding"
) -> None:
    """Restores every table and slot from a checkpoint, or raises.

    The checkpoint is one written with
    `tf.train.Checkpoint(**{prefix: engine_checkpoint(...)})`, by `save` or
    by `write`, here or by the TPU mid-level API.

    Raises:
        ValueError: a table or slot of the model is missing from the
            checkpoint (renamed, or never saved), has another shape there,
            or the checkpoint is truncated or corrupt. The message names the
            table, the shapes, and the file.

    On the TPU embedding engine the tables are restored onto the TPU, also
    from a checkpoint written on CPU; before the engine's first step, TF
    builds them from the checkpoint at that step.
    """
    try:
        saved = dict(tf.train.list_variables(path))
        # Tables saved on SparseCore, by the key and shape they have on CPU.
        saved.update(saved_table_shapes(path, prefix))
    except LOAD_ERRORS as error:
        raise damaged_file_error(path, error) from error
    # Checkpoints of TF's mid-level object (and of this package before it
    # saved the steps) have no steps: the layers keep theirs.
    view = engine_checkpoint(
        model_or_layers,
        steps=any(k.startswith(f"{prefix}/embedding_steps/") for k in saved),
    )
    problems = []
    for name, shape, _ in _named_tables(view):
        key = f"{prefix}/{name.replace('/', '.S')}{_KEY_SUFFIX}"
        if key not in saved:
            problems.append(f"table '{name}' is missing")
        elif list(saved[key]) != shape:
            problems.append(
                f"table '{name}' has shape {list(saved[key])} in the "
                f"checkpoint but {shape} in the model"
            )
    if problems:
        found = sorted(
            k[len(prefix) + 1 : -len(_KEY_SUFFIX)].replace(".S", "/")
            for k in saved
            if k.startswith(prefix + "/") and k.endswith(_KEY_SUFFIX)
        )
        raise ValueError(
            f"Cannot restore the embedding tables from {path}: "
            + "; ".join(problems)
            + f". The checkpoint holds: {found}."
        )
    # `read`, not `restore`: `restore` also expects the `save_counter` that
    # only `Checkpoint.save` writes, which made good `write` checkpoints
    # look damaged.
    try:
        status = tf.train.Checkpoint(**{prefix: view}).read(path)
    except LOAD_ERRORS as error:
        raise damaged_file_error(path, error) from error
    try:
        status.assert_existing_objects_matched()
    except AssertionError as error:
        raise ValueError(
            f"Cannot restore the embedding tables from {path}: {error}"
        ) from error
    status.expect_partial()


def validate_tables(model_or_layer: Any) -> dict[str, list[int]]:
    """Rows holding NaN or inf, per table and per slot (`<table>/<slot>`).

    Only tables and slots that have such rows are listed: a NaN in an
    optimizer slot turns its row NaN at the row's next update. Tables on the
    TPU embedding engine are read from the TPU (after its first step).

    Args:
        model_or_layer: A model, an embedding layer, or a list of them.

    Returns:
        `{name: [row, ...]}` for each table or slot with non-finite rows.

    Raises:
        ValueError: the tables are on the TPU embedding engine, which has
            not run its first step (its tables do not exist yet).

    Example:

    >>> item = categorical_column_with_identity("item", 4)
    >>> layer = TPUEmbeddingLayer([embedding_column(item, 2)])
    >>> layer.build()
    >>> layer.table_variable("item")[2, 0].assign(float("nan"))
    ... # doctest: +ELLIPSIS
    <...>
    >>> validate_tables(layer)
    {'item': [2]}
    """
    view = engine_checkpoint(model_or_layer)
    report = {}
    for name, _, pieces in _named_tables(view):
        rows = []
        for start, values in pieces():
            bad = tf.where(
                tf.reduce_any(tf.logical_not(tf.math.is_finite(values)), axis=1)
            )
            rows += [start + int(i) for i in bad.numpy().ravel()]
        if rows:
            report[name] = rows
    return report
