"""The tables a layer holds itself: their variables, lookups and training.

Every table that is not in the TPU embedding engine lives here, as the
layer's own Keras variables (non-trainable for Keras: its optimizer must
not touch them). Each call looks a table up on the device of the phase: the
sparse lookup (`sparse.py`) or the dense XLA lookup (`dense_xla.py`); a
serving trace on the host pads and compiles where it can (`padded_host.py`;
all columns in one program when every column's ids are dense,
`fused_host.py`),
reading quantized copies of the tables if the export asks (`serving_tables`,
`export/quantization.py`). In a training call the gathered rows pass
through the gradient trap (`gradient_trap.py`), whose backward pass applies
the embedding optimizer's step to the touched rows
(`optimizers/embedding_step.py` for the config's rules,
`optimizers.row_update` for the optimizer's), then counts the step.
Under a replicated strategy the rows' gradients of every replica are
combined first (`replicas.py`), so every copy takes the same update.
"""

from __future__ import annotations

from typing import Any
from typing import Mapping
from typing import Sequence

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.export.quantization import QuantizedTable
from keras_tpu_embed.lookup import dense_xla
from keras_tpu_embed.lookup import fused_host
from keras_tpu_embed.lookup import initialization
from keras_tpu_embed.lookup import padded_host
from keras_tpu_embed.lookup import replicas
from keras_tpu_embed.lookup import sparse
from keras_tpu_embed.lookup.backend import Activations
from keras_tpu_embed.lookup.backend import Phase
from keras_tpu_embed.lookup.devices import LookupDevice
from keras_tpu_embed.lookup.gradient_trap import trap_gradients
from keras_tpu_embed.lookup.tables import TableSpec
from keras_tpu_embed.optimizers import apply_update
from keras_tpu_embed.optimizers import embedding_step as update_rules
from keras_tpu_embed.optimizers.row_update import refuse_non_finite
from keras_tpu_embed.types import Tensor


