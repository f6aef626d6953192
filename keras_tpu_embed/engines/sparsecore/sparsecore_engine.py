"""SparseCore (`TPUEmbeddingV2`, embedding_feature V2): what it honours.

TensorFlow's SparseCore mid-level API (`tpu_embedding_v3.py`,
`TPUEmbeddingV2`) builds from the same `tf.tpu.experimental.embedding`
configs as the V1 engine but reads fewer of their fields. Its update ops
(`xla_sparse_dense_matmul_grad_with_{sgd,adagrad,adagrad_momentum,adam,
ftrl}_and_static_buffer_size`, called from `TPUEmbeddingV2.apply_gradients`)
take the learning rate (a callable is called every step) and each rule's
own hyperparameters, and nothing else: no gradient clipping
(`clipvalue`, and so no `EmbeddingConfig.clipping_limit`), no weight
clipping, no FTRL `allow_zero_accumulator`; the Adam op updates the rows of
the batch only (lazy Adam). Weight decay makes its constructor raise
`NotImplementedError`; any other optimizer class makes `apply_gradients`
raise "Unsupported optimizer". Its input op
(`convert_to_list_of_sparse_core_coo_tensors`) takes the combiner as a
string: `sum`, `mean` and `sqrtn` are TF's built-in three.

`refuse_what_sparse_core_cannot_honour` says each of these at build, by
column, with what to do instead: a table trained without a clip it was
given would answer differently from the same model on CPU.
`SparseCoreEngine` follows the engine rules both engines share
(`engine_step.py`: one per strategy, every layer receiving every engine
feature, the gradient trap) with tables of its own, driving
`TPUEmbeddingV2`; `engine_registry.ENGINES` names it for V2 hardware.
"""

from __future__ import annotations

import copy
from typing import Any
from typing import Callable
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed._tf_private import sparsecore_build_per_sparse_core
from keras_tpu_embed._tf_private import wrap_sparsecore_preprocessing
from keras_tpu_embed.backends.gradient_trap import trap_gradients
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.engines.conversion import to_tpu_feature_configs
from keras_tpu_embed.engines.engine_host_ids import HostIdRule
from keras_tpu_embed.engines.engine_members import HostShard
from keras_tpu_embed.engines.engine_step import EngineStep
from keras_tpu_embed.engines.sparsecore import sparsecore_buffers
from keras_tpu_embed.placement import hardware as tpu_hardware
from keras_tpu_embed.tables.initialization import EngineInitializer
from keras_tpu_embed.tables.sparsecore_checkpoint import SPARSE_CORE
from keras_tpu_embed.tables.sparsecore_checkpoint import EngineTableHandle
from keras_tpu_embed.tables.sparsecore_checkpoint import SparseCoreTable
from keras_tpu_embed.tables.sparsecore_checkpoint import SparseCoreTableValues
from keras_tpu_embed.tables.sparsecore_checkpoint import local_name
from keras_tpu_embed.tables.sparsecore_shards import SparseCoreInitializer
from keras_tpu_embed.tables.sparsecore_shards import as_rows
from keras_tpu_embed.tables.sparsecore_shards import initializer_rows
from keras_tpu_embed.tables.sparsecore_shards import read_rows
from keras_tpu_embed.tables.sparsecore_shards import read_table
from keras_tpu_embed.tables.sparsecore_shards import write_table
from keras_tpu_embed.types import Tensor

# `TPUEmbeddingV2.apply_gradients` has one update op for each of these.
_V2_OPTIMIZERS = ("SGD", "Adagrad", "AdagradMomentum", "Adam", "FTRL")
_V2_COMBINERS = ("sum", "mean", "sqrtn")

_WHAT_WORKS = (
    "give those columns embedding_lookup_device='tpu_tensor_core' and "
    "tensor_core_shape=[None, ids_per_example] (dense lookups on the "
    "TensorCore, which apply it), or train on a TPU whose embedding_feature "
    "is V1 (e.g. TPU v4)"
)


