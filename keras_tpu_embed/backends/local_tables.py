"""The tables a layer holds itself: their variables, lookups and training.

Every table that is not in the TPU embedding engine lives here, as the
layer's own Keras variables (non-trainable for Keras: its optimizer must
not touch them). Each call looks a table up on the device of the phase: the
sparse lookup (`sparse.py`) or the dense XLA lookup (`dense_xla.py`); a
serving trace on the host pads and compiles where it can (`padded_host.py`;
all columns in one program when every column's ids are dense,
`fused_host.py`). Every lookup is a `lookup_interfaces.Lookup`, called
the same way; in a serving call each reads the copies the export made
(`phase.serving_copies`: quantized, `tables/quantization.py`, or of the
engine's tables; `serving_tables.py`). In a training call the
gathered rows pass through the gradient trap (`gradient_trap.py`), whose
backward pass applies the embedding optimizer's step to the touched rows
(`backends/embedding_step.py` for the config's rules,
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
from keras_tpu_embed.backends import embedding_step as update_rules
from keras_tpu_embed.backends import replicas
from keras_tpu_embed.backends.gradient_trap import trap_gradients
from keras_tpu_embed.backends.table_backend import Activations
from keras_tpu_embed.backends.table_backend import Phase
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.lookups import dense_xla
from keras_tpu_embed.lookups import fused_host
from keras_tpu_embed.lookups import padded_host
from keras_tpu_embed.lookups import sparse
from keras_tpu_embed.lookups.lookup_interfaces import Lookup
from keras_tpu_embed.lookups.lookup_interfaces import TableValues
from keras_tpu_embed.lookups.lookup_interfaces import TrainableLookup
from keras_tpu_embed.lookups.lookup_interfaces import trainable
from keras_tpu_embed.optimizers import apply_update
from keras_tpu_embed.optimizers.row_update import refuse_non_finite
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.tables import initialization
from keras_tpu_embed.tables.sparsecore_checkpoint import TableContainer
from keras_tpu_embed.tables.table_specs import TableSpec
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
        module = TableContainer(name="embedding_tables")
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
        lookups = self.lookups(features, phase)
        variables: dict[str, TableValues] = {
            t.name: (
                phase.serving_copies[t.name]
                if t.name in phase.serving_copies
                else self._variables[t.name].value
            )
            for t in self.tables
        }
        trapped: dict[str, Tensor] | None = None
        if phase.training and lookups:
            training = trainable(lookups, {t.name: t for t in self.tables})
            rows: dict[str, Tensor] = {}
            for trained in training:
                rows.update(trained.training_rows(variables))
            names = list(rows)

            def apply_gradients(gradients: list[Tensor]) -> Tensor:
                return self._apply_gradients(
                    training, dict(zip(names, gradients))
                )

            trapped = dict(
                zip(
                    names,
                    trap_gradients(
                        list(rows.values()),
                        self._trigger.value,
                        apply_gradients,
                    ),
                )
            )
        values: dict[str, Tensor] = {}
        lengths: dict[str, Tensor] = {}
        for lookup in lookups:
            values.update(
                lookup.outputs(variables, trapped, compiled=phase.serving)
            )
            lengths.update(lookup.lengths)
        return Activations(values=values, lengths=lengths)

    def lookups(
        self, features: dict[str, Tensor], phase: Phase
    ) -> list[Lookup]:
        """The lookups of one call, covering every table once, in order.

        Serving on the host with every column's ids dense takes one
        compiled program for all of them (`fused_host.py`); otherwise each
        table takes the lookup of its device and phase.
        """
        on_host = all(
            phase.devices[t.name] is LookupDevice.CPU for t in self.tables
        )
        if (
            phase.serving
            and not phase.training
            and on_host
            and fused_host.applies(
                self.tables, features, self.return_sequence_lengths
            )
        ):
            return [fused_host.FusedHostLookup(self.tables, features)]
        return [
            self._lookup(table, features, phase.devices[table.name], phase)
            for table in self.tables
        ]

    def _lookup(
        self,
        table: TableSpec,
        features: dict[str, Tensor],
        device: LookupDevice,
        phase: Phase,
    ) -> Lookup:
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
        self, lookups: list[TrainableLookup], gradients: dict[str, Tensor]
    ) -> Tensor:
        """Every table's update, then the step count; returns a number
        computed after all of them (the trap's data dependency)."""
        config = self.config
        optimizer = config.optimizer
        step = self._step.value
        across_replicas = replicas.row_gradient_gather()
        by_table = {
            name: lookup for lookup in lookups for name in lookup.table_names
        }
        updates = []
        for table in self.tables:
            if not table.trainable:
                continue
            lookup = by_table[table.name]
            arguments = lookup.update_arguments(
                {table.name: gradients[table.name]},
                optimizer.updates_all_rows(),
                across_replicas=across_replicas,
                scratch=self._scratch,
            )[table.name]
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
