"""A recording STAND-IN for the TPU embedding mid-level API. Not a TPU.

No machine here has a TPU, so the engine path is tested against this object
in place of `tf.tpu.experimental.embedding.TPUEmbedding`, under a
`OneDeviceStrategy` that the tests declare to be a TPU with an engine. It
enforces the invariants TensorFlow enforces on a TPU:

- one built object per strategy ("TPU is already initialized for
  embeddings" for a second);
- `enqueue` with the full feature structure, a name, and inputs of the kinds
  TF accepts (dense `[batch]` or `[batch, 1]`, rank-2 sparse or ragged), each
  a direct input of the step function (TF rejects computed tensors: it can
  only move the enqueue to the host when its inputs come straight from the
  dataset);
- `dequeue` once per step, in the same graph, with the enqueue's name;
- `apply_gradients` once per step with that name and the full gradient
  structure, each gradient shaped like its activation.

Output shapes are TensorFlow's, never a rule of ours: each enqueue runs the
shape logic of a real `TPUEmbedding` built on CPU (`tpu_embedding_v2.py`,
`TPUEmbedding`: `_get_input_shapes`, then
`_get_and_update_output_shapes_from_input` on the first enqueue as `build`
does, and `_check_output_shapes` on every enqueue as `enqueue` does). So an
activation is `(*output_shape, dim)` as `TPUEmbedding.dequeue` documents:
`[batch, dim]` for dense `[batch, 1]` ids; a second batch size raises
"Inconsistent shape" and an unknown one "not fully defined".

Lookups use that CPU `TPUEmbedding` (the variable layout the TPU
checkpoints too) and `tf.tpu.experimental.embedding.serving_embedding_lookup`;
`apply_gradients` applies plain SGD at the table optimizer's learning rate,
so that tests can see gradients arrive where they belong. Counters record
how often each op runs, at run time.
"""

from __future__ import annotations

import types
import weakref
from typing import Any

import tensorflow as tf
from tensorflow.python.util import nest

from keras_tpu_embed.tpu import hardware as tpu_hardware

_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _graph() -> Any:
    return tf.compat.v1.get_default_graph()


