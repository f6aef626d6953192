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

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import SharedEmbeddingColumn
from keras_tpu_embed.columns import read_vocabulary_file
from keras_tpu_embed.layers import embedding_layers

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
    """

    loaded: dict[str, str] = dataclasses.field(default_factory=dict)
    slots: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    not_found: dict[str, list[str]] = dataclasses.field(default_factory=dict)


def _candidates(table: Any) -> list[str]:
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


def _tokens(vocabulary: Any, table: str) -> list[Any]:
    if isinstance(vocabulary, str):
        return list(read_vocabulary_file(vocabulary, table, "string"))
    return list(vocabulary)


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
    model: Any,
    checkpoint: str,
    *,
    variable_names: Mapping[str, str] | None = None,
    partition_strategy: str = "div",
    num_shards: int | None = None,
    vocabularies: Mapping[str, tuple[Any, Any]] | None = None,
    slots: bool = False,
) -> WarmStartReport:
    """Loads a model's tables from a feature-column or TPUEstimator checkpoint.

    Args:
        model: A built model (or layer, or list) with embedding layers.
        checkpoint: The legacy checkpoint (path or prefix).
        variable_names: Table name -> checkpoint tensor name, for names the
            conventions above do not find.
        partition_strategy: `"div"` or `"mod"`: how the TPUEstimator run
            sharded its tables.
        num_shards: The TPUEstimator run's number of hosts (shards); needed
            for `"mod"`.
        vocabularies: Table name -> `(old, new)` vocabularies (token lists
            or text files): rows move by token.
        slots: Also load the optimizer slots (TF1 slot names).

    Returns:
        A `WarmStartReport`. Tables and slots not found are listed there
        and in one warning.

    Raises:
        ValueError: the checkpoint cannot be read, a name matches several
            tensors, a shape differs (both are named), or `"mod"` comes
            without `num_shards`.
        RuntimeError: a layer is not built yet.
    """
    if partition_strategy not in ("div", "mod"):
        raise ValueError(
            "`partition_strategy` must be 'div' or 'mod'. Received: "
            f"partition_strategy={partition_strategy!r}"
        )
    if partition_strategy == "mod" and not num_shards:
        raise ValueError(
            "partition_strategy='mod' needs num_shards: the number of hosts "
            "the TPUEstimator run sharded its tables over."
        )
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
    explicit = dict(variable_names or {})
    for layer in embedding_layers(model):
        if not layer.built:
            raise RuntimeError(
                f"Layer '{layer.name}' is not built: build the model (call it "
                "once) before warm_start, so that its tables exist."
            )
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

            def load(tensor_name: str, variable: Any) -> None:
                value = reader.get_tensor(keys[tensor_name])
                if partition_strategy == "mod":
                    value = unshard_mod(value, int(num_shards or 1))
                if vocabularies and table.name in vocabularies:
                    old, new = vocabularies[table.name]
                    value = remap_rows(
                        value,
                        _tokens(old, table.name),
                        _tokens(new, table.name),
                        variable.numpy(),
                    )
                if list(value.shape) != list(variable.shape):
                    raise ValueError(
                        f"Tensor '{tensor_name}' of checkpoint {checkpoint} "
                        f"has shape {list(value.shape)}, but table "
                        f"'{table.name}' has shape {list(variable.shape)}. "
                        "Give the columns the checkpoint's vocabulary and "
                        "dimension, or pass vocabularies= to remap rows."
                    )
                variable.assign(value)

            load(name, layer.table_variable(table.name))
            report.loaded[table.name] = name
            if not slots:
                continue
            for slot, variable in layer.slot_variables(table.name).items():
                options = [f"{name}/{s}" for s in SLOT_SUFFIXES.get(slot, ())]
                present = [o for o in options if o in keys]
                if not present:
                    report.not_found[f"{table.name}/{slot}"] = options
                    continue
                load(present[0], variable)
                report.slots.setdefault(table.name, {})[slot] = present[0]
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