def _table_problems(
    table: tf.tpu.experimental.embedding.TableConfig, config: EmbeddingConfig
) -> list[str]:
    """What `TPUEmbeddingV2` would ignore or refuse in one `TableConfig`."""
    optimizer = table.optimizer
    kind = type(optimizer).__name__
    embedding = tf.tpu.experimental.embedding
    known = kind in _V2_OPTIMIZERS and isinstance(
        optimizer, getattr(embedding, kind)
    )
    if optimizer is not None and not known:
        return [
            f"its optimizer {kind}, which TPUEmbeddingV2.apply_gradients "
            "has no update for ('Unsupported optimizer'); use one of "
            f"{list(_V2_OPTIMIZERS)}"
        ]
    problems = []
    if table.combiner not in _V2_COMBINERS:
        problems.append(
            f"combiner={table.combiner!r}; SparseCore combines with one of "
            f"{list(_V2_COMBINERS)}"
        )
    if optimizer is None:
        return problems
    clip = (optimizer.clip_gradient_min, optimizer.clip_gradient_max)
    if clip != (None, None):
        source = (
            f"EmbeddingConfig.clipping_limit={config.clipping_limit}"
            if config.clipping_limit is not None
            and clip[1] == float(config.clipping_limit)
            else f"the optimizer's clipvalue={clip}"
        )
        problems.append(
            f"gradient clipping ({source}); drop it (SparseCore's update "
            "ops take no clip bounds)"
        )
    for bound in ("clip_weight_min", "clip_weight_max"):
        value = getattr(optimizer, bound)
        if value is not None:
            problems.append(
                f"the optimizer's {bound}={value}; drop it (SparseCore's "
                "update ops do not clip weights)"
            )
    if (
        optimizer.weight_decay_factor is not None
        or optimizer.multiply_weight_decay_factor_by_learning_rate
    ):
        problems.append(
            "the optimizer's weight_decay_factor="
            f"{optimizer.weight_decay_factor} (with "
            "multiply_weight_decay_factor_by_learning_rate="
            f"{optimizer.multiply_weight_decay_factor_by_learning_rate}); "
            "TPUEmbeddingV2 raises NotImplementedError for weight decay"
        )
    if kind == "Adam" and not optimizer.lazy_adam:
        problems.append(
            "Adam with lazy_adam=False; SparseCore's Adam updates only the "
            "rows of the batch: use lazy_adam=True"
        )
    if kind == "FTRL" and optimizer.allow_zero_accumulator:
        problems.append(
            "FTRL with allow_zero_accumulator=True, which SparseCore's FTRL "
            "update has no field for: use allow_zero_accumulator=False"
        )
    return problems


def refuse_what_sparse_core_cannot_honour(
    layer_name: str,
    columns: Sequence[AnyEmbeddingColumn],
    config: EmbeddingConfig,
    step: Any = None,
) -> None:
    """Raises if `TPUEmbeddingV2` would not train the columns as asked.

    Args:
        layer_name: The layer's name, for the message.
        columns: The layer's columns on the SparseCore engine.
        config: The layer's `EmbeddingConfig` (its optimizer, clipping,
            partition strategy and raw `feature_to_config_dict`).
        step: The layer's embedding step, for `learning_rate_fn`s.

    Raises:
        ValueError: naming each column (or raw feature) and what SparseCore
            cannot honour for it, with the fix.

    Example:

    >>> item = categorical_column_with_identity("item", 10)
    >>> refuse_what_sparse_core_cannot_honour(
    ...     "embed", [embedding_column(item, 4)],
    ...     EmbeddingConfig(clipping_limit=1.0))
    Traceback (most recent call last):
    ...
    ValueError: Layer 'embed' cannot put these on the SparseCore ...
    """
    if config.partition_strategy != "div":
        names = sorted(c.name for c in columns)
        raise ValueError(
            f"Layer '{layer_name}' has partition_strategy="
            f"{config.partition_strategy!r} for the columns {names}, but "
            "SparseCore (TPUEmbeddingV2) places rows itself (row r of a "
            "table on SparseCore (r + rotation) mod the number of "
            "SparseCores, stacked with other tables), and keras_tpu_embed "
            "checkpoints each table by table name. The partition "
            "strategy would change nothing: use partition_strategy='div' "
            "(the default)."
        )
    features = to_tpu_feature_configs(columns, config, step=step)
    by_table: dict[
        str, tuple[tf.tpu.experimental.embedding.TableConfig, list[str]]
    ] = {}
    for name, feature in features.items():
        entry = by_table.setdefault(feature.table.name, (feature.table, []))
        entry[1].append(name)
    lines = []
    for table_name, (table, names) in sorted(by_table.items()):
        for problem in _table_problems(table, config):
            lines.append(
                f"- columns {sorted(names)} (table '{table_name}'): {problem}"
            )
    if lines:
        raise ValueError(
            f"Layer '{layer_name}' cannot put these on the SparseCore "
            "embedding engine of this TPU (embedding_feature V2, "
            "tf.tpu.experimental.embedding.TPUEmbeddingV2), which would "
            "train them differently from the same model on CPU:\n"
            + "\n".join(lines)
            + f"\nFix each as said, or {_WHAT_WORKS}."
        )


