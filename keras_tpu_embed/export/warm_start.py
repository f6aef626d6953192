"""Warm start: a model's tables from the checkpoint of a legacy model.

`warm_start(model, checkpoint)` finds, for every table the model's embedding
layers hold, the variable a feature-column or TPUEstimator model stored it
under, and assigns it (and, optionally, the optimizer slots). Names, from
the TF sources:

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
  stores as one key of the full shape. With `partition_strategy="div"` the
  rows are in order. With `"mod"` host `i` holds the ids `i, i + n, ...`
  (the `embedding_lookup` convention the TPU shards follow; inferred, not
  run on a TPU here), so the stored rows are permuted back by id.

A vocabulary change moves rows by token, as `tf.compat.v1.train.warm_start`
with `VocabInfo` does (`warm_starting_util.py`, through
`checkpoint_ops._load_and_remap_matrix`): a token's row comes from its old
position; new tokens and OOV buckets keep the table's initial values.
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
from keras_tpu_embed.layers_in_model import embedding_layers
from keras_tpu_embed.lookup.tables import TableSpec

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


def unshard_mod(value: np.ndarray, num_shards: int) -> np.ndarray:
    """Rows of a "mod"-sharded table (shards concatenated) back in id order.

    Shard `i` holds the ids `i, i + n, ...`; `fixed_size_partitioner` makes
    the first `rows % n` shards one row longer, which is exactly their
    share of ids.

    Example:

    >>> unshard_mod(np.array([[0], [2], [4], [1], [3]]), 2).ravel().tolist()
    [0, 1, 2, 3, 4]
    """
    rows = value.shape[0]
    result = np.empty_like(value)
    offset = 0
    for shard in range(num_shards):
        size = rows // num_shards + (1 if shard < rows % num_shards else 0)
        result[shard::num_shards] = value[offset : offset + size]
        offset += size
    return result


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


def remap_rows(
    old: np.ndarray,
    old_vocabulary: Sequence[Any],
    new_vocabulary: Sequence[Any],
    initial: np.ndarray,
) -> np.ndarray:
    """`initial` with each token's row taken from its old position.

    Example:

    >>> old = np.array([[1.0], [2.0], [3.0]])
    >>> remap_rows(old, ["a", "b", "c"], ["c", "x", "a"],
    ...            np.zeros([4, 1])).ravel().tolist()
    [3.0, 0.0, 1.0, 0.0]
    """
    result = np.array(initial, copy=True)
    position = {token: i for i, token in enumerate(old_vocabulary)}
    for row, token in enumerate(new_vocabulary):
        source = position.get(token)
        if source is not None and source < old.shape[0]:
            result[row] = old[source]
    return result


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

    Every table and slot is read and checked before any is assigned, so a
    call that raises leaves the model unchanged.

    Args:
        model: A built model (or layer, or list) with embedding layers.
        checkpoint: The legacy checkpoint (path or prefix).
        variable_names: Table name -> checkpoint tensor name, for names the
            conventions above do not find.
        partition_strategy: `"div"` or `"mod"`: how the TPUEstimator run
            sharded its tables.
        num_shards: The TPUEstimator run's number of hosts (shards), a
            positive integer; needed for `"mod"`.
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
            tensors, a shape differs (both are named), `"mod"` comes
            without a positive integer `num_shards`, a key of
            `variable_names` or `vocabularies` is not a table of the model,
            or a vocabulary pair cannot move rows (see `vocabularies`).
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
    try:
        reader = tf.train.load_checkpoint(checkpoint)
    except (ValueError, tf.errors.OpError) as error:
        raise ValueError(
            f"Cannot read the checkpoint {checkpoint}: {error}"
        ) from error
    keys = {
        key[: -len(_OBJECT_SUFFIX)]
        if key.endswith(_OBJECT_SUFFIX)
        else key: key
        for key in reader.get_variable_to_shape_map()
    }
    report = WarmStartReport()
    # (variable, value) pairs, assigned only once every one is checked.
    plan: list[tuple[Any, np.ndarray]] = []
    for layer in layers:
        local = {t.name for t in layer.local_table_specs}
        for table in layer.table_specs:
            if table.name not in local:
                # Never silently skipped: the engine owns these variables.
                report.not_found[table.name] = [
                    "(held by the TPU embedding engine: warm start the model "
                    "built without TPUStrategy, then carry its tables over "
                    "with kte.restore_tables)"
                ]
        for table in layer.local_table_specs:
            wanted = (
                [explicit[table.name]]
                if table.name in explicit
                else _candidates(table)
            )
            found = _match(list(keys), wanted)
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

            def read(
                tensor_name: str,
                variable: Any,
                table: TableSpec = table,
                remap: tuple[list[Any], list[Any]] | None = remap,
            ) -> np.ndarray:
                value = reader.get_tensor(keys[tensor_name])
                shape = list(variable.shape)
                wrong = list(value.shape)[1:] != shape[1:] or (
                    remap is None and list(value.shape) != shape
                )
                if wrong:
                    raise ValueError(
                        f"Tensor '{tensor_name}' of checkpoint {checkpoint} "
                        f"has shape {list(value.shape)}, but table "
                        f"'{table.name}' has shape {shape}. "
                        "Give the columns the checkpoint's vocabulary and "
                        "dimension, or pass vocabularies= to remap rows."
                    )
                if not np.issubdtype(value.dtype, np.floating):
                    raise ValueError(
                        f"Tensor '{tensor_name}' of checkpoint {checkpoint} "
                        f"holds {value.dtype} values, not floats: it is not "
                        f"an embedding table. Pass variable_names="
                        f"{{'{table.name}': <the table's tensor>}}."
                    )
                if partition_strategy == "mod":
                    value = unshard_mod(value, int(num_shards or 1))
                if remap is not None:
                    old, new = remap
                    if len(old) > value.shape[0]:
                        raise ValueError(
                            f"The old vocabulary of table '{table.name}' has "
                            f"{len(old)} tokens, but tensor '{tensor_name}' "
                            f"of checkpoint {checkpoint} has {value.shape[0]} "
                            "rows: it is not the vocabulary this checkpoint "
                            "was trained with. Give that vocabulary."
                        )
                    value = remap_rows(value, old, new, variable.numpy())
                dtype: Any = tf.as_dtype(variable.dtype).as_numpy_dtype
                return np.asarray(value, dtype=dtype)

            variable = layer.table_variable(table.name)
            plan.append((variable, read(name, variable)))
            report.loaded[table.name] = name
            if remap is not None:
                report.remapped[table.name] = len(set(remap[0]) & set(remap[1]))
            if not slots:
                continue
            for slot, variable in layer.slot_variables(table.name).items():
                options = [f"{name}/{s}" for s in SLOT_SUFFIXES.get(slot, ())]
                present = [o for o in options if o in keys]
                if not present:
                    report.not_found[f"{table.name}/{slot}"] = options
                    continue
                plan.append((variable, read(present[0], variable)))
                report.slots.setdefault(table.name, {})[slot] = present[0]
    for variable, value in plan:
        variable.assign(value)
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
