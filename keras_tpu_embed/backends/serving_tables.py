"""A layer's tables as one serving export reads them, held apart from the layer.

An export traces the training layer with other devices (the serving plan)
and other tables: quantized copies of the layer's own (`bfloat16`, `int8`)
and copies of the TPU engine's, read from the chip a block of rows at a
time and looked up as tables the layer holds. `ServingTables` owns all of
that for one export; `serving(layer, tables)` makes it the layer's for the
calls traced inside, in a `ContextVar`. The layer itself is not changed:
an export traced on one thread leaves a training step on another as it
was, and an export that fails leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any
from typing import Iterator
from typing import Mapping
from typing import Protocol
from typing import Sequence

from keras_tpu_embed.backends.local_tables import LocalTables
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.placement.device_plan import DevicePlan
from keras_tpu_embed.tables.quantization import quantized_copies
from keras_tpu_embed.tables.table_specs import TableSpec


class EngineCopies(Protocol):
    """What serving asks of a layer's tables on the TPU engine
    (`engines.engine.EngineTables`)."""

    table_names: list[str]

    @property
    def raw_features(self) -> dict[str, Any]: ...

    def serving_tables(self, table_dtype: str) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class ServingTables:
    """One export's view of a layer's tables.

    Attributes:
        plan: Each table's serving device.
        copies: Per table name, what the export reads instead of the
            layer's variable: a quantized copy of a table the layer holds,
            or a copy of an engine table. Float32 tables the layer holds
            are read as they are.
        engine_lookups: The engine's tables looked up on the export's
            devices as tables the layer holds (from `copies`), or None
            without an engine.
    """

    plan: DevicePlan
    copies: Mapping[str, Any]
    engine_lookups: LocalTables | None

    @classmethod
    def from_layer_tables(
        cls,
        layer: str,
        plan: DevicePlan,
        own: Mapping[str, Any],
        engine: EngineCopies | None,
        specs: Sequence[TableSpec],
        config: EmbeddingConfig,
        return_sequence_lengths: bool,
        table_dtype: str,
    ) -> ServingTables:
        """The serving tables of a layer.

        Args:
            layer: The layer's kind and name, for errors.
            plan: Its serving devices (`DevicePlan.with_serving_device`).
            own: Per table name, the variables of the tables it holds.
            engine: Its tables on the TPU engine, or None.
            specs: Every table of the layer.
            config: The layer's config.
            return_sequence_lengths: The layer's argument of that name.
            table_dtype: `"float32"`, `"bfloat16"` or `"int8"`.

        Raises:
            ValueError: raw `feature_to_config_dict` entries on the engine
                (no column serves them), or a table with NaN or inf values.
        """
        copies: dict[str, Any] = dict(quantized_copies(dict(own), table_dtype))
        if engine is None:
            return cls(plan, copies, None)
        if engine.raw_features:
            raise ValueError(
                f"{layer} cannot be exported: its "
                "EmbeddingConfig.feature_to_config_dict features "
                f"{sorted(engine.raw_features)} exist only on the TPU "
                "embedding engine, with no column to serve them on the CPU. "
                "Declare them as columns (kte.embedding_column) to export."
            )
        by_name = {spec.name: spec for spec in specs}
        lookups = LocalTables(
            [by_name[name] for name in engine.table_names],
            config,
            return_sequence_lengths,
        )
        copies.update(engine.serving_tables(table_dtype))
        return cls(plan, copies, lookups)


# Per layer (by `id`), the serving tables of the export being traced in
# this thread or task.
_SERVED: contextvars.ContextVar[Mapping[int, ServingTables]] = (
    contextvars.ContextVar("keras_tpu_embed_serving_tables", default={})
)


@contextlib.contextmanager
def serving(layer: object, tables: ServingTables) -> Iterator[None]:
    """Inside, `layer`'s calls (in this thread or task) serve `tables`."""
    token = _SERVED.set({**_SERVED.get(), id(layer): tables})
    try:
        yield
    finally:
        _SERVED.reset(token)


def served(layer: object) -> ServingTables | None:
    """The serving tables `layer` is traced with here, or None."""
    return _SERVED.get().get(id(layer))