def _initializer_of(table: tf.tpu.experimental.embedding.TableConfig) -> Any:
    """The initializer the table's columns were given (as on CPU)."""
    initializer = table.initializer
    if isinstance(initializer, EngineInitializer):
        return initializer.initializer
    return initializer


def _output_shape(
    feature: tf.tpu.experimental.embedding.FeatureConfig, batch: int
) -> list[int]:
    """Per replica: `[batch]`, or `[batch, max_sequence_length]` for a
    sequence feature (one sample per position, see `_positions_as_samples`).
    """
    if feature.max_sequence_length > 0:
        return [batch, feature.max_sequence_length]
    return [batch]


def _positions_as_samples(
    ids: Tensor, weights: Tensor | None, length: int, batch: int
) -> tuple[Tensor, Tensor | None]:
    """Sequence ids `[batch, n]` as `[batch * length, 1]` sparse samples.

    `TPUEmbeddingV2` ignores `max_sequence_length`: it combines each sample
    (row) of a feature into one vector and reshapes the feature's samples
    to its `output_shape`. So position `p` of example `b` is fed as sample
    `b * length + p`, positions from `length` on are dropped here, on the
    host, as the host path truncates them (`lookups/sparse.py`, `sequence`:
    one segment per position, combined with the column's combiner), and
    the `[batch, length]` output shape gives `[batch, length, dim]`, zero
    where a position holds no id.
    """

    def as_sparse(value: Tensor) -> Any:
        if isinstance(value, tf.RaggedTensor):
            return value.to_sparse()
        return value

    ids = as_sparse(ids)
    keep = ids.indices[:, 1] < length
    kept = tf.boolean_mask(ids.indices, keep)
    samples = kept[:, 0] * length + kept[:, 1]
    indices = tf.stack([samples, tf.zeros_like(samples)], axis=1)
    shape = tf.constant([batch * length, 1], tf.int64)
    sparse_ids = tf.SparseTensor(
        indices, tf.boolean_mask(ids.values, keep), shape
    )
    if weights is None:
        return sparse_ids, None
    weights = as_sparse(weights)
    return sparse_ids, tf.SparseTensor(
        indices, tf.boolean_mask(weights.values, keep), shape
    )


def _host_rules_in_preprocessing(
    mid_level: tf.tpu.experimental.embedding.TPUEmbeddingV2,
    rules: dict[str, HostIdRule],
) -> None:
    """Makes `mid_level` apply the columns' id rules on the host, and feed
    sequence features one sample per position.

    `TPUEmbeddingV2.enqueue` runs its host preprocessing,
    `_preprocess_features`, under outside compilation in a TPU step, with
    the step's own inputs (`flat_inputs`, `flat_weights`, in the order of
    its `flat_features`). Each feature is rewritten there, on the host: the
    column's id rules (`engine_host_ids.HostIdRule`: default values, the
    named range check, pruned weights, truncated sequences), then
    sequence features as samples (`_positions_as_samples`). So the TPU
    program gets no sparse op of ours, and the enqueue still receives the
    step's direct inputs.
    """

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def preprocess(*args: Any, **kwargs: Any) -> Any:
            inputs = list(kwargs["flat_inputs"])
            weights = list(kwargs.get("flat_weights") or [None] * len(inputs))
            for i, (path, feature) in enumerate(kwargs["flat_features"]):
                rule = rules.get(path)
                if rule is not None:
                    inputs[i], weights[i] = rule.apply(inputs[i], weights[i])
                shape = list(feature.output_shape)
                if len(shape) == 2:
                    inputs[i], weights[i] = _positions_as_samples(
                        inputs[i], weights[i], shape[1], shape[0]
                    )
            kwargs["flat_inputs"], kwargs["flat_weights"] = inputs, weights
            return original(*args, **kwargs)

        return preprocess

    wrap_sparsecore_preprocessing(mid_level, wrap)


