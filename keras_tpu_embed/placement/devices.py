"""Lookup devices: the strings users pass, and the enum the package uses."""

from __future__ import annotations

import enum
from typing import Protocol
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.placement.hardware import EmbeddingHardware


class LookupDevice(str, enum.Enum):
    """Where an embedding lookup runs.

    `CPU`: the sparse lookup on the default device in training, on the host
    CPU in serving. `TPU_TENSOR_CORE`: the dense padded lookup compiled with
    XLA. `TPU_EMBEDDING_CORE`: the TPU embedding engine, under `TPUStrategy`
    on a TPU that has one.
    """

    CPU = "cpu"
    TPU_TENSOR_CORE = "tpu_tensor_core"
    TPU_EMBEDDING_CORE = "tpu_embedding_core"

    def __str__(self) -> str:
        return self.value


SUPPORTED_LOOKUP_DEVICES: tuple[str, ...] = tuple(d.value for d in LookupDevice)
SUPPORTED_SERVING_DEVICES: tuple[str, ...] = (
    LookupDevice.CPU.value,
    LookupDevice.TPU_TENSOR_CORE.value,
)


def parse_lookup_device(
    value: str | LookupDevice | None,
    argument: str = "embedding_lookup_device",
    allowed: tuple[str, ...] = SUPPORTED_LOOKUP_DEVICES,
) -> LookupDevice | None:
    """Validates a device string once and maps it to `LookupDevice`."""
    if value is None or isinstance(value, LookupDevice):
        if isinstance(value, LookupDevice) and value.value not in allowed:
            raise ValueError(
                f"Invalid value for argument `{argument}`. Expected one of "
                f"{allowed}. Received: {argument}={value.value!r}"
            )
        return value
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(
            f"Invalid value for argument `{argument}`. Expected one of "
            f"{allowed}. Received: {argument}={value!r}"
        )
    return LookupDevice(value)


def resolve_lookup_device(
    column_device: LookupDevice | None,
    *,
    column: str,
    serving: bool,
    engine: bool,
    serving_override: LookupDevice | None = None,
    has_tensor_core_shape: bool = False,
) -> LookupDevice:
    """Where one column's lookup runs now.

    Serving: the layer's (or export's) serving device, else the column's,
    else the CPU; never the embedding engine. Training: the tensor core when
    the column asks for it; under `TPUStrategy` with an engine, the engine
    (a `"cpu"` column is an error there); elsewhere the default device.

    Args:
        column_device: The column's `embedding_lookup_device`.
        column: The column's name, for errors.
        serving: Whether a serving export is being traced.
        engine: Whether training runs under TPUStrategy with an embedding
            engine.
        serving_override: The layer's (or the export's) serving device.
        has_tensor_core_shape: Whether the column has `tensor_core_shape`.

    Returns:
        `CPU` for the sparse lookup on the default device, `TPU_TENSOR_CORE`
        for the dense XLA lookup, `TPU_EMBEDDING_CORE` for the engine.

    Raises:
        ValueError: the device is not valid for the phase, or the tensor
            core is asked for a column without `tensor_core_shape`.
    """
    if serving:
        device = serving_override or column_device or LookupDevice.CPU
        if device is LookupDevice.TPU_EMBEDDING_CORE:
            raise ValueError(
                f"Column '{column}' has embedding_lookup_device="
                "'tpu_embedding_core', which is not valid for serving. Set "
                "the layer's serving_lookup_device ('cpu' or "
                "'tpu_tensor_core') or export with lookup_device=..."
            )
        if device is LookupDevice.TPU_TENSOR_CORE and not has_tensor_core_shape:
            raise ValueError(
                f"Column '{column}' has no tensor_core_shape, so it cannot be "
                "served on 'tpu_tensor_core'. Give it tensor_core_shape="
                "[None, ids_per_example] or serve it on 'cpu'."
            )
        return device
    if column_device is LookupDevice.TPU_TENSOR_CORE:
        return LookupDevice.TPU_TENSOR_CORE
    if engine:
        if column_device is LookupDevice.CPU:
            raise ValueError(
                f"Column '{column}' has embedding_lookup_device='cpu', which "
                "is not valid for training under TPUStrategy. Use None, "
                "'tpu_embedding_core' or 'tpu_tensor_core'."
            )
        return LookupDevice.TPU_EMBEDDING_CORE
    return LookupDevice.CPU


