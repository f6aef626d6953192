"""The TPU embedding engine path: one mid-level object per TPU system.

TensorFlow's mid-level API (`tf.tpu.experimental.embedding.TPUEmbedding` on
V1 hardware) owns the embedding engine of a whole TPU system: building a
second object fails with "TPU is already initialized for embeddings", and
`enqueue` takes every feature of the object at once. So the embedding-core
tables of every embedding layer built under one `TPUStrategy` are served by
one `SharedEngine`:

- each layer `register`s at build; the engine merges the layers'
  `FeatureConfig`s (`tpu_conversion.to_tpu_feature_configs`) and checks at
  once that they can share one object;
- in a step (one traced graph), the first layer called enqueues every
  feature under a fresh name and dequeues them inside a gradient trap; the
  other layers take their activations from that step;
- the trap's backward pass scales each layer's gradients by its
  `gradient_multiplier_fn` and sends all of them with one `apply_gradients`
  under the same name, then counts the step on every layer.

SparseCore (`TPUEmbeddingV2`, embedding_feature V2) is refused at build,
with what works instead (`refuse_sparse_core` says why).

`embedding_hardware` and `mid_level_class` are the only places where TPU
hardware is consulted. The tests replace them with a recording stand-in
(`tests/engine_stand_in.py`) that enforces TF's invariants; that is a test of
the protocol, not a TPU run. No machine this package is developed on has a
TPU: this path runs on real hardware only through `examples/tpu_smoke.py`.
"""

from __future__ import annotations

import dataclasses
import enum
import weakref
from typing import Any
from typing import Sequence

from keras_tpu_embed._compat import keras_in_symbolic_scope
from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.tpu_conversion import to_tpu_feature_configs
from keras_tpu_embed.types import Tensor

_TPU_STRATEGIES = (
    tf.distribute.TPUStrategy,
    tf.distribute.experimental.TPUStrategy,
)


class EmbeddingHardware(enum.Enum):
    """What the current strategy offers for embedding lookups."""

    NONE = "none"  # not a TPUStrategy: CPU, GPU, default strategy
    NO_ENGINE = "no_engine"  # a TPU without an embedding engine
    V1 = "v1"  # the TPU embedding engine (TPUEmbedding)
    V2 = "v2"  # SparseCore (TPUEmbeddingV2)

    @property
    def has_engine(self) -> bool:
        return self in (EmbeddingHardware.V1, EmbeddingHardware.V2)


def embedding_hardware(strategy: Any) -> EmbeddingHardware:
    """Reads `strategy.extended.tpu_hardware_feature.embedding_feature`."""
    if not isinstance(strategy, _TPU_STRATEGIES):
        return EmbeddingHardware.NONE
    feature = strategy.extended.tpu_hardware_feature.embedding_feature
    kinds = tf.tpu.experimental.HardwareFeature.EmbeddingFeature
    if feature == kinds.V1:
        return EmbeddingHardware.V1
    if feature == kinds.V2:
        return EmbeddingHardware.V2
    return EmbeddingHardware.NO_ENGINE


def current_hardware() -> EmbeddingHardware:
    """`embedding_hardware` of the strategy in scope (or in `run`)."""
    return embedding_hardware(tf.distribute.get_strategy())


def mid_level_class(hardware: EmbeddingHardware) -> type:
    """The mid-level API class for the hardware (V1 only, see below)."""
    if hardware is EmbeddingHardware.V1:
        return tf.tpu.experimental.embedding.TPUEmbedding  # type: ignore
    raise ValueError(
        f"No supported TPU embedding engine on {hardware.value} hardware."
    )