class RecordingTPUEmbedding(tf.__internal__.tracking.AutoTrackable):
    """Stands in for `TPUEmbedding`; records and checks the protocol."""

    instances: list[RecordingTPUEmbedding] = []

    def __init__(
        self,
        feature_config: Any,
        optimizer: Any = None,
        pipeline_execution_with_tensor_core: bool = False,
    ) -> None:
        self._strategy = tf.distribute.get_strategy()
        self._feature_config = feature_config
        self.optimizer = optimizer
        self.pipeline_execution_with_tensor_core = (
            pipeline_execution_with_tensor_core
        )
        # TPUEmbedding outside a TPUStrategy builds its tables on CPU, with
        # the TPU's checkpoint layout.
        with tf.init_scope():
            self._cpu = tf.tpu.experimental.embedding.TPUEmbedding(
                feature_config, optimizer
            )
            self._cpu.build()
            self.runs = {
                op: tf.Variable(0, dtype=tf.int64, trainable=False)
                for op in ("enqueue", "dequeue", "apply_gradients")
            }
        self.built = False
        self.events: list[tuple[str, str, tuple[str, ...]]] = []
        self._steps: dict[tuple[int, str], dict[str, Any]] = {}
        RecordingTPUEmbedding.instances.append(self)

    @property
    def embedding_tables(self) -> dict[Any, Any]:
        return self._cpu.embedding_tables

    def _trackable_children(self, save_type: str = "checkpoint", **kwargs):
        return self._cpu._trackable_children(save_type, **kwargs)

    # What the package reads of a built mid-level object to read and write
    # its tables (`SharedEngine.read_tables` / `write_tables`). There is no
    # chip here: the CPU object's variables are the tables, so TF's
    # retrieve and load have nothing to move.
    @property
    def _table_config(self) -> Any:
        return self._cpu._table_config

    @property
    def _variables(self) -> Any:
        # On a TPU each is sharded over the hosts (`.variables`); on CPU it
        # is one variable: one shard.
        return {
            table: {
                slot: types.SimpleNamespace(variables=[variable])
                for slot, variable in slots.items()
            }
            for table, slots in self._cpu._variables.items()
        }

    @property
    def _built(self) -> bool:
        return self.built

    @property
    def _hosts(self) -> list[str]:
        # One host: this process's CPU, which holds the one shard.
        return ["/job:localhost/replica:0/task:0/device:CPU:0"]

    def _retrieve_variables(self) -> None:
        pass

    def _load_variables(self) -> None:
        pass

    def build(self) -> None:
        if self.built:
            return
        owner = _BUILT.get(self._strategy)
        if owner is not None and owner is not self:
            raise RuntimeError(
                "TPU is already initialized for embeddings. This may be "
                "caused by using multiple TPUEmbedding instances in a TPU "
                "scope which is unsupported"
            )
        _BUILT[self._strategy] = self
        self.built = True

    def _count(self, op: str) -> None:
        self.runs[op].assign_add(1)

    def enqueue(
        self,
        features: Any,
        weights: Any = None,
        training: bool = True,
        name: str | None = None,
    ) -> None:
        if name is None:
            raise AssertionError("stand-in: enqueue without a name")
        tf.nest.assert_same_structure(self._feature_config, features)
        if weights is not None:
            tf.nest.assert_same_structure(self._feature_config, weights)
        for path, value in nest.flatten_with_joined_string_paths(features):
            _check_input_kind(path, value)
        for path, component in nest.flatten_with_joined_string_paths(
            features, expand_composites=True
        ):
            if component.op.type != "Placeholder":
                raise ValueError(
                    f"stand-in: {path} is computed by a {component.op.type} "
                    "op, not a direct input of the step; TF cannot enqueue "
                    "it from the host."
                )
        if weights is not None:
            _check_weights(weights)
        output_shapes = self._tensorflow_output_shapes(features)
        self.build()
        key = (id(_graph()), name)
        if key in self._steps:
            raise RuntimeError(f"stand-in: second enqueue named {name!r}")
        # TF's enqueue hands the flat inputs to `_generate_enqueue_op` after
        # its checks (tpu_embedding_v2.py); what that op enqueues is what the
        # chip looks up, so the stand-in looks up what it returns.
        flat_features = nest.flatten_with_joined_string_paths(
            self._feature_config
        )
        flat_weights = (
            [None] * len(flat_features)
            if weights is None
            else nest.flatten(weights)
        )
        step_inputs = features
        flat_inputs, flat_weights = self._generate_enqueue_op(
            nest.flatten(features), flat_weights, flat_features
        )
        features = nest.pack_sequence_as(self._feature_config, flat_inputs)
        if weights is not None:
            weights = nest.pack_sequence_as(self._feature_config, flat_weights)
        self._steps[key] = {
            "inputs": step_inputs,
            "features": features,
            "weights": weights,
            "training": training,
            "output_shapes": output_shapes,
        }
        self.events.append(("enqueue", name, tuple(sorted(features))))
        self._count("enqueue")

    def _generate_enqueue_op(
        self,
        flat_inputs: list[Any],
        flat_weights: list[Any],
        flat_features: list[Any],
        *args: Any,
        **kwargs: Any,
    ) -> tuple[list[Any], list[Any]]:
        """TF's enqueue op, here the inputs it would enqueue."""
        return list(flat_inputs), list(flat_weights)

    def _tensorflow_output_shapes(self, features: Any) -> list[Any]:
        """TF's per-replica output shapes for `features`, TF's errors too.

        The enqueue runs inside the replica function, so the shapes are
        per replica (`per_replica=True`, `in_tpu_context=True`).
        """
        cpu = self._cpu
        input_shapes = cpu._get_input_shapes(
            features, per_replica=True, in_tpu_context=True
        )
        if not self.built:
            # What TPUEmbedding.build does on a TPU (the CPU object skips it).
            cpu._get_and_update_output_shapes_from_input(input_shapes)
        cpu._check_output_shapes(
            cpu._get_output_shapes_from_input_shapes(input_shapes)
        )
        return list(cpu._output_shapes)

    def _lookup(self, step: dict[str, Any], tables: Any = None) -> list[Any]:
        """The CPU lookup, flat, in the serving lookup's own shapes."""
        return tf.nest.flatten(
            tf.tpu.experimental.embedding.serving_embedding_lookup(
                step["features"],
                step["weights"],
                tables or self._cpu.embedding_tables,
                self._feature_config,
            )
        )

    def _on_tpu_shapes(self, step: dict[str, Any], flat: list[Any]) -> Any:
        """The CPU lookup reshaped to TF's `(*output_shape, dim)`."""
        shaped = []
        for value, shape, feature in zip(
            flat, step["output_shapes"], tf.nest.flatten(self._feature_config)
        ):
            shaped.append(
                tf.reshape(value, shape.as_list() + [feature.table.dim])
            )
        return tf.nest.pack_sequence_as(self._feature_config, shaped)

    def dequeue(self, name: str | None = None) -> Any:
        step = self._steps.get((id(_graph()), name))
        if step is None:
            raise RuntimeError(
                f"stand-in: dequeue {name!r} without an enqueue of that name "
                "in this step"
            )
        if "activations" in step:
            raise RuntimeError(f"stand-in: second dequeue named {name!r}")
        with tf.control_dependencies(_non_negative(step["features"])):
            flat = [tf.identity(a) for a in self._lookup(step)]
        step["activations"] = self._on_tpu_shapes(step, flat)
        self.events.append(("dequeue", name, ()))
        self._count("dequeue")
        return step["activations"]

    def apply_gradients(self, gradients: Any, name: str | None = None) -> None:
        step = self._steps.get((id(_graph()), name))
        if step is None or "activations" not in step:
            raise RuntimeError(
                f"stand-in: apply_gradients {name!r} without a dequeue of "
                "that name in this step"
            )
        if step.get("applied"):
            raise RuntimeError(f"stand-in: second apply_gradients {name!r}")
        step["applied"] = True
        tf.nest.assert_same_structure(self._feature_config, gradients)
        flat_activations = tf.nest.flatten(step["activations"])
        for (path, gradient), activation in zip(
            nest.flatten_with_joined_string_paths(gradients),
            flat_activations,
        ):
            if gradient.shape != activation.shape:
                raise ValueError(
                    f"stand-in: gradient of shape {gradient.shape} at {path}; "
                    f"expected {activation.shape}"
                )
        self._sgd(step, gradients)
        self.events.append(("apply_gradients", name, ()))
        self._count("apply_gradients")

    def _sgd(self, step: dict[str, Any], gradients: Any) -> None:
        """Plain SGD through the CPU lookup's own gradient."""
        tables = self._cpu.embedding_tables
        by_table = list(tables.items())
        activations = self._lookup(step, dict(by_table))
        table_grads = tf.gradients(
            activations,
            [table for _, table in by_table],
            grad_ys=[
                tf.reshape(gradient, tf.shape(activation))
                for gradient, activation in zip(
                    tf.nest.flatten(gradients), activations
                )
            ],
        )
        for (config, table), gradient in zip(by_table, table_grads):
            if gradient is None:
                continue
            rate = config.optimizer.learning_rate
            rate = rate() if callable(rate) else rate
            update = tf.IndexedSlices(
                gradient.values * tf.cast(rate, tf.float32),
                gradient.indices,
                gradient.dense_shape,
            )
            table.scatter_sub(update)


