"""One TPU embedding engine per strategy, V1 or SparseCore by the hardware.

A TPU system has one embedding engine, so every layer built under one
strategy is served by the same engine object: `engine_for` makes it at the
first layer's build (the engine `ENGINES` names for the hardware: a
`V1Engine` for `TPUEmbedding`, a `SparseCoreEngine` for `TPUEmbeddingV2`)
and hands it to every later one; `registered_engine` is how
`kte.distribute_dataset` finds it. The per-replica batches of the
strategy's datasets (`note_dataset_batch`) are kept here too, shared with
the strategy's engine, which falls back to them when a step's inputs
arrive with an unknown batch.
"""

from __future__ import annotations

import weakref
from typing import Any
from typing import Callable
from typing import Mapping

from keras_tpu_embed.engines.engine import Engine
from keras_tpu_embed.engines.sparsecore.sparsecore_engine import (
    SparseCoreEngine,
)
from keras_tpu_embed.engines.v1.v1_engine import V1Engine
from keras_tpu_embed.placement.hardware import EmbeddingHardware

ENGINES: Mapping[EmbeddingHardware, Callable[..., Engine]] = {
    EmbeddingHardware.V1: V1Engine,
    EmbeddingHardware.V2: SparseCoreEngine,
}
"""The engine of each kind of embedding hardware: a new TPU generation
is an engine behind `engine.Engine` and an entry here."""

_ENGINES: weakref.WeakKeyDictionary[Any, Engine] = weakref.WeakKeyDictionary()

# strategy -> the per-replica batches `kte.distribute_dataset` cut for it.
_DATASET_BATCHES: weakref.WeakKeyDictionary[Any, set[int]] = (
    weakref.WeakKeyDictionary()
)


def _dataset_batches(strategy: Any) -> set[int]:
    """The batches noted for `strategy`, one set shared with its engine."""
    try:
        return _DATASET_BATCHES.setdefault(strategy, set())
    except TypeError:
        # Not weakly referenceable (a stand-in strategy): nothing recorded,
        # so an unknown batch stays the error that names the fix.
        return set()


def note_dataset_batch(strategy: Any, per_replica_batch: int) -> None:
    """Records a static per-replica batch a dataset of `strategy` has.

    The engine falls back to it when a step's inputs arrive with an unknown
    batch (`steps_per_execution > 1`, `engine_checks.set_static_batch`).
    """
    _dataset_batches(strategy).add(per_replica_batch)


def registered_engine(strategy: Any) -> Engine | None:
    """The engine of `strategy`, if a layer registered with it."""
    return _ENGINES.get(strategy)


def engine_for(strategy: Any, hardware: EmbeddingHardware) -> Engine:
    """The one engine of `strategy`'s TPU system.

    Args:
        strategy: The strategy the layer is built under.
        hardware: Its TPU's embedding hardware, which picks the engine
            (`ENGINES`).

    Returns:
        The engine made for `strategy` at its first call.
    """
    engine = _ENGINES.get(strategy)
    if engine is None:
        engine = ENGINES[hardware](
            hardware, dataset_batches=_dataset_batches(strategy)
        )
        _ENGINES[strategy] = engine
    return engine