def refuse_sparse_core(
    layer_name: str, columns: Sequence[AnyEmbeddingColumn]
) -> None:
    """Raises: SparseCore (`TPUEmbeddingV2`) is not driven by this package.

    Reading TF 2.20/2.21 and keras-rs' TensorFlow `DistributedEmbedding`
    (`_sparsecore_init`, which sets up `TPUEmbeddingV2` from its own
    configs), a correct V2 path needs what this package does not do yet:

    - every `FeatureConfig.output_shape` set from the per-replica batch
      before the constructor, which stacks tables by sample count
      (`tpu_embedding_v3.py`, `_stack_tables_with_same_table_dim_and_
      optimizer`; without it: "Cannot iterate over a shape with unknown
      rank"), and a `SparseCoreEmbeddingConfig`;
    - `max_sequence_length` and clipping, which V2 does not apply, mapped
      to errors;
    - checkpoints keyed by stacked table and sharded over SparseCores
      (keras-rs un-shards them in `_sparsecore_get_embedding_tables`),
      un-stacked into our table names for the CPU model.

    None of it can be checked without a SparseCore TPU, so the layer
    refuses at build rather than train or checkpoint wrongly.
    """
    names = sorted(c.name for c in columns)
    tables = sorted({c.table_name for c in columns})
    raise RuntimeError(
        f"Layer '{layer_name}' would put the columns {names} (tables "
        f"{tables}) on the TPU embedding engine, but this TPU has SparseCore "
        "(embedding_feature V2, e.g. TPU v5p, v6e), whose mid-level API "
        "tf.tpu.experimental.embedding.TPUEmbeddingV2 keras_tpu_embed does "
        "not support yet (its stacked, sharded tables would not restore "
        "into the CPU model by table name). What works: give those columns "
        "embedding_lookup_device='tpu_tensor_core' and tensor_core_shape="
        "[None, ids_per_example] (dense lookups on the TensorCore, any "
        "TPU), or train on a TPU whose embedding_feature is V1 (e.g. TPU "
        "v3, v4) for the embedding engine."
    )


@dataclasses.dataclass
class _Member:
    """One registered layer: what it reads and which features are its."""

    layer: Any  # weakref.ref to the layer
    name: str
    input_keys: frozenset[str] | None
    features: dict[str, tuple[str, str | None]]  # name -> (ids, weights)
    sequence: frozenset[str]


@dataclasses.dataclass
class _Step:
    """The engine's work in one traced step: one enqueue, one dequeue."""

    name: str
    activations: dict[str, Tensor]
    served: set[str] = dataclasses.field(default_factory=set)


_ENGINES: weakref.WeakKeyDictionary[Any, SharedEngine] = (
    weakref.WeakKeyDictionary()
)


def registered_engine(strategy: Any) -> SharedEngine | None:
    """The `SharedEngine` of `strategy`, if a layer registered with it."""
    return _ENGINES.get(strategy)


def engine_for(strategy: Any, hardware: EmbeddingHardware) -> SharedEngine:
    """The one `SharedEngine` of `strategy`'s TPU system."""
    engine = _ENGINES.get(strategy)
    if engine is None:
        engine = SharedEngine(hardware)
        _ENGINES[strategy] = engine
    return engine


