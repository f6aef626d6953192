"""What a layer asks of the places its tables live: the backend protocol.

A layer's tables are held either by the layer itself (`local_tables.py`:
sparse lookups on the default device or dense XLA lookups, trained through
the gradient trap) or by the TPU embedding engine (`v1_engine.py`,
one mid-level object per TPU system). Both answer `activations` for one
call; the layer merges their answers and never looks inside.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Mapping
from typing import Protocol

from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.types import Tensor


@dataclasses.dataclass(frozen=True)
class Phase:
    """What kind of call this is, and where each table's lookup runs.

    Attributes:
        training: A training step: the backend must train its tables in
            the backward pass.
        serving: A serving export is being traced.
        devices: Per table name, the device of this phase (local tables).
        serving_copies: In a serving call, per table name, what is read
            instead of the table (`serving_tables.ServingTables.copies`).
    """

    training: bool
    serving: bool
    devices: Mapping[str, LookupDevice]
    serving_copies: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Activations:
    """One backend's answer: per column name, its activation (and, for
    sequence columns asked for them, its lengths)."""

    values: dict[str, Tensor]
    lengths: dict[str, Tensor] = dataclasses.field(default_factory=dict)


class TableBackend(Protocol):
    """Holds some of a layer's tables and looks them up."""

    def activations(
        self, features: dict[str, Tensor], phase: Phase
    ) -> Activations:
        """The activations of this backend's columns for one call."""
        ...