def _non_negative(features: Any) -> list[Any]:
    """Run-time checks that no negative id reaches the engine.

    The CPU lookup this stand-in uses skips negative ids; the engine has no
    such rule (its enqueue passes every id on, `_add_data_for_*` in
    `tpu_embedding_v2.py`), so the stand-in refuses them instead of
    answering like the CPU.
    """
    checks = []
    for path, value in nest.flatten_with_joined_string_paths(features):
        ids = value.values if hasattr(value, "values") else value
        checks.append(
            tf.debugging.assert_non_negative(
                ids,
                message=f"stand-in: negative ids in {path} reached the engine",
            )
        )
    return checks


def _check_weights(weights: Any) -> None:
    """Weights reach the enqueue float32, straight from the input.

    Our invariant, stricter than TF: TF's enqueue casts any float weight to
    float32 (`TPUEmbedding._add_data_for_sparse_tensor`), so a weight
    autocast to bfloat16 on the TPU under a mixed policy would be rounded
    silently, and fetched back from the device to the host enqueue.
    """
    for path, component in nest.flatten_with_joined_string_paths(
        weights, expand_composites=True
    ):
        if component is None or component.dtype != tf.float32:
            continue
        if component.op.type != "Placeholder":
            raise ValueError(
                f"stand-in: weight {path} is computed by a "
                f"{component.op.type} op, not a direct input of the step."
            )
    for path, weight in nest.flatten_with_joined_string_paths(weights):
        if weight is not None and weight.dtype != tf.float32:
            raise ValueError(
                f"stand-in: weight {path} is {weight.dtype.name}; the "
                "engine's weights are float32."
            )


def _check_input_kind(path: str, value: Any) -> None:
    if isinstance(value, tf.SparseTensor):
        if value.shape.rank != 2:
            raise ValueError(f"stand-in: sparse {path} must be rank 2")
    elif isinstance(value, tf.RaggedTensor):
        if value.shape.rank != 2:
            raise ValueError(f"stand-in: ragged {path} must be rank 2")
    else:
        rank = value.shape.rank
        if rank == 0 or (rank and rank > 1 and value.shape[-1] != 1):
            raise ValueError(
                "stand-in: Rank 2 or above dense tensor should have last "
                f"dimension as 1; got {value.shape} at {path}"
            )


class StandInTPU:
    """Declares a `OneDeviceStrategy` to be a TPU with an embedding engine.

    Patches `tpu_hardware.embedding_hardware` and
    `tpu_hardware.mid_level_class`, the two places where the package
    consults TPU hardware.
    """

    def __init__(self, monkeypatch: Any, hardware: Any = None) -> None:
        self.strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        self.hardware = hardware or tpu_hardware.EmbeddingHardware.V1
        real = tpu_hardware.embedding_hardware
        strategy = self.strategy

        def embedding_hardware(candidate: Any) -> Any:
            if candidate is strategy:
                return self.hardware
            return real(candidate)

        monkeypatch.setattr(
            tpu_hardware, "embedding_hardware", embedding_hardware
        )
        # The package builds TPUEmbedding on V1 only (SparseCore is refused
        # before any mid-level object exists).
        monkeypatch.setattr(
            tpu_hardware, "mid_level_class", lambda _: RecordingTPUEmbedding
        )
        RecordingTPUEmbedding.instances = []

    @property
    def built_objects(self) -> list[RecordingTPUEmbedding]:
        return [o for o in RecordingTPUEmbedding.instances if o.built]
