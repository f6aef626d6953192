"""`TPUEmbeddingLayer`: the Keras 3 embedding layer, which only routes.

The layer is the Keras API and routes: at build it decides once where each
table lives (`placement/device_plan.py`) and takes its backends from
`backends/local_tables.py` (its own `LocalTables`) and
`engines/engine_registry.py` (the TPU system's engine);
at call it asks each backend for activations (`backends/table_backend.py`)
and assembles the output (`preprocessing/layer_io.py`). The math is in
`lookups/`, `engines/` and `optimizers/`.
"""

from __future__ import annotations

import contextlib
from typing import Any
from typing import Iterator
from typing import Sequence

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import keras_in_symbolic_scope
from keras_tpu_embed._compat import tf
from keras_tpu_embed.backends import layer_variables
from keras_tpu_embed.backends import serving_tables
from keras_tpu_embed.backends.local_tables import LocalTables
from keras_tpu_embed.backends.serving_tables import ServingTables
from keras_tpu_embed.backends.table_backend import Phase
from keras_tpu_embed.backends.table_backend import TableBackend
from keras_tpu_embed.columns import to_embedding_columns
from keras_tpu_embed.columns import vocabulary_assets
from keras_tpu_embed.columns.embedding import EmbeddingColumnLike
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.config import as_config
from keras_tpu_embed.engines.engine import Engine
from keras_tpu_embed.engines.engine import EngineTables
from keras_tpu_embed.engines.engine_registry import engine_for
from keras_tpu_embed.engines.sparsecore.sparsecore_buffers import (
    check_declared_columns,
)
from keras_tpu_embed.layer_config import layer_arguments
from keras_tpu_embed.layer_config import layer_config
from keras_tpu_embed.lookups import returned_checks
from keras_tpu_embed.placement import hardware as tpu_hardware
from keras_tpu_embed.placement.device_plan import plan_devices
from keras_tpu_embed.placement.devices import SUPPORTED_SERVING_DEVICES
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.placement.devices import parse_lookup_device
from keras_tpu_embed.preprocessing.layer_io import LayerInputs
from keras_tpu_embed.preprocessing.layer_io import LayerOutputs
from keras_tpu_embed.preprocessing.layer_io import check_output_mode
from keras_tpu_embed.serialization import serializable
from keras_tpu_embed.tables.quantization import check_table_dtype
from keras_tpu_embed.tables.table_specs import TableSpec
from keras_tpu_embed.tables.table_specs import group_into_tables
from keras_tpu_embed.types import KerasConfig
from keras_tpu_embed.types import Tensor


