"""Where each of a layer's tables looks up, decided once: a `DevicePlan`.

The layer decides its tables' devices from three things: the columns'
`embedding_lookup_device`, the layer's `serving_lookup_device`, and the
embedding hardware of the strategy it is built under (`placement/hardware.py`).
`plan_devices` applies the rules of `devices.py` to them once per table,
and every reader (the layer's build and calls, its local tables, its
serving exports) reads the plan. An export that serves on another device
derives its own plan (`with_serving_device`) instead of changing flags.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping
from typing import Sequence
from typing import TypeVar

from keras_tpu_embed.placement.devices import DeviceTable
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.placement.devices import table_device
from keras_tpu_embed.placement.devices import training_device
from keras_tpu_embed.placement.hardware import EmbeddingHardware

TableT = TypeVar("TableT", bound=DeviceTable)


@dataclasses.dataclass(frozen=True)
class DevicePlan:
    """Each table's lookup device for training and for serving.

    Attributes:
        hardware: The embedding hardware the training devices are for
            (`NONE` before the layer is built under a strategy).
        training: Per table name, where it trains on `hardware`.
        serving: Per table name, where an export looks it up, for the
            tables that have a valid serving device.
        serving_errors: Per table name, why it has no serving device (an
            engine column without a serving choice, or the tensor core for
            a column without `tensor_core_shape`); raised by
            `check_serving`, when an export asks for it.
        serving_device: The layer's (or the export's) serving device that
            overrides the columns', if any.
    """

    hardware: EmbeddingHardware
    training: Mapping[str, LookupDevice]
    serving: Mapping[str, LookupDevice]
    serving_errors: Mapping[str, str]
    serving_device: LookupDevice | None

    def on_engine(self, table_name: str) -> bool:
        """Whether the table trains in the TPU embedding engine."""
        device = self.training.get(table_name)
        return device is LookupDevice.TPU_EMBEDDING_CORE

    def split(
        self, tables: Sequence[TableT]
    ) -> tuple[list[TableT], list[TableT]]:
        """`tables` as (the layer's own, the engine's)."""
        engine = [table for table in tables if self.on_engine(table.name)]
        return [table for table in tables if table not in engine], engine

    def check_serving(self) -> None:
        """Raises for the first table that has no valid serving device.

        Raises:
            ValueError: naming the column, its device and the fix.
        """
        for message in self.serving_errors.values():
            raise ValueError(message)

    def with_serving_device(
        self, tables: Sequence[DeviceTable], device: LookupDevice | None
    ) -> DevicePlan:
        """This plan with `device` overriding every table's serving device
        (this plan's own serving device when `device` is None)."""
        if device is None or device is self.serving_device:
            return self
        serving, errors = _serving_devices(tables, device)
        return dataclasses.replace(
            self, serving=serving, serving_errors=errors, serving_device=device
        )


def _serving_devices(
    tables: Sequence[DeviceTable], override: LookupDevice | None
) -> tuple[dict[str, LookupDevice], dict[str, str]]:
    """Each table's serving device, or why it has none (in table order)."""
    serving: dict[str, LookupDevice] = {}
    errors: dict[str, str] = {}
    for table in tables:
        try:
            serving[table.name] = table_device(
                table, serving=True, serving_override=override
            )
        except ValueError as error:
            errors[table.name] = str(error)
    return serving, errors


def plan_devices(
    tables: Sequence[DeviceTable],
    hardware: EmbeddingHardware,
    serving_device: LookupDevice | None,
) -> DevicePlan:
    """Decides every table's devices once.

    Args:
        tables: The layer's tables (`tables.TableSpec`s); the columns of a
            table agree on their device.
        hardware: The embedding hardware the layer trains on.
        serving_device: The layer's `serving_lookup_device`.

    Returns:
        The plan every reader of the layer's devices uses.

    Raises:
        ValueError: a table cannot train on `hardware` as its columns ask
            (`devices.training_device`).

    Example:

    >>> item = categorical_column_with_identity("item", 10)
    >>> [table] = TPUEmbeddingLayer([embedding_column(item, 4)]).table_specs
    >>> plan = plan_devices([table], EmbeddingHardware.V1, None)
    >>> plan.training["item"].value, plan.serving["item"].value
    ('tpu_embedding_core', 'cpu')
    """
    serving, errors = _serving_devices(tables, serving_device)
    return DevicePlan(
        hardware=hardware,
        training={t.name: training_device(t, hardware) for t in tables},
        serving=serving,
        serving_errors=errors,
        serving_device=serving_device,
    )