class DeviceColumn(Protocol):
    """What the device rules read of an embedding column
    (`columns/embedding.py`, which imports this module)."""

    @property
    def name(self) -> str:
        """The column's name."""

    @property
    def lookup_device(self) -> LookupDevice | None:
        """The device it asks for; None for the default."""

    @property
    def is_sequence(self) -> bool:
        """Whether it is a sequence column."""

    @property
    def tensor_core_shape(self) -> tuple[int | None, int] | None:
        """`[batch, ids_per_example]` on the tensor core, if given."""


def has_tensor_core_width(column: DeviceColumn) -> bool:
    """Whether the column can look up on the tensor core: a sequence column
    is `max_sequence_length` wide, any other needs `tensor_core_shape`."""
    return column.is_sequence or column.tensor_core_shape is not None


class DeviceTable(Protocol):
    """What the device rules read of a table (`tables.TableSpec`)."""

    @property
    def name(self) -> str:
        """The table's name."""

    @property
    def columns(self) -> Sequence[DeviceColumn]:
        """The columns that read it; they agree on their device."""


def table_device(
    table: DeviceTable,
    *,
    serving: bool,
    serving_override: LookupDevice | None = None,
) -> LookupDevice:
    """`resolve_lookup_device` for a table off the TPU engine.

    `table` has `columns` (a `tables.TableSpec`); its columns agree on their
    device. The tensor core needs every non-sequence column to have a
    `tensor_core_shape` (sequence columns use `max_sequence_length`).
    """
    first = table.columns[0]
    return resolve_lookup_device(
        first.lookup_device,
        column=first.name,
        serving=serving,
        engine=False,
        serving_override=serving_override,
        has_tensor_core_shape=all(
            has_tensor_core_width(c) for c in table.columns
        ),
    )


def training_device(
    table: DeviceTable, hardware: EmbeddingHardware
) -> LookupDevice:
    """Where a table's lookups run in training, on `hardware`.

    `table` has `name` and `columns` (a `tables.TableSpec`); its columns
    agree on their device. On a TPU without an embedding engine (TPU v5e),
    the dense tensor-core lookup is the one that runs inside the TPU step,
    so embedding-core tables fall back to it, with a log line.

    Raises:
        ValueError: the device is not valid for training there, or a table
            must fall back to the tensor core but a column has no width.
    """
    first = table.columns[0]
    device = resolve_lookup_device(
        first.lookup_device,
        column=first.name,
        serving=False,
        engine=hardware is not EmbeddingHardware.NONE,
    )
    if device is not LookupDevice.TPU_EMBEDDING_CORE or hardware.has_engine:
        return device
    unshaped = [c.name for c in table.columns if not has_tensor_core_width(c)]
    if unshaped:
        raise ValueError(
            f"This TPU has no embedding engine (e.g. TPU v5e), so "
            f"table '{table.name}' must run on the tensor core, but "
            f"the columns {unshaped} have no tensor_core_shape. Give "
            "them tensor_core_shape=[None, ids_per_example], with "
            "ids_per_example at least the largest number of ids of "
            "one example (kte.profile_lookups(dataset, columns) "
            "reports it as max_ids_per_example)."
        )
    tf.get_logger().warning(
        "keras_tpu_embed: this TPU has no embedding engine; table "
        "'%s' falls back to the tensor-core lookup.",
        table.name,
    )
    return LookupDevice.TPU_TENSOR_CORE