@serializable
class TPUEmbeddingLayer(keras.layers.Layer):  # type: ignore[misc]
    """Embedding lookups for feature-column specs, trained like the TPU engine.

    Takes the ids and weights produced by `FeaturePreprocessor` (or plain
    integer ids for identity columns: dense with -1 padding, ragged or
    sparse) and returns one activation per column. The tables are updated
    by `config.optimizer` with the TPU embedding engine's rules, as sparse
    row updates, not by the optimizer given to `model.compile`.

    Each table's lookup runs where its columns' `embedding_lookup_device`
    says for the phase (training or serving): the sparse lookup on the
    default device, the dense `tpu_tensor_core` lookup (compiled with XLA),
    or,
    when the layer is built under `TPUStrategy` on a TPU with an embedding
    engine, the engine itself (`engines/v1/v1_engine.py`): every embedding
    layer of the model then shares one
    `tf.tpu.experimental.embedding.TPUEmbedding` (on SparseCore TPUs, v5p
    and later: one `TPUEmbeddingV2`), which owns those tables and slots.
    Build and call the layer under the same strategy; the engine path is
    exercised on TPU hardware only (see `examples/tpu_smoke.py`).

    How the tables train: Keras' optimizer must not touch them, so
    `model.summary()` counts tables and slots as non-trainable parameters.
    They are trained all the same, in the backward pass of every training
    step, by `config.optimizer`. The layer's only trainable weight,
    `table_update_trigger`, is a scalar that stays 0: its gradient is what
    runs those updates.

    Saving: tables and slots are in the TensorFlow object graph under
    `embedding_tables` (`<table>` and `<table>/<slot>`), so
    `tf.train.Checkpoint(model=...)`, `tf.train.CheckpointManager`,
    `model.save_weights`, `model.save` (`.keras`, vocabulary files
    included) and the `ModelCheckpoint` / `BackupAndRestore` callbacks all
    carry them with `embedding_step`.

    Args:
        columns: Embedding columns (`embedding_column`,
            `shared_embedding_columns`, or their `tf.feature_column` /
            `tf.compat.v1.tpu.experimental` equivalents).
        config: An `EmbeddingConfig`; defaults to `EmbeddingConfig()`.
        serving_lookup_device: `None`, `"cpu"` or `"tpu_tensor_core"`:
            where this layer's lookups run in a serving export, overriding
            its columns.
        output: `"dict"` (keyed by column name) or `"concat"` (one tensor,
            columns ordered by name, like `DenseFeatures`; non-sequence
            columns only).
        return_sequence_lengths: With `output="dict"`, also return
            `<column name>_sequence_length` (int64 `[batch]`, clipped to
            `max_sequence_length`) for each sequence column.
        **kwargs: Base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Input shape:
        A dict keyed by feature key (and weight key) of int ids: dense
        `[batch]` / `[batch, n]`, ragged `[batch, (n)]` or sparse
        `[batch, n]`. A single tensor is accepted when the layer reads one
        unweighted feature.

    Output shape:
        Per non-sequence column `[batch, dimension]`; per sequence column
        `[batch, max_sequence_length, dimension]`, zero-padded and truncated.
        With `output="concat"`, `[batch, sum of dimensions]`.

    Example:

    >>> item = categorical_column_with_identity("item_id", num_buckets=100)
    >>> layer = TPUEmbeddingLayer([embedding_column(item, 8)])
    >>> out = layer({"item_id": tf.constant([[3, 7], [5, -1]])})
    >>> out["item_id_embedding"].shape
    TensorShape([2, 8])
    """

    def __init__(
        self,
        columns: Sequence[EmbeddingColumnLike],
        config: EmbeddingConfig | None = None,
        serving_lookup_device: str | None = None,
        output: str = "dict",
        return_sequence_lengths: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        tpu_hardware.refuse_unsupported_strategy(
            f"{type(self).__name__} '{self.name}'"
        )
        # Read by `_trackable_children`, which runs from here on: set first.
        self._engine_tables: EngineTables | None = None
        self.columns = to_embedding_columns(columns)
        self.config = as_config(config)
        check_declared_columns(
            f"{type(self).__name__} '{self.name}'", self.config, self.columns
        )
        self.serving_lookup_device = parse_lookup_device(
            serving_lookup_device,
            "serving_lookup_device",
            SUPPORTED_SERVING_DEVICES,
        )
        self.output_mode = check_output_mode(output, self.columns)
        self.return_sequence_lengths = bool(return_sequence_lengths)
        self.table_specs = group_into_tables(self.columns)
        # Off any strategy until build decides again on its hardware.
        self._devices = plan_devices(
            self.table_specs,
            tpu_hardware.EmbeddingHardware.NONE,
            self.serving_lookup_device,
        )
        self._local = LocalTables([], self.config, self.return_sequence_lengths)
        # A serving device given here is checked now, not at export.
        if self.serving_lookup_device is not None:
            self._devices.check_serving()
        # Only the tensor-core path compiles with XLA (the host path uses
        # sparse ids and segment ops); telling Keras keeps
        # `jit_compile="auto"` from trying otherwise.
        self.supports_jit = all(
            device is LookupDevice.TPU_TENSOR_CORE
            for device in self._devices.training.values()
        )
        self._inputs = LayerInputs(
            f"{type(self).__name__} '{self.name}'", self.columns
        )

    @contextlib.contextmanager
    def serving_lookups(
        self,
        lookup_device: LookupDevice | None = None,
        table_dtype: str = "float32",
    ) -> Iterator[None]:
        """Inside, calls trace the serving lookups (what an export holds).

        Each table's serving device is resolved first, so that an invalid
        one (`tpu_embedding_core`, or the tensor core for a column without
        `tensor_core_shape`) fails here, naming the column.

        Args:
            lookup_device: `LookupDevice.CPU` or `TPU_TENSOR_CORE` for every
                table, overriding the layer's `serving_lookup_device`.
            table_dtype: `"float32"`, `"bfloat16"` or `"int8"`: serves the
                layer's own tables from quantized copies
                (`quantized_copies`).

        Tables in the TPU embedding engine are served from copies read
        from the TPU a block of rows at a time, each block from the host
        that holds it (`EngineTables.serving_tables`), in `table_dtype`.

        Raises:
            ValueError: an invalid serving device or `table_dtype`, or a
                table with NaN or inf values, or raw
                `feature_to_config_dict` entries (no column serves them).
        """
        plan = self._devices.with_serving_device(
            self.table_specs, lookup_device
        )
        plan.check_serving()
        local = self._local
        tables = ServingTables.from_layer_tables(
            f"{type(self).__name__} '{self.name}'",
            plan,
            {name: local.table_variable(name) for name in local.table_names},
            self._engine_tables,
            self.table_specs,
            self.config,
            self.return_sequence_lengths,
            check_table_dtype(table_dtype),
        )
        with serving_tables.serving(self, tables):
            yield

    @property
    def input_dtype(self) -> str:
        """Float inputs (weights) stay float32 under any dtype policy.

        Keras casts float inputs to `input_dtype`, the compute dtype by
        default: `mixed_bfloat16` would round the weights and, on the TPU
        engine, compute them on the device instead of enqueueing them from
        the host. Ids are integers and never cast.
        """
        return "float32"

    @property
    def _training_devices(self) -> dict[str, LookupDevice]:
        """Per table name, where it trains (decided at build)."""
        return dict(self._devices.training)

    # ------------------------------------------------------------------ build

    def build(self, input_shape: Any = None) -> None:
        tpu_hardware.refuse_unsupported_strategy(
            f"{type(self).__name__} '{self.name}'"
        )
        strategy = tf.distribute.get_strategy()
        hardware = tpu_hardware.embedding_hardware(strategy)
        self._devices = plan_devices(
            self.table_specs, hardware, self.serving_lookup_device
        )
        local_tables, engine_tables = self._devices.split(self.table_specs)
        self._local = LocalTables(
            local_tables, self.config, self.return_sequence_lengths
        )
        # In the TensorFlow object graph under a stable name, so that
        # tf.train.Checkpoint(model=...) holds every table and slot and a
        # checkpoint read before build restores into them.
        self.embedding_tables = self._local.create_variables(
            self, self._devices.training
        )
        self.embedding_step = self.add_weight(
            name="embedding_step",
            shape=(),
            dtype="int64",
            initializer="zeros",
            trainable=False,
            autocast=False,
            # Counted in the replica function, once, under any strategy.
            aggregation="only_first_replica",
        )
        # Stays 0 and receives a zero gradient; it exists so that Keras
        # differentiates the path through the tables, whose backward pass
        # applies the sparse updates (see backends/gradient_trap.py). Its
        # name says so in `model.trainable_weights`.
        self.gradient_trap = self.add_weight(
            name="table_update_trigger",
            shape=(),
            dtype="float32",
            initializer="zeros",
            trainable=True,
            autocast=False,
        )
        self._local.bind(self.embedding_step, self.gradient_trap)
        if engine_tables:
            self._engine_tables = engine_for(strategy, hardware).register(
                self.name,
                [c for t in engine_tables for c in t.columns],
                self._inputs.keys_from_shape(input_shape),
                config=self.config,
                step=self.embedding_step,
                trigger=self.gradient_trap,
                # Local tables count the step in their own trap.
                counts_step=not local_tables,
                return_sequence_lengths=self.return_sequence_lengths,
                layer_description=f"{type(self).__name__} '{self.name}'",
            )
        self.built = True

    def table_variable(self, table_name: str) -> Any:
        """The `keras.Variable` of a table, by table name."""
        self.check_not_on_engine(table_name)
        if table_name not in self._local.table_names:
            raise KeyError(
                f"No table '{table_name}' in {type(self).__name__} "
                f"'{self.name}'. Its tables: {sorted(self._local.table_names)}."
            )
        return self._local.table_variable(table_name)

    def slot_variables(self, table_name: str) -> dict[str, Any]:
        """The optimizer slot variables of a table, keyed by slot name."""
        self.check_not_on_engine(table_name)
        return self._local.slot_variables(table_name)

    def check_not_on_engine(self, table_name: str) -> None:
        """Raises ValueError if the TPU embedding engine holds the table."""
        if self._devices.on_engine(table_name):
            raise ValueError(
                f"Table '{table_name}' of '{self.name}' is held by the TPU "
                "embedding engine, not by the layer: save it with "
                "tf.train.Checkpoint(embedding=kte.engine_checkpoint(model))."
            )

    @property
    def local_table_specs(self) -> list[TableSpec]:
        """The tables this layer holds itself (not the engine); built only."""
        return list(self._local.tables)

    @property
    def engine(self) -> Engine | None:
        """The shared TPU embedding engine, when the layer is built on one."""
        if self._engine_tables is None:
            return None
        return self._engine_tables.engine

    def _trackable_children(
        self, save_type: str = "checkpoint", **kwargs: Any
    ) -> dict[str, Any]:
        children: dict[str, Any] = super()._trackable_children(
            save_type, **kwargs
        )
        if self._engine_tables is not None:
            self._engine_tables.track_checkpoints(self.embedding_tables)
        return children

    # ------------------------------------------------------------------- call

    def _backends(self) -> list[TableBackend]:
        """Where this layer's tables live: the engine first, as it enqueues
        every feature of the step."""
        backends: list[TableBackend] = [self._local]
        serving = serving_tables.served(self)
        if serving is not None and serving.engine_lookups is not None:
            backends.append(serving.engine_lookups)
        elif self._engine_tables is not None:
            backends.insert(0, self._engine_tables)
        return backends

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        serving = serving_tables.served(self)
        tpu_hardware.check_called_where_built(
            f"{type(self).__name__} '{self.name}'",
            self._devices.hardware,
            # A serving trace reads copies of the engine's tables.
            on_engine=self._engine_tables is not None and serving is None,
        )
        features = self._inputs.features(inputs)
        if keras_in_symbolic_scope() and self._engine_tables is None:
            # Keras' symbolic build of a subclassed model under
            # MirroredStrategy feeds float32 placeholders whatever the
            # data's dtype; it wants shapes only, so no lookup runs.
            return self._outputs().placeholder(features)
        # Keras calls a subclassed model whose `call` takes no `training`
        # without it, so in `fit` its layers see None: unless told False,
        # trap the rows; the update runs only if a gradient reaches them.
        devices = (
            self._devices.training if serving is None else serving.plan.serving
        )
        phase = Phase(
            training=training is not False and serving is None,
            serving=serving is not None,
            devices={
                table.name: devices[table.name] for table in self.table_specs
            },
            serving_copies={} if serving is None else serving.copies,
        )
        values: dict[str, Tensor] = {}
        lengths: dict[str, Tensor] = {}
        for backend in self._backends():
            returned_checks.note_lookup()
            answer = backend.activations(features, phase)
            values.update(answer.values)
            lengths.update(answer.lengths)
        return self._outputs().assemble(values, lengths)

    def _outputs(self) -> LayerOutputs:
        return LayerOutputs(
            columns=self.columns,
            raw_features=(
                {}
                if self._engine_tables is None
                else self._engine_tables.raw_features
            ),
            concat=self.output_mode == "concat",
            return_sequence_lengths=self.return_sequence_lengths,
            dtype=self.compute_dtype,
        )

    def compute_output_spec(self, inputs: Any, training: Any = None) -> Any:
        return self._outputs().spec()

    # ---------------------------------------------------------- serialization

    def get_config(self) -> KerasConfig:
        return layer_config(
            super().get_config(),
            self.columns,
            self.config,
            self.serving_lookup_device,
            self.output_mode,
            self.return_sequence_lengths,
        )

    @classmethod
    def from_config(cls, config: KerasConfig) -> Any:
        return cls(**layer_arguments(config))

    def save_own_variables(self, store: Any) -> None:
        """Stores tables and slots by name (`backends/layer_variables.py`)."""
        layer_variables.save_layer_variables(self, store, self._engine_tables)

    def load_own_variables(self, store: Any) -> None:
        """By name, or by position for files stored so; see `loading`."""
        engine = self._engine_tables
        if not layer_variables.load_layer_variables(self, store, engine):
            super().load_own_variables(store)

    def save_assets(self, dir_path: str) -> None:
        """Copies the columns' vocabulary files into a `.keras` archive."""
        vocabulary_assets.save_vocabularies(self.columns, dir_path)

    def load_assets(self, dir_path: str) -> None:
        """Points the columns at the vocabularies the archive carries."""
        self.columns = vocabulary_assets.load_vocabularies(
            self.columns, dir_path
        )
        self._inputs.columns = self.columns
        by_name = {t.name: t for t in group_into_tables(self.columns)}
        self.table_specs = list(by_name.values())
        if self.built:
            self._local.use_specs(by_name)