class LocalTables:
    """Tables and slots owned by one layer; a `TableBackend`.

    Args:
        tables: The tables, with their columns.
        config: The layer's `EmbeddingConfig` (optimizer and rules).
        return_sequence_lengths: Also return sequence columns' lengths.
    """

    def __init__(
        self,
        tables: Sequence[TableSpec],
        config: EmbeddingConfig,
        return_sequence_lengths: bool,
    ) -> None:
        self.tables = list(tables)
        self.config = config
        self.return_sequence_lengths = return_sequence_lengths
        self._variables: dict[str, Any] = {}
        self._slots: dict[str, dict[str, Any]] = {}
        self._scratch: dict[str, Any] = {}
        self._step: Any = None
        self._trigger: Any = None
        self._counts_step = True
        # Set by the layer's `serving_lookups(table_dtype=...)` while an
        # export traces.
        self.serving_tables: dict[str, QuantizedTable] = {}

    def create_variables(
        self,
        layer: keras.layers.Layer,
        training_devices: Mapping[str, LookupDevice],
    ) -> Any:
        """Creates every table and slot as a weight of `layer`.

        Args:
            layer: The layer that owns the tables.
            training_devices: Where each table trains (the layer's
                `DevicePlan`): tables on the tensor core get a scratch.

        Returns:
            A `tf.Module` holding every table as `<table>` and every slot as
            `<table>/<slot>`, the names of the TPU mid-level API: Keras
            tracks variables in lists `tf.train.Checkpoint` does not see, so
            the layer puts this module in the object graph.
        """
        optimizer = self.config.optimizer
        module = tf.Module(name="embedding_tables")
        for table in self.tables:
            shape = (table.vocabulary_size, table.dimension)
            variable = initialization.create_table(
                layer, table.name, shape, table.initializer
            )
            self._variables[table.name] = variable
            setattr(module, table.name, variable)
            self._slots[table.name] = {}
            # A frozen table (`trainable=False`) has no slots, as TF's
            # variable with trainable=False gets none from an optimizer.
            for slot in optimizer.SLOTS if table.trainable else ():
                slot_variable = initialization.create_table(
                    layer,
                    f"{table.name}_{slot.name}",
                    shape,
                    keras.initializers.Constant(
                        optimizer.slot_initial_value(slot)
                    ),
                )
                self._slots[table.name][slot.name] = slot_variable
                setattr(module, f"{table.name}/{slot.name}", slot_variable)
        self._create_scratch(training_devices)
        return module

    def _create_scratch(self, devices: Mapping[str, LookupDevice]) -> None:
        """A dedupe scratch per table trained on the tensor core.

        `dense_xla.summed_duplicates` overwrites it at the batch's ids every
        step, so that no step allocates or writes a vocabulary-sized tensor.
        It holds no state: a plain `tf.Variable` that neither this module nor
        the layer tracks, so no weight list, checkpoint or SavedModel sees
        it. Created eagerly (`init_scope`) in the strategy's scope, so each
        replica writes its own copy, as it does its tables.
        """
        if self.config.optimizer.updates_all_rows():
            return  # A dense step sums every entry's gradient itself.
        for table in self.tables:
            core = devices[table.name]
            if not table.trainable or core is not LookupDevice.TPU_TENSOR_CORE:
                continue
            with tf.init_scope():
                self._scratch[table.name] = tf.Variable(
                    tf.zeros([table.vocabulary_size], tf.int32),
                    trainable=False,
                    name=f"{table.name}_dedupe_scratch",
                )

    def bind(self, step: Any, trigger: Any, counts_step: bool = True) -> None:
        """The layer's variables that training reads and writes.

        Args:
            step: The layer's `embedding_step` variable, read by the rules.
            trigger: The scalar trainable variable whose gradient runs the
                updates (see `gradient_trap.py`).
            counts_step: Whether these tables' updates count the step (not
                when the TPU engine counts it for the same layer).
        """
        self._step, self._trigger = step, trigger
        self._counts_step = counts_step

    def use_specs(self, by_name: dict[str, TableSpec]) -> None:
        """Takes new specs of the same tables (after `load_assets`)."""
        self.tables = [by_name[table.name] for table in self.tables]

    @property
    def table_names(self) -> list[str]:
        return [table.name for table in self.tables]

    def table_variable(self, name: str) -> Any:
        return self._variables[name]

    def slot_variables(self, name: str) -> dict[str, Any]:
        return dict(self._slots[name])

    def activations(
        self, features: dict[str, Tensor], phase: Phase
    ) -> Activations:
        """Looks every table up; in training, its rows go through the trap."""
        fused = self._fused_serving(features, phase)
        if fused is not None:
            return fused
        lookups = [
            self._lookup(table, features, phase.devices[table.name], phase)
            for table in self.tables
        ]
        variables = [self._variables[t.name].value for t in self.tables]
        if phase.serving:
            variables = [
                self.serving_tables.get(t.name, variable)
                for t, variable in zip(self.tables, variables)
            ]
        trapped: list[Any] = [None] * len(lookups)
        if phase.training and lookups:
            rows = [
                lookup.training_rows(variable)
                for lookup, variable in zip(lookups, variables)
            ]

            def apply_gradients(gradients: list[Tensor]) -> Tensor:
                return self._apply_gradients(lookups, gradients)

            trapped = trap_gradients(rows, self._trigger.value, apply_gradients)
        values: dict[str, Tensor] = {}
        lengths: dict[str, Tensor] = {}
        for lookup, variable, table_rows in zip(lookups, variables, trapped):
            values.update(
                lookup.outputs(variable, table_rows, compiled=phase.serving)
            )
            lengths.update(lookup.lengths)
        return Activations(values=values, lengths=lengths)

    def _fused_serving(
        self, features: dict[str, Tensor], phase: Phase
    ) -> Activations | None:
        """Serving on the host with every column's ids dense: one compiled
        program for all of them (`fused_host.py`); None otherwise."""
        if not phase.serving or phase.training:
            return None
        host = [
            t for t in self.tables if phase.devices[t.name] is LookupDevice.CPU
        ]
        if len(host) != len(self.tables) or not fused_host.applies(
            host, features, self.return_sequence_lengths
        ):
            return None
        variables = [
            self.serving_tables.get(t.name, self._variables[t.name].value)
            for t in host
        ]

        def per_column() -> dict[str, Tensor]:
            values: dict[str, Tensor] = {}
            for table, variable in zip(host, variables):
                lookup = padded_host.PaddedHostLookup(table, features, False)
                values.update(lookup.outputs(variable, compiled=True))
            return values

        return Activations(
            values=fused_host.outputs(host, features, variables, per_column)
        )

    def _lookup(
        self,
        table: TableSpec,
        features: dict[str, Tensor],
        device: LookupDevice,
        phase: Phase,
    ) -> Any:
        if device is LookupDevice.TPU_TENSOR_CORE:
            return dense_xla.DenseTableLookup(
                table, features, self.return_sequence_lengths
            )
        if phase.serving and not phase.training:
            # Serving on the host: padded and compiled where the batch
            # allows, sparse where it does not (`padded_host.py`).
            return padded_host.PaddedHostLookup(
                table, features, self.return_sequence_lengths
            )
        return sparse.SparseTableLookup(
            table, features, self.return_sequence_lengths
        )

    def _apply_gradients(
        self, lookups: list[Any], gradients: list[Tensor]
    ) -> Tensor:
        """Every table's update, then the step count; returns a number
        computed after all of them (the trap's data dependency)."""
        config = self.config
        optimizer = config.optimizer
        step = self._step.value
        across_replicas = replicas.row_gradient_gather()
        updates = []
        for table, lookup, gradient in zip(self.tables, lookups, gradients):
            if not table.trainable:
                continue
            scratch = self._scratch.get(table.name)
            arguments = lookup.update_arguments(
                gradient,
                optimizer.updates_all_rows(),
                across_replicas=across_replicas,
                **({} if scratch is None else {"scratch": scratch}),
            )
            arguments["gradient"] = update_rules.scale_and_clip(
                arguments["gradient"], config, step
            )
            if config.non_finite_updates == "raise":
                arguments = refuse_non_finite(arguments, table.name, step)
            updates += apply_update(
                optimizer,
                self._variables[table.name].value,
                {k: v.value for k, v in self._slots[table.name].items()},
                learning_rate=update_rules.learning_rate(table, config, step),
                **arguments,
            )
        with tf.control_dependencies(updates):
            if not self._counts_step:
                return tf.identity(self._step.value)
            # In a replica context the step (aggregation
            # "only_first_replica") is added to once for all copies, in a
            # merge call that returns a plain tensor, not a variable.
            counted = self._step.value.assign_add(1)
        with tf.control_dependencies([counted]):
            return tf.identity(self._step.value)
