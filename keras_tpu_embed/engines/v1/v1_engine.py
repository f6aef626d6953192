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
from keras_tpu_embed.engines import engine_host_ids
from keras_tpu_embed.engines.engine_step import EngineStep
from keras_tpu_embed.engines.v1.v1_variables import EngineTableCheckpoint
from keras_tpu_embed.engines.v1.v1_variables import V1HostShards
from keras_tpu_embed.placement import hardware as tpu_hardware


class V1Engine(V1HostShards, EngineStep):
    """The one mid-level object of a TPU system and the layers it serves.

    Its members are `EngineVariables`, its tables `TPUEmbedding`'s host
    shards (`V1HostShards`), its steps and registration `EngineStep`; here,
    what only `TPUEmbedding` does: its mid-level object and checkpoints.
    """

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