class SharedEngine:
    """The one mid-level object of a TPU system and the layers it serves."""

    def __init__(self, hardware: EmbeddingHardware) -> None:
        self.hardware = hardware
        self._members: list[_Member] = []
        self._feature_configs: dict[str, Any] = {}
        self._table_owner: dict[str, str] = {}
        self._pipeline: bool | None = None
        self._mid_level: Any = None
        self._steps: weakref.WeakKeyDictionary[Any, _Step] = (
            weakref.WeakKeyDictionary()
        )
        self._step_count = 0
        # The per-replica batch TF fixes at the first enqueue.
        self._batch_size: int | None = None

    @property
    def mid_level(self) -> Any:
        """The `TPUEmbedding` all members share."""
        return self._mid_level

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
        layer: Any,
        columns: Sequence[AnyEmbeddingColumn],
        input_keys: frozenset[str] | None,
    ) -> None:
        """Adds a layer's embedding-core columns to the engine.

        Raises:
            RuntimeError: the engine already ran a step (its mid-level object
                is final), so this layer would need a second engine.
            ValueError: the layer cannot share the engine with the layers
                already registered; the message says how to fix the model.
        """
        if self.hardware is EmbeddingHardware.V2:
            refuse_sparse_core(layer.name, columns)
        if self._step_count:
            raise RuntimeError(
                f"{type(layer).__name__} '{layer.name}' is built after the "
                "TPU embedding engine of this TPUStrategy ran its first step "
                f"(for the layers {self.layer_names}). A TPU system has one "
                "embedding engine, fed once per step: build every embedding "
                "layer of the model before training, and train one model "
                "with embedding layers per TPUStrategy."
            )
        config = layer.config
        if (
            self._pipeline is not None
            and self._pipeline != config.pipeline_execution_with_tensor_core
        ):
            raise ValueError(
                "The embedding layers of one model share one TPU embedding "
                "engine, so they must agree on "
                "`pipeline_execution_with_tensor_core`: layers "
                f"{self.layer_names} use {self._pipeline}, "
                f"'{layer.name}' uses "
                f"{config.pipeline_execution_with_tensor_core}. Give them the "
                "same EmbeddingConfig."
            )
        features = to_tpu_feature_configs(
            columns, config, step=layer.embedding_step.value
        )
        for name, feature in features.items():
            if name in self._feature_configs:
                raise ValueError(
                    f"Feature '{name}' of layer '{layer.name}' is already "
                    "served by the TPU embedding engine for another layer "
                    f"({self.layer_names}); each column may be in one layer."
                )
            owner = self._table_owner.get(feature.table.name)
            if owner is not None and owner != layer.name:
                raise ValueError(
                    f"Table '{feature.table.name}' is used by layers "
                    f"'{owner}' and '{layer.name}'. The TPU embedding engine "
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
            layer=weakref.ref(layer),
            name=layer.name,
            input_keys=input_keys,
            features=sources,
            sequence=frozenset(
                name
                for name, feature in features.items()
                if feature.max_sequence_length > 0
            ),
        )
        self._check_inputs(self._members + [member])
        self._members.append(member)
        self._feature_configs.update(features)
        for feature in features.values():
            self._table_owner[feature.table.name] = layer.name
        self._pipeline = config.pipeline_execution_with_tensor_core
        # The mid-level constructor only stores configs; the TPU is touched
        # by `build`, which the first enqueue calls. So the object can be
        # replaced until the first step.
        self._mid_level = mid_level_class(self.hardware)(
            feature_config=dict(self._feature_configs),
            optimizer=config.optimizer.to_tpu(),
            pipeline_execution_with_tensor_core=self._pipeline,
        )

    def _check_inputs(self, members: list[_Member]) -> None:
        """Every layer must receive every engine feature (one enqueue)."""
        needed: dict[str, str] = {}
        for member in members:
            for ids_key, weights_key in member.features.values():
                needed.setdefault(ids_key, member.name)
                if weights_key:
                    needed.setdefault(weights_key, member.name)
        for member in members:
            if member.input_keys is None:
                continue
            missing = sorted(set(needed) - member.input_keys)
            if missing:
                readers = sorted({needed[key] for key in missing})
                raise ValueError(
                    "The TPU embedding engine enqueues every embedding-core "
                    "feature of the model once per step, from the input of "
                    f"the first embedding layer called. Layer '{member.name}' "
                    f"does not receive {missing} (read by {readers}). Pass the "
                    "same feature dict (the FeaturePreprocessor output) to "
                    "every embedding layer of the model."
                )

    # ---------------------------------------------------------------- step

    def activations(
        self, layer: Any, features: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """`layer`'s engine activations for this step, by column name."""
        member = self._member(layer)
        if keras_in_symbolic_scope():
            # Keras traces the model in a scratch graph to learn its output
            # structure; nothing may be enqueued there.
            return self._symbolic_activations(member, features)
        if tf.executing_eagerly():
            raise RuntimeError(
                f"Layer '{layer.name}' runs on the TPU embedding engine, "
                "which is fed inside a compiled step: call the model through "
                "model.fit / evaluate / predict, or in a tf.function under "
                "strategy.run, not eagerly."
            )
        graph = tf.compat.v1.get_default_graph()
        step = self._steps.get(graph)
        if step is None:
            step = self._start_step(layer, features)
            self._steps[graph] = step
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

    def _member(self, layer: Any) -> _Member:
        for member in self._members:
            if member.layer() is layer:
                return member
        raise RuntimeError(
            f"Layer '{layer.name}' is not registered with this TPU "
            "embedding engine."
        )

    def _start_step(self, layer: Any, inputs: dict[str, Tensor]) -> _Step:
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
                        f"input of layer '{layer.name}', which has "
                        f"{sorted(inputs)}. Pass the same feature dict to "
                        "every embedding layer."
                    )
                features[feature] = inputs[ids_key]
                weights[feature] = inputs[weights_key] if weights_key else None
        self._check_enqueue_inputs(features)
        self._check_batch_size(features)
        has_weights = any(w is not None for w in weights.values())
        flat = self._dequeue_with_trap(
            name,
            features,
            weights if has_weights else None,
            # Every member's trap variable, so that each gets a gradient.
            [member.layer().gradient_trap.value for member in self._members],
        )
        activations = tf.nest.pack_sequence_as(self._feature_configs, flat)
        self._check_activation_shapes(activations)
        return _Step(name=name, activations=activations)

    def _is_sequence(self, feature: str) -> bool:
        return any(feature in member.sequence for member in self._members)

    def _check_enqueue_inputs(self, features: dict[str, Tensor]) -> None:
        """Refuses, at trace time, inputs the engine would answer wrongly.

        TF's V1 engine reads a dense input as one id per example and sizes
        the output from the input shape
        (`TPUEmbedding._get_output_shapes_from_input_shapes`): a dense
        sequence feature would come back combined, `[batch, dim]`, not
        `[batch, max_sequence_length, dim]`.
        """
        for feature, value in features.items():
            if isinstance(value, tf.Tensor) and self._is_sequence(feature):
                raise ValueError(
                    f"Sequence feature '{feature}' reaches the TPU embedding "
                    f"engine as a dense tensor of shape {value.shape}. The "
                    "engine reads dense ids as one id per example and would "
                    "return [batch, dim], not [batch, max_sequence_length, "
                    "dim]. Feed it as a tf.SparseTensor or tf.RaggedTensor "
                    "(kte.FeaturePreprocessor outputs sparse ids)."
                )

    def _check_batch_size(self, features: dict[str, Tensor]) -> None:
        """One static per-replica batch size for the engine's lifetime.

        TF's V1 engine sizes its outputs at the first enqueue and checks
        every later enqueue against them (`tpu_embedding_v2.py`,
        `TPUEmbedding.enqueue` -> `_check_output_shapes`: "Inconsistent
        shape"); an unknown batch cannot build it ("not fully defined").
        Both are said here first, with the fix.
        """
        sizes = {name: value.shape[0] for name, value in features.items()}
        unknown = sorted(name for name, size in sizes.items() if size is None)
        if unknown:
            raise ValueError(
                f"The features {unknown} reach the TPU embedding engine with "
                "an unknown batch size. The engine needs a static batch: "
                "feed the model with kte.distribute_dataset(strategy, "
                "dataset, global_batch_size=...), which batches with "
                "drop_remainder=True."
            )
        batches = sorted(set(sizes.values()))
        if len(batches) > 1:
            raise ValueError(
                "The features of one step reach the TPU embedding engine "
                f"with different batch sizes: {sizes}. Batch them together."
            )
        [batch] = batches
        if self._batch_size is None:
            self._batch_size = batch
            return
        if batch != self._batch_size:
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
            raise ValueError(
                "The TPU embedding engine was built for a per-replica batch "
                f"of {self._batch_size} (global {self._batch_size * replicas}"
                f" over {replicas} replicas) by its first step, and this step "
                f"feeds {batch}; TF fixes the batch at the first step "
                "('Inconsistent shape'). Use the same global_batch_size in "
                "kte.distribute_dataset for fit, evaluate and predict (the "
                "last partial batch is dropped)."
            )

    def _check_activation_shapes(self, activations: dict[str, Tensor]) -> None:
        """The engine's activations have the shapes the layers declare.

        TF's `TPUEmbedding.dequeue` returns `(*output_shape, dim)` with the
        output shape read from the input (`tpu_embedding_v2.py`,
        `_get_output_shapes_from_input_shapes`): `[batch, dim]` for dense
        `[batch]` / `[batch, 1]` and for sparse or ragged ids,
        `[batch, max_sequence_length, dim]` for sparse or ragged sequence
        ids. Anything else (e.g. an `output_shape` in a user's
        `FeatureConfig`) fails here, at trace time, not in a later layer.
        """
        for feature, value in activations.items():
            config = self._feature_configs[feature]
            tail = [config.table.dim]
            if config.max_sequence_length > 0:
                tail.insert(0, config.max_sequence_length)
            shape = value.shape
            if shape.rank != len(tail) + 1 or shape.as_list()[1:] != tail:
                raise ValueError(
                    f"The TPU embedding engine returned shape {shape} for "
                    f"feature '{feature}'; the layer declares "
                    f"[batch, {', '.join(map(str, tail))}]. Feed its ids as "
                    "dense [batch] / [batch, 1] or as a rank-2 "
                    "tf.SparseTensor / tf.RaggedTensor, and leave "
                    "FeatureConfig.output_shape unset."
                )

    def _scaled_gradients(self, gradients: dict[str, Any]) -> dict[str, Any]:
        """Applies each layer's gradient multiplier to its features."""
        scaled = dict(gradients)
        for member in self._members:
            layer = member.layer()
            fn = layer.config.gradient_multiplier_fn
            if fn is None:
                continue
            multiplier = fn(layer.embedding_step.value)
            for feature in member.features:
                gradient = scaled[feature]
                scaled[feature] = gradient * tf.cast(multiplier, gradient.dtype)
        return scaled

    def _count_step(self) -> Tensor:
        """Counts the step once on every member layer; returns a scalar.

        A layer that also holds local (tensor-core) tables counts the step
        in its own trap (`TPUEmbeddingLayer._apply_gradients`): counting it
        here too would run its `learning_rate_fn`s twice as fast. Its step
        is only read here, to keep the data dependency.
        """
        counts = []
        for member in self._members:
            layer = member.layer()
            step = layer.embedding_step.value
            if layer.local_table_specs:
                counts.append(step.read_value())
            else:
                counts.append(step.assign_add(1).read_value())
        return tf.add_n([tf.cast(c, tf.float32) for c in counts])

    def _dequeue_with_trap(
        self,
        name: str,
        features: dict[str, Tensor],
        weights: dict[str, Tensor | None] | None,
        trap_variables: list[Tensor],
    ) -> list[Tensor]:
        """Enqueue, then dequeue inside a trap whose gradient feeds the engine.

        The dequeue has no differentiable input, so Keras' tape would never
        reach it: it is wrapped in a custom-gradient function of the
        layers' scalar trainable trap variables, whose backward pass
        receives the activations' gradients and hands them to
        `apply_gradients` (the pattern of TF's own Keras layers for the
        engine). The enqueue always says `training=True`: with a name, TF's
        graph rewrite switches it to inference when no `apply_gradients` of
        that name exists (evaluate, predict).
        """
        mid_level = self._mid_level
        self._enqueue(features, weights, name)

        @tf.custom_gradient
        def trap(*dummies: Tensor) -> Any:
            activations = mid_level.dequeue(name=name)

            def backward(*upstream: Tensor, variables: Any = None) -> Any:
                flat_activations = tf.nest.flatten(activations)
                gradients = [
                    tf.zeros_like(a) if g is None else tf.convert_to_tensor(g)
                    for g, a in zip(upstream, flat_activations)
                ]
                packed = self._scaled_gradients(
                    tf.nest.pack_sequence_as(self._feature_configs, gradients)
                )
                mid_level.apply_gradients(packed, name=name)
                # A data dependency, not only a control edge: see
                # sparse_training.trap_gradients.
                done = self._count_step() * 0.0
                dummy_gradients = [tf.zeros_like(d) + done for d in dummies]
                if variables:
                    # A mid-level object that looks up from variables it reads
                    # itself (not the TPU's) trains them in `apply_gradients`.
                    return dummy_gradients, [None] * len(variables)
                return dummy_gradients

            return tf.nest.flatten(activations), backward

        return trap(*trap_variables)

    def _enqueue(self, features: Any, weights: Any, name: str) -> None:
        try:
            self._mid_level.enqueue(features, weights, training=True, name=name)
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
            if "must be placed on the CPU" not in str(error):
                raise
            raise ValueError(
                f"{error}\nThe TPU embedding engine reads ids on the host: "
                "distribute the input with kte.distribute_dataset(strategy, "
                "dataset, global_batch_size=...)."
            ) from error
