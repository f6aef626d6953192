"""Lookup devices: the strings users pass, and the enum the package uses."""

from __future__ import annotations

import enum


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
