"""What the package asks of a TPU embedding engine (`engines/engine.py`)."""

import inspect

import pytest

from keras_tpu_embed.engines import engine_registry
from keras_tpu_embed.engines.engine import Engine
from keras_tpu_embed.engines.engine import EngineTables
from keras_tpu_embed.placement.hardware import EmbeddingHardware


@pytest.mark.parametrize(
    "hardware", sorted(engine_registry.ENGINES, key=lambda h: h.value)
)
def test_every_registered_engine_is_an_engine(hardware):
    engine = engine_registry.ENGINES[hardware](hardware)
    assert isinstance(engine, Engine)
    assert engine.hardware is hardware


def _protocol_methods():
    return [
        name
        for name, member in vars(Engine).items()
        if not name.startswith("_") and callable(member)
    ]


@pytest.mark.parametrize(
    "hardware", sorted(engine_registry.ENGINES, key=lambda h: h.value)
)
def test_each_engine_takes_the_protocols_arguments(hardware):
    """`isinstance` checks names only; the arguments must match too, as
    every caller passes them by the protocol's names."""
    cls = engine_registry.ENGINES[hardware]
    methods = _protocol_methods()
    assert "register" in methods and "write_tables" in methods
    for name in methods:
        wanted = inspect.signature(getattr(Engine, name))
        got = inspect.signature(getattr(cls, name))
        assert list(got.parameters) == list(wanted.parameters), name


def test_engine_tables_reach_the_engine_only_through_the_protocol():
    """The layer's backend calls only what `Engine` declares, so any
    engine behind the protocol serves it."""
    source = inspect.getsource(EngineTables)
    called = {
        word.split("(")[0]
        for word in source.replace("engine.", " engine.").split()
        if word.startswith("engine.")
    }
    declared = {f"engine.{name}" for name in dir(Engine)}
    assert called and called <= declared, sorted(called - declared)


def test_an_engine_is_not_a_cpu_placement():
    assert not EmbeddingHardware.NONE.has_engine
    assert EmbeddingHardware.NONE not in engine_registry.ENGINES


def test_the_engines_are_siblings():
    """A new TPU generation is an engine of its own behind `Engine`, not a
    subclass of another generation's: what they share is `EngineStep`."""
    from keras_tpu_embed.engines.engine_step import EngineStep

    v1, sparse_core = (
        engine_registry.ENGINES[EmbeddingHardware.V1],
        engine_registry.ENGINES[EmbeddingHardware.V2],
    )
    assert not issubclass(sparse_core, v1) and not issubclass(v1, sparse_core)
    assert issubclass(v1, EngineStep) and issubclass(sparse_core, EngineStep)
