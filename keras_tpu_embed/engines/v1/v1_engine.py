"""The TPU embedding engine backend: one mid-level object per TPU system.

TensorFlow's mid-level API (`tf.tpu.experimental.embedding.TPUEmbedding` on
V1 hardware) owns the embedding engine of a whole TPU system: building a
second object fails with "TPU is already initialized for embeddings", and
`enqueue` takes every feature of the object at once. So the embedding-core
tables of every embedding layer built under one `TPUStrategy` are served by
one `V1Engine` (`engine_registry.py` keeps one per strategy):

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
  multiplier (`backends/embedding_step.py`) and sends all of them with one
  `apply_gradients` under the same name, then counts the step on every
  layer whose local tables do not count it already (`engine_step.py`);
- the tables' shapes are known from the configs before TF creates them,
  and their values are read from the TPU and written to it, for
  checkpoints and `.keras` files (`engine_members.py`).

On SparseCore TPUs (embedding_feature V2: v5p, v6e and later) the engine
is a `SparseCoreEngine`, the same engine rules driving `TPUEmbeddingV2`
(`engines/sparsecore/sparsecore_engine.py`). TPU hardware is consulted
only through `placement/hardware.py`. No machine this package is
developed on has a TPU: the tests run this path under
`keras_tpu_embed.testing.emulated_tpu` (TF's own mid-level code, only
the chip emulated), and it runs on real hardware only through
`examples/tpu_smoke.py`.
"""

from __future__ import annotations

from typing import Any
from typing import Sequence

from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.engines import engine_checks
from keras_tpu_embed.engines import engine_host_ids
from keras_tpu_embed.engines.conversion import to_tpu_feature_configs
from keras_tpu_embed.engines.engine import EngineTables
from keras_tpu_embed.engines.engine_members import EngineMember
from keras_tpu_embed.engines.engine_members import EngineTableCheckpoint
from keras_tpu_embed.engines.engine_step import EngineStep
from keras_tpu_embed.placement import hardware as tpu_hardware


class V1Engine(EngineStep):
    """The one mid-level object of a TPU system and the layers it serves.

    Its members and tables are `EngineVariables`, its steps `EngineStep`;
    here, the layers join it.
    """

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

    def _refuse_what_it_cannot_honour(
        self,
        layer_name: str,
        columns: Sequence[AnyEmbeddingColumn],
        config: EmbeddingConfig,
        step: Any,
    ) -> None:
        """Raises for what this engine would not train as asked.

        The V1 engine honours every setting `to_tpu_feature_configs`
        gives it; `SparseCoreEngine` does not.
        """

    def checkpoint_tables(self, tables: Sequence[str]) -> dict[str, Any]:
        """`{<table> or <table>/<slot>: trackable}` of `tables` in a
        checkpoint, each with `shape` and `read()`."""
        return {
            (table if slot == "parameters" else f"{table}/{slot}"): (
                EngineTableCheckpoint(self, table, slot)
            )
            for table in tables
            for slot in self.table_slots(table)
        }

    def checkpoint_extras(self, tables: Sequence[str]) -> dict[str, Any]:
        """Other children a checkpoint of `tables` needs (SparseCore: the
        values, `sparsecore_engine.SparseCoreEngine`)."""
        return {}

    def _make_mid_level(self) -> Any:
        """The mid-level object for the members registered so far.

        The constructor only stores configs; the TPU is touched by
        `build`, which the first enqueue calls. So the object can be
        replaced until the first step.
        """
        mid_level = tpu_hardware.mid_level_class(self.hardware)(
            feature_config=dict(self._feature_configs),
            optimizer=self._optimizer,
            pipeline_execution_with_tensor_core=self._pipeline,
        )
        engine_host_ids.apply_on_host(mid_level, self._host_rules)
        return mid_level