def _check_samples_divide(
    features: dict[str, Any], batch: int, replicas: int, sparse_cores: int
) -> None:
    """Raises unless each feature's samples split evenly over a chip's
    SparseCores.

    `TPUEmbeddingV2` gives each SparseCore of a chip `sample_count //
    num_sc_per_chip` of a feature's per-replica samples
    (`_preprocess_inputs_and_weights_to_list_of_coo_tensors` in
    `tpu_embedding_v3.py`): the remainder would have no activation. A
    sample is an example, or one position of a sequence feature.

    Raises:
        ValueError: naming the features, the batch and the batch to use.
    """
    uneven = sorted(
        name
        for name, feature in features.items()
        if (batch * max(1, feature.max_sequence_length)) % sparse_cores
    )
    if uneven:
        raise ValueError(
            f"The SparseCore engine splits each feature's per-replica samples "
            f"evenly over the chip's {sparse_cores} SparseCores, but the "
            f"per-replica batch is {batch} (a global batch of "
            f"{batch * replicas} over {replicas} replicas), which does not "
            f"divide for the features {uneven}. Use a global batch size "
            f"divisible by {replicas * sparse_cores} (replicas x SparseCores "
            "per chip) in kte.distribute_dataset."
        )


class SparseCoreEngine(EngineStep):
    """The engine rules V1 has (`EngineStep`), driving `TPUEmbeddingV2`.

    One per strategy, every layer receiving every engine feature, one
    lookup per step inside the gradient trap, exactly as on V1. What
    differs is TF's V2 API:

    - `TPUEmbeddingV2` stacks tables by per-replica sample count at
      construction, so it is made at the first step, when the per-replica
      batch is known, with each feature's `output_shape` (keras-rs sets
      them before its constructor too, `DistributedEmbedding.
      _sparsecore_init`);
    - the lookup is one call, `mid_level(features, weights)`, that returns
      the activations and the preprocessed inputs, which the trap's
      backward pass hands to `apply_gradients(gradients,
      preserved_outputs)` (as keras-rs' `_tpu_embedding_lookup_v2`); no
      named enqueue, so evaluate and predict simply do not call it;
    - sequence features are truncated on the host and fed one sample per
      position (`_positions_as_samples`, inside TF's own host
      preprocessing: `_host_rules_in_preprocessing`);
    - tables are stacked and sharded: TF asks for each SparseCore's rows of
      each table when it creates them (`sparsecore_shards.
      SparseCoreInitializer`, answered from the rows the column's
      initializer makes on one device, or from a value restored before), and
      `read_tables` / `write_tables` read and write one table one
      SparseCore's rows at a time: no whole stack, and no whole table but
      the one asked for, is ever on the client.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._checkpoint_values: dict[tuple[str, str], SparseCoreTable] = {}

    def _refuse_what_it_cannot_honour(
        self,
        layer_name: str,
        columns: Sequence[AnyEmbeddingColumn],
        config: EmbeddingConfig,
        step: Any,
    ) -> None:
        refuse_what_sparse_core_cannot_honour(
            layer_name, columns, config, step=step.value
        )

    def _make_mid_level(self) -> Any:
        # Made at the first step (`_mid_level_for`): the per-replica batch
        # is not known before.
        return None

    def _mid_level_for(self, batch: int, inputs: dict[str, Tensor]) -> Any:
        """The mid-level object, made at the first step: its buffers are
        sized from that step's per-replica batch and input shapes."""
        if self._mid_level is not None:
            return self._mid_level
        strategy = tf.distribute.get_strategy()
        _check_samples_divide(
            self._feature_configs,
            batch,
            strategy.num_replicas_in_sync,
            tpu_hardware.sparse_cores_per_chip(strategy),
        )
        embedding = tf.tpu.experimental.embedding
        initializers: dict[str, SparseCoreInitializer] = {}
        tables: dict[str, tf.tpu.experimental.embedding.TableConfig] = {}
        for feature in self._feature_configs.values():
            name = feature.table.name
            if name not in tables:
                # TF copies each TableConfig (`_clone_feature_config`) but
                # keeps its initializer object: bound below, once TF has
                # stacked the tables.
                tables[name] = copy.copy(feature.table)
                initializers[name] = SparseCoreInitializer(name)
                tables[name].initializer = initializers[name]
        features = {
            name: embedding.FeatureConfig(
                table=tables[feature.table.name],
                max_sequence_length=feature.max_sequence_length,
                output_shape=_output_shape(feature, batch),
                name=feature.name,
            )
            for name, feature in self._feature_configs.items()
        }
        # Each layer's bounds, for the columns it holds.
        configs = [(m.config, list(m.features)) for m in self._members]
        mid_level = tpu_hardware.mid_level_class(self.hardware)(
            feature_config=features,
            optimizer=self._optimizer,
            pipeline_execution_with_tensor_core=bool(self._pipeline),
            # Automatic stacking of tables of one width and optimizer; ids
            # over the static buffers raise rather than being dropped.
            sparse_core_embedding_config=sparsecore_buffers.buffer_sizes(
                features,
                inputs,
                sparsecore_buffers.declared_ids(configs),
                replicas=strategy.num_replicas_in_sync,
                sparse_cores_per_chip=tpu_hardware.sparse_cores_per_chip(
                    strategy
                ),
                profiled=sparsecore_buffers.profiled_ids(configs, features),
            ),
        )
        _host_rules_in_preprocessing(mid_level, self._host_rules)
        self._mid_level = mid_level
        layouts = mid_level.embedding_layouts
        engine_tables = {
            f.table.name: f.table for f in self._feature_configs.values()
        }
        for table in engine_tables.values():
            restored = self._pending.pop((table.name, "parameters"), None)
            initializers[table.name].bind(
                layouts[table.name],
                as_rows(restored)
                if restored is not None
                else initializer_rows(
                    _initializer_of(table),
                    (table.vocabulary_size, table.dim),
                ),
            )
        with tf.init_scope():
            sparsecore_build_per_sparse_core(
                mid_level, strategy.num_replicas_in_sync
            )
            self._load_pending()
        return mid_level

    def _dequeue_with_trap(
        self,
        name: str,
        features: dict[str, Tensor],
        weights: dict[str, Tensor | None] | None,
    ) -> list[Tensor]:
        """The V2 lookup inside the gradient trap; its backward pass calls
        `apply_gradients` with the lookup's preprocessed inputs."""
        mid_level = self._mid_level_for(int(self._batch_size or 0), features)
        preserved: dict[str, Any] = {}

        def lookup() -> list[Tensor]:
            activations, outputs = mid_level(features, weights)
            preserved["outputs"] = outputs
            return list(tf.nest.flatten(activations))

        def apply_gradients(gradients: list[Tensor]) -> Tensor:
            packed = self._refuse_non_finite(
                self._scaled_gradients(
                    tf.nest.pack_sequence_as(self._feature_configs, gradients)
                )
            )
            mid_level.apply_gradients(
                packed, preserved_outputs=preserved["outputs"]
            )
            return self._count_step()

        return trap_gradients(
            lookup,
            [member.trigger.value for member in self._members],
            apply_gradients,
        )

    # -------------------------------------------------------------- tables
    # One host: a table is one "host shard", read and written one table and
    # one SparseCore at a time (`sparsecore_shards`); checkpoints save each
    # SparseCore's slice (`sparsecore_checkpoint`).

    def sync_host_copies(self) -> None:
        """The stacked variables are read from the chip's shards directly."""

    def read_tables(self, tables: Sequence[str]) -> dict[tuple[str, str], Any]:
        keys = [(t, slot) for t in tables for slot in self.table_slots(t)]
        if not self._tables_created():
            if all(key in self._pending for key in keys):
                return {key: self._pending[key] for key in keys}
            raise self._not_created_error(tables)
        return self._read_created(keys)

    def write_tables(self, values: Any, load: bool = True) -> None:
        self.check_values(values)
        self._pending.update(values)
        if load:
            self.load_tables([])

    def load_tables(self, tables: Sequence[str]) -> None:
        if self._tables_created():
            self._load_pending()

    def shards_of(self, table: str) -> list[HostShard]:
        """One shard, the whole table, on this process."""
        rows = self.table_slots(table)["parameters"][0]
        return [
            HostShard("/job:localhost/replica:0/task:0/device:CPU:0", 0, rows)
        ]

    def read_shard(self, table: str, slot: str, shard: HostShard) -> Tensor:
        return tf.constant(self.read_tables([table])[(table, slot)])

    def read_shard_rows(
        self, table: str, slot: str, shard: HostShard, start: int, stop: int
    ) -> Tensor:
        """Rows `[start, stop)`, each from the SparseCore that holds it."""
        if not self._tables_created():
            return self.read_shard(table, slot, shard)[start:stop]
        layout, variable = self._layout_and_variable(table, slot)
        return tf.constant(read_rows(variable, layout, start, stop))

    def restore_shard(
        self, table: str, slot: str, shard: HostShard, value: Tensor
    ) -> Any:
        self.write_tables({(table, slot): value.numpy()})
        return None

    def _layout_and_variable(self, table: str, slot: str) -> tuple[Any, Any]:
        layout = self._mid_level.embedding_layouts[table]
        stack = self._mid_level.variables[layout.stacked_table_name]
        return layout, stack[slot]

    def _read_created(
        self, keys: list[tuple[str, str]]
    ) -> dict[tuple[str, str], Any]:
        """Each table or slot out of its SparseCores' shards, one table at a
        time (`sparsecore_shards.read_table`)."""
        values = {}
        for table, slot in keys:
            layout, variable = self._layout_and_variable(table, slot)
            values[(table, slot)] = read_table(variable, layout)
        return values

    def _load_pending(self) -> None:
        """Writes each value held for a table or slot into its SparseCores'
        rows, one SparseCore and one block at a time."""
        pending, self._pending = self._pending, {}
        for (table, slot), value in pending.items():
            layout, variable = self._layout_and_variable(table, slot)
            write_table(variable, layout, as_rows(value))

    def table_layout(self, table: str) -> Any:
        """The `SparseCoreTableLayout` of `table` (once TF made the tables)."""
        return self._mid_level.embedding_layouts[table]

    def stacked_variable(self, table: str, slot: str) -> Any:
        """The stacked, sharded variable holding `table`'s `slot`."""
        return self._layout_and_variable(table, slot)[1]

    def tables_created(self) -> bool:
        """Whether TF created the tables (at the engine's first step)."""
        return self._tables_created()

    # --------------------------------------------------------- checkpoints

    def _checkpoint_table(self, table: str, slot: str) -> SparseCoreTable:
        # One per table and slot: shared by every container that saves it.
        key = (table, slot)
        if key not in self._checkpoint_values:
            self._checkpoint_values[key] = SparseCoreTable(self, table, slot)
        return self._checkpoint_values[key]

    def checkpoint_tables(self, tables: Sequence[str]) -> dict[str, Any]:
        """`{<table> or <table>/<slot>: EngineTableHandle}`: the tables by
        name in a checkpoint, holding no value (`sparsecore_checkpoint`)."""
        return {
            local_name(table, slot): EngineTableHandle(self, table, slot)
            for table in tables
            for slot in self.table_slots(table)
        }

    def checkpoint_extras(self, tables: Sequence[str]) -> dict[str, Any]:
        """`{"_sparse_core": ...}`: the values of `tables` and their slots,
        saved one SparseCore at a time (`sparsecore_checkpoint`)."""
        values = {
            local_name(table, slot): self._checkpoint_table(table, slot)
            for table in tables
            for slot in self.table_slots(table)
        }
        return {SPARSE_CORE: SparseCoreTableValues(values)}
