"""What `LocalTables` asks of a lookup: the lookup interface.

A lookup answers one call for some of a layer's tables: the sparse lookup
(`sparse.py`) and the dense XLA lookup (`dense_xla.py`) for one table each,
in training and out of it (`TrainableLookup`); the host's serving
lookups, per table (`padded_host.py`) or for every table at once
(`fused_host.py`), in serving only (`Lookup`: they have no training
method to refuse). Every method takes and returns its tables' values by
table name, so `LocalTables` calls each lookup the same way, whichever
tables it covers; a training call's lookups pass `trainable` first, which
refuses a serving lookup by its columns' names.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Mapping
from typing import NoReturn
from typing import Protocol
from typing import Sequence
from typing import TypeAlias
from typing import runtime_checkable

from keras_tpu_embed.tables.quantization import QuantizedTable
from keras_tpu_embed.tables.table_specs import TableSpec
from keras_tpu_embed.types import Tensor

TableValues: TypeAlias = "Tensor | QuantizedTable"
"""What a lookup reads a table from: its variable's value, or in a
quantized serving export its `QuantizedTable`."""

AcrossReplicas: TypeAlias = Callable[..., list[Tensor]]
"""Concatenates tensors over every replica (`replicas.py`)."""

ScratchVariable: TypeAlias = Any
"""An int32 `tf.Variable` of a table's vocabulary size (TensorFlow has no
type stubs, so any `tf` type is `Any` to mypy)."""


@runtime_checkable
class Lookup(Protocol):
    """One call's lookup of some of a layer's tables.

    Attributes:
        lengths: Per sequence column asked for them, its lengths.
    """

    lengths: dict[str, Tensor]

    @property
    def table_names(self) -> list[str]:
        """The tables this lookup reads, in the layer's order."""
        ...

    def outputs(
        self,
        variables: Mapping[str, TableValues],
        trapped_rows: Mapping[str, Tensor] | None = None,
        compiled: bool = False,
    ) -> dict[str, Tensor]:
        """Per column, its activation.

        Args:
            variables: Per table name, its values (at least this lookup's).
            trapped_rows: In training, per table, its `training_rows` after
                the trap; `None` outside training (a lookup that only
                serves refuses any).
            compiled: Whether the lookup should run as XLA computations
                where it can (serving exports ask for it).
        """
        ...


@runtime_checkable
class TrainableLookup(Lookup, Protocol):
    """A lookup that also trains its tables: its rows go through the
    gradient trap, and their gradients become its tables' updates."""

    def training_rows(
        self, variables: Mapping[str, TableValues]
    ) -> dict[str, Tensor]:
        """Per table, the rows the batch reads, to pass through the
        gradient trap (`gradient_trap.py`).

        Args:
            variables: Per table name, its values (at least this lookup's).
        """
        ...

    def update_arguments(
        self,
        gradients: Mapping[str, Tensor],
        updates_all_rows: bool,
        across_replicas: AcrossReplicas | None = None,
        scratch: Mapping[str, ScratchVariable] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Per table given a gradient, `apply_update`'s keyword arguments.

        Args:
            gradients: Per table to update, the gradient of its trapped
                rows; tables not in it are not updated (frozen tables).
            updates_all_rows: Whether the optimizer's step is dense.
            across_replicas: Concatenates tensors over every replica, or
                `None` outside a replicated step.
            scratch: Per table, a dedupe scratch variable the lookup may
                overwrite (`dense_xla.summed_duplicates`); tables without
                one dedupe without it.
        """
        ...


def trainable(
    lookups: Sequence[Lookup], tables: Mapping[str, TableSpec]
) -> list[TrainableLookup]:
    """The lookups of a training call, every one able to train.

    Args:
        lookups: The call's lookups.
        tables: Per table name, its spec (to name a refused one's columns).

    Raises:
        RuntimeError: A lookup only serves; names its columns.
    """
    able: list[TrainableLookup] = []
    for lookup in lookups:
        if not isinstance(lookup, TrainableLookup):
            refuse_training(
                [tables[name] for name in lookup.table_names],
                type(lookup).__name__,
            )
        able.append(lookup)
    return able


def refuse_training(tables: Sequence[TableSpec], lookup: str) -> NoReturn:
    """Raises the error of a serving lookup asked to train."""
    columns = ", ".join(f"'{c.name}'" for t in tables for c in t.columns)
    raise RuntimeError(
        f"The {lookup} lookup of columns {columns} serves only; it cannot "
        "train them. It is chosen only by a serving trace with "
        "training=False: call the layer with training=True outside "
        "`serving_lookups()` to train."
    )
