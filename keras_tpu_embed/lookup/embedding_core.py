"""The TPU embedding engine backend: one mid-level object per TPU system.

TensorFlow's mid-level API (`tf.tpu.experimental.embedding.TPUEmbedding` on
V1 hardware) owns the embedding engine of a whole TPU system: building a
second object fails with "TPU is already initialized for embeddings", and
`enqueue` takes every feature of the object at once. So the embedding-core
tables of every embedding layer built under one `TPUStrategy` are served by
one `SharedEngine`:

- each layer `register`s at build, handing over its columns, its
  `EmbeddingConfig`, its step and its trap variable; the engine merges the
  layers' `FeatureConfig`s (`tpu_conversion.to_tpu_feature_configs`), checks
  at once that they can share one object (`engine_checks.py`), and gives the
  layer an `EngineTables` backend;
- in a step (one traced graph), the first layer called enqueues every
  feature under a fresh name and dequeues them inside the gradient trap
  (`gradient_trap.py`); the other layers take their activations from that
  step;
- the trap's backward pass scales each layer's gradients by its gradient
  multiplier (`optimizers/embedding_step.py`) and sends all of them with one
  `apply_gradients` under the same name, then counts the step on every
  layer whose local tables do not count it already.

On SparseCore TPUs (embedding_feature V2: v5p, v6e and later) the engine
is a `sparsecore.SparseCoreEngine`, the same engine rules driving
`TPUEmbeddingV2` (`lookup/sparsecore.py`). TPU hardware is consulted only
through `tpu/hardware.py`, which the tests replace with a recording
stand-in. No machine this package is developed on has a TPU: this path
runs on real hardware only through `examples/tpu_smoke.py`.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import AbstractSet
from typing import Any
from typing import Sequence

from keras_tpu_embed._compat import TFSaveSpec
from keras_tpu_embed._compat import Trackable
from keras_tpu_embed._compat import keras_in_symbolic_scope
from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_tpu_util
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.lookup import engine_checks
from keras_tpu_embed.lookup.backend import Activations
from keras_tpu_embed.lookup.backend import Phase
from keras_tpu_embed.lookup.gradient_trap import trap_gradients
from keras_tpu_embed.optimizers import embedding_step as update_rules
from keras_tpu_embed.tpu import hardware as tpu_hardware
from keras_tpu_embed.tpu.conversion import to_tpu_feature_configs
from keras_tpu_embed.tpu.hardware import EmbeddingHardware
from keras_tpu_embed.types import Tensor


@dataclasses.dataclass
class _Member:
    """One registered layer: what it reads, its features and its state."""

    name: str
    input_keys: frozenset[str] | None
    features: dict[str, tuple[str, str | None]]  # name -> (ids, weights)
    sequence: frozenset[str]
    config: EmbeddingConfig
    step: Any  # the layer's embedding_step variable
    trigger: Any  # the layer's table_update_trigger variable
    counts_step: bool  # False when the layer's local tables count it


@dataclasses.dataclass
class _Step:
    """The engine's work in one traced step of one replica: one enqueue,
    one dequeue."""

    name: str
    activations: dict[str, Tensor]
    served: set[str] = dataclasses.field(default_factory=set)


def _replica_id() -> int:
    """The replica whose function is being traced.

    `TPUStrategy` traces the replica function once for all cores; replicas
    that trace one function each (`MirroredStrategy`, the emulated TPU)
    each need their own enqueue and dequeue in the same graph.
    """
    context = tf.distribute.get_replica_context()
    replica = getattr(context, "_replica_id_in_sync_group", 0)
    return replica if isinstance(replica, int) else 0


class SharedEngine:
    """The one mid-level object of a TPU system and the layers it serves."""

    def __init__(
        self,
        hardware: EmbeddingHardware,
        *,
        dataset_batches: AbstractSet[int] = frozenset(),
    ) -> None:
        """Makes the engine of one strategy's TPU system.

        Args:
            hardware: The TPU's embedding hardware.
            dataset_batches: The per-replica batches of the strategy's
                datasets (`engine_registry.note_dataset_batch`), a set that
                grows as datasets are made: the fallback for a step whose
                inputs arrive with an unknown batch.
        """
        self.hardware = hardware
        self._dataset_batches = dataset_batches
        self._members: list[_Member] = []
        self._feature_configs: dict[str, Any] = {}
        self._table_owner: dict[str, str] = {}
        self._pipeline: bool | None = None
        self._mid_level: Any = None
        self._optimizer: Any = None
        # graph -> (replicated computation, replica id) -> that replica's
        # step in it. One graph may run several steps: Keras' predict with
        # `steps_per_execution > 1` calls `strategy.run` once per step in
        # one function, and each call is its own `tpu.replicate`.
        self._steps: weakref.WeakKeyDictionary[
            Any, dict[tuple[Any, int], _Step]
        ] = weakref.WeakKeyDictionary()
        self._step_count = 0
        # The per-replica batch TF fixes at the first enqueue.
        self._batch_size: int | None = None
        # Values loaded (`write_tables`) before TF created the tables: they
        # go onto the TPU at the first enqueue, which creates them.
        self._pending: dict[tuple[str, str], Any] = {}

    def dataset_batch(self) -> int | None:
        """The one per-replica batch the strategy's datasets have."""
        batches = self._dataset_batches
        return next(iter(batches)) if len(batches) == 1 else None

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

    # --------------------------------------------------------------- build

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
    ) -> EngineTables:
        """Adds a layer's embedding-core columns to the engine.

        Args:
            layer_name: The layer's name, for errors.
            columns: The layer's columns on the engine.
            input_keys: The feature keys the layer is called with, when
                known at build (checked: every layer must get every engine
                feature).
            config: The layer's `EmbeddingConfig`.
            step: The layer's `embedding_step` variable.
            trigger: The layer's scalar trap variable.
            counts_step: Whether the engine counts the layer's step (not
                when the layer's local tables count it).

        Returns:
            The layer's backend on the engine.

        Raises:
            RuntimeError: the engine already ran a step (its mid-level object
                is final), so this layer would need a second engine.
            ValueError: the layer cannot share the engine with the layers
                already registered; the message says how to fix the model.
        """
        if self._step_count:
            raise RuntimeError(
                f"Layer '{layer_name}' is built after the "
                "TPU embedding engine of this TPUStrategy ran its first step "
                f"(for the layers {self.layer_names}). A TPU system has one "
                "embedding engine, fed once per step: build every embedding "
                "layer of the model before training, and train one model "
                "with embedding layers per TPUStrategy."
            )
        if (
            self._pipeline is not None
            and self._pipeline != config.pipeline_execution_with_tensor_core
        ):
            raise ValueError(
                "The embedding layers of one model share one TPU embedding "
                "engine, so they must agree on "
                "`pipeline_execution_with_tensor_core`: layers "
                f"{self.layer_names} use {self._pipeline}, "
                f"'{layer_name}' uses "
                f"{config.pipeline_execution_with_tensor_core}. Give them the "
                "same EmbeddingConfig."
            )
        features = to_tpu_feature_configs(columns, config, step=step.value)
        for name, feature in features.items():
            if name in self._feature_configs:
                raise ValueError(
                    f"Feature '{name}' of layer '{layer_name}' is already "
                    "served by the TPU embedding engine for another layer "
                    f"({self.layer_names}); each column may be in one layer."
                )
            owner = self._table_owner.get(feature.table.name)
            if owner is not None and owner != layer_name:
                raise ValueError(
                    f"Table '{feature.table.name}' is used by layers "
                    f"'{owner}' and '{layer_name}'. The TPU embedding engine "
                    "needs each table in one layer: put all columns of a "
                    "shared table in one SharedTPUEmbedding."
                )
        sources: dict[str, tuple[str, str | None]] = {}
        for column in columns:
            sources[column.name] = (
                column.feature_key,
                column.weight_feature_key or None,
            )
        for name in config.feature_to_config_dict or {}:
            sources[name] = (name, None)
        member = _Member(
            name=layer_name,
            input_keys=input_keys,
            features=sources,
            sequence=frozenset(
                name
                for name, feature in features.items()
                if feature.max_sequence_length > 0
            ),
            config=config,
            step=step,
            trigger=trigger,
            counts_step=counts_step,
        )
        engine_checks.check_every_layer_gets_every_feature(
            self._members + [member]
        )
        self._members.append(member)
        self._feature_configs.update(features)
        for feature in features.values():
            self._table_owner[feature.table.name] = layer_name
        self._pipeline = config.pipeline_execution_with_tensor_core
        self._optimizer = config.optimizer.to_tpu()
        self._mid_level = self._make_mid_level()
        return EngineTables(self, member)

    def _make_mid_level(self) -> Any:
        """The mid-level object for the members registered so far.

        The constructor only stores configs; the TPU is touched by
        `build`, which the first enqueue calls. So the object can be
        replaced until the first step.
        """
        return tpu_hardware.mid_level_class(self.hardware)(
            feature_config=dict(self._feature_configs),
            optimizer=self._optimizer,
            pipeline_execution_with_tensor_core=self._pipeline,
        )

    # -------------------------------------------------------------- tables

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
                slots = ["parameters", *optimizer._slot_names()]
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
        return self._mid_level is not None and bool(self._mid_level._built)

    def _read_created(
        self, keys: list[tuple[str, str]]
    ) -> dict[tuple[str, str], Any]:
        """`read_tables` once the tables exist."""
        mid_level = self._mid_level
        # Under a TPUStrategy the host copies are stale until TF retrieves
        # them from the TPU, as it does before a checkpoint save.
        mid_level._retrieve_variables()
        return {
            (table, slot): tf.concat(
                [
                    tf.convert_to_tensor(shard)
                    for shard in mid_level._variables[table][slot].variables
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
        mid_level = self._mid_level
        mid_level._retrieve_variables()
        for (table, slot), value in self._pending.items():
            variable = mid_level._variables[table][slot]
            start = 0
            for shard in variable.variables:
                rows = int(shard.shape[0])
                shard.assign(value[start : start + rows])
                start += rows
        self._pending = {}
        mid_level._load_variables()

    # ---------------------------------------------------------------- step

    def activations(
        self, member: _Member, features: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """A member's engine activations for this step, by column name."""
        if keras_in_symbolic_scope():
            # Keras traces the model in a scratch graph to learn its output
            # structure; nothing may be enqueued there.
            return self._symbolic_activations(member, features)
        if tf.executing_eagerly():
            raise RuntimeError(
                f"Layer '{member.name}' runs on the TPU embedding engine, "
                "which is fed inside a compiled step: call the model through "
                "model.fit / evaluate / predict, or in a tf.function under "
                "strategy.run, not eagerly."
            )
        graph = tf.compat.v1.get_default_graph()
        replicas = self._steps.setdefault(graph, {})
        key = (tf_tpu_util.enclosing_tpu_context(), _replica_id())
        step = replicas.get(key)
        if step is None:
            step = self._start_step(member, features)
            replicas[key] = step
        if member.name in step.served:
            raise RuntimeError(
                f"Layer '{member.name}' is called twice in one step. The TPU "
                "embedding engine is fed once per step; call each embedding "
                "layer once per model call."
            )
        step.served.add(member.name)
        return {name: step.activations[name] for name in member.features}

    def _symbolic_activations(
        self, member: _Member, inputs: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        outputs = {}
        for feature, (ids_key, _) in member.features.items():
            config = self._feature_configs[feature]
            batch = tf.shape(inputs[ids_key])[0]
            shape = [batch, config.table.dim]
            if config.max_sequence_length > 0:
                shape.insert(1, config.max_sequence_length)
            outputs[feature] = tf.zeros(tf.stack(shape), tf.float32)
        return outputs

    def _start_step(self, caller: _Member, inputs: dict[str, Tensor]) -> _Step:
        self._step_count += 1
        name = f"keras_tpu_embed_step_{self._step_count}"
        features: dict[str, Tensor] = {}
        weights: dict[str, Tensor | None] = {}
        for member in self._members:
            for feature, (ids_key, weights_key) in member.features.items():
                if ids_key not in inputs:
                    raise KeyError(
                        f"The TPU embedding engine needs feature '{ids_key}' "
                        f"(for '{feature}' of layer '{member.name}') in the "
                        f"input of layer '{caller.name}', which has "
                        f"{sorted(inputs)}. Pass the same feature dict to "
                        "every embedding layer."
                    )
                features[feature] = inputs[ids_key]
                weights[feature] = inputs[weights_key] if weights_key else None
        engine_checks.check_enqueue_inputs(features, self._sequence_features)
        batch = self._batch_size
        if batch is None:
            batch = self.dataset_batch()
        checks = engine_checks.set_static_batch(features, batch)
        checks += engine_checks.set_static_batch(weights, batch)
        self._batch_size = engine_checks.check_batch_size(
            features, self._batch_size
        )
        has_weights = any(w is not None for w in weights.values())
        flat = self._dequeue_with_trap(
            name, features, weights if has_weights else None
        )
        if checks:
            with tf.control_dependencies(checks):
                flat = [tf.identity(value) for value in flat]
        activations = tf.nest.pack_sequence_as(self._feature_configs, flat)
        engine_checks.check_activation_shapes(
            activations, self._feature_configs
        )
        return _Step(name=name, activations=activations)

    @property
    def _sequence_features(self) -> frozenset[str]:
        return frozenset().union(*(m.sequence for m in self._members))

    def _scaled_gradients(self, gradients: dict[str, Any]) -> dict[str, Any]:
        """Each layer's gradient multiplier on its features' gradients."""
        scaled = dict(gradients)
        for member in self._members:
            for feature in member.features:
                scaled[feature] = update_rules.scale_gradient(
                    scaled[feature], member.config, member.step.value
                )
        return scaled

    def _count_step(self) -> Tensor:
        """Counts the step once on every member; returns a scalar.

        A layer that also holds local (tensor-core) tables counts the step
        in its own trap (`LocalTables`): counting it here too would run its
        `learning_rate_fn`s twice as fast. Its step is only read here, to
        keep the data dependency.
        """
        counts = []
        for member in self._members:
            step = member.step.value
            if member.counts_step:
                # Under a replicated strategy the step (aggregation
                # "only_first_replica") is added to in a merge call that
                # returns a plain tensor, which has no `read_value`.
                counted = step.assign_add(1)
                with tf.control_dependencies([counted]):
                    counts.append(tf.identity(step.value()))
            else:
                counts.append(step.read_value())
        return tf.add_n([tf.cast(c, tf.float32) for c in counts])

    def _dequeue_with_trap(
        self,
        name: str,
        features: dict[str, Tensor],
        weights: dict[str, Tensor | None] | None,
    ) -> list[Tensor]:
        """Enqueue, then dequeue inside the trap that feeds the engine.

        The dequeue has no differentiable input, so Keras' tape would never
        reach it: it runs inside the gradient trap over every member's
        trigger variable (so that each gets a gradient), whose backward pass
        receives the activations' gradients and hands them to
        `apply_gradients`. The enqueue always says `training=True`: with a
        name, TF's graph rewrite switches it to inference when no
        `apply_gradients` of that name exists (evaluate, predict).
        """
        mid_level = self._mid_level
        self._enqueue(features, weights, name)

        def apply_gradients(gradients: list[Tensor]) -> Tensor:
            packed = self._scaled_gradients(
                tf.nest.pack_sequence_as(self._feature_configs, gradients)
            )
            mid_level.apply_gradients(packed, name=name)
            return self._count_step()

        return trap_gradients(
            lambda: tf.nest.flatten(mid_level.dequeue(name=name)),
            [member.trigger.value for member in self._members],
            apply_gradients,
        )

    def _enqueue(self, features: Any, weights: Any, name: str) -> None:
        try:
            self._mid_level.enqueue(features, weights, training=True, name=name)
            if self._pending and self._mid_level._built:
                # The enqueue created the tables (eagerly, in TF's init
                # scope): the values loaded before go onto the TPU now.
                with tf.init_scope():
                    self._load_pending()
        except RuntimeError as error:
            if "already initialized for embeddings" not in str(error):
                raise
            raise RuntimeError(
                "Another TPU embedding engine object was built on this "
                "TPU system before this model's. keras_tpu_embed builds one "
                "tf.tpu.experimental.embedding.TPUEmbedding for all "
                "embedding layers of a model: do not build your own next to "
                "it, and train one model with embedding layers per TPU "
                "system."
            ) from error
        except ValueError as error:
            if "_tpu_input_identity" in str(error):
                raise ValueError(
                    engine_checks.non_direct_inputs_message(error, features)
                ) from error
            # TF checks the devices of the replicate's inputs: this fires in
            # a custom loop calling strategy.run on next(iterator) in one
            # tf.function over ids fetched to the TPU. Under model.fit the
            # step is a tf.function of its own, whose arguments carry no
            # device, so it cannot.
            if "must be placed on the CPU" not in str(error):
                raise
            raise ValueError(
                f"{error}\nThe TPU embedding engine reads ids on the host: "
                "distribute the input with kte.distribute_dataset(strategy, "
                "dataset, global_batch_size=...)."
            ) from error


class EngineTables:
    """One layer's tables on the shared engine; a `TableBackend`."""

    def __init__(self, engine: SharedEngine, member: _Member) -> None:
        self.engine = engine
        self._member = member

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

    def __init__(self, engine: Any, table: str, slot: str) -> None:
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
