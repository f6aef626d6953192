"""One step of the TPU embedding engine: enqueue, dequeue, gradients back.

`EngineStep` drives the engine's mid-level object in a traced step (one
graph): the first layer called enqueues every feature of every member
under a fresh name and dequeues them inside the gradient trap
(`gradient_trap.py`); the other layers take their activations from that
step. The trap's backward pass scales each layer's gradients by its
gradient multiplier (`backends/embedding_step.py`), sends all of them
with one `apply_gradients` under the same name, and counts the step on
every layer whose local tables do not count it already. The errors TF
raises at the enqueue are turned into ones that name the fix.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import weakref
from typing import AbstractSet
from typing import Any
from typing import Callable
from typing import Sequence

from keras_tpu_embed._compat import keras_in_symbolic_scope
from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_tpu_replication
from keras_tpu_embed._compat import tf_tpu_util
from keras_tpu_embed._tf_private import mid_level_built
from keras_tpu_embed._tf_private import replica_index
from keras_tpu_embed.backends import embedding_step as update_rules
from keras_tpu_embed.backends.gradient_trap import trap_gradients
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.engines import engine_checks
from keras_tpu_embed.engines import engine_host_ids
from keras_tpu_embed.engines.conversion import to_tpu_feature_configs
from keras_tpu_embed.engines.engine import EngineTables
from keras_tpu_embed.engines.engine_members import EngineMember
from keras_tpu_embed.engines.engine_members import EngineVariables
from keras_tpu_embed.optimizers import row_update
from keras_tpu_embed.placement.hardware import EmbeddingHardware
from keras_tpu_embed.types import Tensor


@dataclasses.dataclass
class _Step:
    """The engine's work in one traced step of one replica: one enqueue,
    one dequeue."""

    name: str
    activations: dict[str, Tensor]
    served: set[str] = dataclasses.field(default_factory=set)


def _assert_on_host(
    condition: Tensor, message: Callable[[Tensor], list[Any]], step: Tensor
) -> Tensor:
    """`tf.debugging.Assert(condition, message(step))`, run on the host in
    a TPU step (outside compilation); returns a value to depend on."""

    def check(condition: Tensor, step: Tensor) -> Tensor:
        assertion = tf.debugging.Assert(condition, message(step))
        with tf.control_dependencies([assertion]):
            return tf.identity(condition)

    if tf_tpu_util.enclosing_tpu_context() is None:
        return check(condition, step)
    result: Tensor = tf_tpu_replication.outside_compilation(
        check, condition, step
    )
    return result


def _replica_id() -> int:
    """The replica whose function is being traced.

    `TPUStrategy` traces the replica function once for all cores; replicas
    that trace one function each (`MirroredStrategy`, the emulated TPU)
    each need their own enqueue and dequeue in the same graph.
    """
    return replica_index(tf.distribute.get_replica_context())


class EngineStep(EngineVariables):
    """Feeds the engine once per step and sends the gradients back."""

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
        super().__init__(hardware)
        self._dataset_batches = dataset_batches
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
        # Why the step being traced has an unknown batch, when the
        # strategy's datasets tell (a batch other than the engine's).
        self._unknown_batch_cause: str | None = None

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
            return_sequence_lengths: Whether the layer returns sequence
                lengths, which the engine cannot give.
            layer_description: The layer's kind and name, for errors.

        Returns:
            The layer's backend on the engine.

        Raises:
            RuntimeError: the engine already ran a step (its mid-level object
                is final), so this layer would need a second engine.
            ValueError: the layer cannot share the engine with the layers
                already registered, or asks for what the engine cannot do;
                the message says how to fix the model.
        """
        if return_sequence_lengths:
            engine_checks.check_no_sequence_lengths(layer_description, columns)
        self._refuse_what_it_cannot_honour(layer_name, columns, config, step)
        if self._step_count:
            raise RuntimeError(
                f"Layer '{layer_name}' is built after the "
                "TPU embedding engine of this TPUStrategy ran its first step "
                f"(for the layers {self.layer_names}), or tried to: a first "
                "step that raised counts too. A TPU system has one "
                "embedding engine, fed once per step: build every embedding "
                "layer of the model before training, and train one model "
                "with embedding layers per TPUStrategy (after a failed first "
                "step, build the fixed model under a new TPUStrategy)."
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
        member = EngineMember(
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
        self._host_rules.update(engine_host_ids.host_id_rules(columns))
        for feature in features.values():
            self._table_owner[feature.table.name] = layer_name
        self._pipeline = config.pipeline_execution_with_tensor_core
        self._optimizer = config.optimizer.to_tpu()
        self._mid_level = self._make_mid_level()
        column_tables = [features[column.name].table.name for column in columns]
        return EngineTables(
            self, member, list(dict.fromkeys(column_tables)), layer_description
        )

    @abc.abstractmethod
    def _refuse_what_it_cannot_honour(
        self,
        layer_name: str,
        columns: Sequence[AnyEmbeddingColumn],
        config: EmbeddingConfig,
        step: Any,
    ) -> None:
        """Raises for what this engine would not train as asked."""

    @abc.abstractmethod
    def _make_mid_level(self) -> Any:
        """The mid-level object for the members registered so far, or None
        while it cannot be made yet."""

    def dataset_batch(self) -> int | None:
        """The one per-replica batch the strategy's datasets have."""
        batches = self._dataset_batches
        return next(iter(batches)) if len(batches) == 1 else None

    def activations(
        self, member: EngineMember, features: dict[str, Tensor]
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
        self, member: EngineMember, inputs: dict[str, Tensor]
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

    def _start_step(
        self, caller: EngineMember, inputs: dict[str, Tensor]
    ) -> _Step:
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
        engine_checks.check_enqueue_inputs(
            features, self._sequence_features, made_sparse=self._host_rules
        )
        batch = self._batch_size
        if batch is None:
            batch = self.dataset_batch()
        self._unknown_batch_cause = (
            engine_checks.another_batch_message(
                self._batch_size, self._dataset_batches
            )
            if any(
                value.shape.rank and value.shape[0] is None
                for value in features.values()
            )
            else None
        )
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

    def _refuse_non_finite(self, gradients: dict[str, Any]) -> dict[str, Any]:
        """Gradients that never reach the engine when not finite.

        For every layer whose `EmbeddingConfig.non_finite_updates` is
        "raise", each feature's gradient is checked: a NaN or inf fails the
        step with an `InvalidArgumentError` naming the table and the step,
        before the gradients are sent, as the CPU path does. The check
        runs on the host (outside compilation in a TPU step: XLA drops
        assertions on the chip), and the gradient of a failed check is
        zeroed on the chip, so that it is never applied as it is.
        """
        checked = dict(gradients)
        for member in self._members:
            if member.config.non_finite_updates != "raise":
                continue
            for feature in member.features:
                table = self._feature_configs[feature].table.name
                gradient = checked[feature]
                finite = row_update.all_finite(gradient)
                done = _assert_on_host(
                    finite,
                    functools.partial(row_update.non_finite_message, table),
                    member.step.value,
                )
                with tf.control_dependencies([done]):
                    checked[feature] = tf.where(
                        finite, gradient, tf.zeros_like(gradient)
                    )
        return checked

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
            packed = self._refuse_non_finite(
                self._scaled_gradients(
                    tf.nest.pack_sequence_as(self._feature_configs, gradients)
                )
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
            if self._pending and mid_level_built(self._mid_level):
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
                message = engine_checks.non_direct_inputs_message(
                    error, features
                )
                if self._unknown_batch_cause:
                    message = f"{self._unknown_batch_cause}\n{message}"
                raise ValueError(message) from error
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
