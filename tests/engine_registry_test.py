"""One TPU embedding engine per strategy, picked by the hardware."""

import ast
import pathlib

import tensorflow as tf

import keras_tpu_embed
from keras_tpu_embed.engines import engine_registry
from keras_tpu_embed.engines.sparsecore.sparsecore_engine import (
    SparseCoreEngine,
)
from keras_tpu_embed.engines.v1.v1_engine import V1Engine
from keras_tpu_embed.placement.hardware import EmbeddingHardware

PACKAGE = pathlib.Path(keras_tpu_embed.__file__).parent


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts).removesuffix(".__init__")


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _package_imports(path):
    """The package modules `path` imports, at the top or in a function."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [
                f"{node.module}.{alias.name}" for alias in node.names
            ]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        imported.update(name for name in names if name in MODULES)
    # A package's __init__ is imported on the way to its modules; only the
    # modules themselves count.
    imported = {m for m in imported if not MODULES[m].name == "__init__.py"}
    imported.discard(_module_name(path))
    return imported


def test_no_circle_of_module_imports_in_the_package():
    """A circle of imports, even through a function's import, makes the
    import order decide what exists; the registry, which imports both
    engines, is where one would start (it was a rule of `lookup/`, now of
    every module)."""
    graph = {
        name: _package_imports(path)
        for name, path in MODULES.items()
        if path.name != "__init__.py"
    }
    assert len(graph) > 90
    circles = []

    def visit(name, path):
        for target in sorted(graph[name]):
            if target in path:
                circles.append(path[path.index(target) :] + [target])
            else:
                visit(target, path + [target])

    for name in sorted(graph):
        visit(name, [name])
    assert circles == []


def test_one_engine_per_strategy():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert engine_registry.registered_engine(strategy) is None
    first = engine_registry.engine_for(strategy, EmbeddingHardware.V1)
    assert engine_registry.engine_for(strategy, EmbeddingHardware.V1) is first
    assert engine_registry.registered_engine(strategy) is first
    other = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert engine_registry.engine_for(other, EmbeddingHardware.V1) is not first


def test_the_hardware_picks_the_engine():
    v1 = engine_registry.engine_for(
        tf.distribute.OneDeviceStrategy("/cpu:0"), EmbeddingHardware.V1
    )
    v2 = engine_registry.engine_for(
        tf.distribute.OneDeviceStrategy("/cpu:0"), EmbeddingHardware.V2
    )
    assert type(v1) is V1Engine
    assert type(v2) is SparseCoreEngine


def test_the_engine_falls_back_to_its_strategys_one_dataset_batch():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    engine_registry.note_dataset_batch(strategy, 8)
    engine = engine_registry.engine_for(strategy, EmbeddingHardware.V1)
    assert engine.dataset_batch() == 8
    # Noted after the engine was made, as a second dataset may be.
    engine_registry.note_dataset_batch(strategy, 4)
    assert engine.dataset_batch() is None  # two batches: none is the one
    other = engine_registry.engine_for(
        tf.distribute.OneDeviceStrategy("/cpu:0"), EmbeddingHardware.V1
    )
    assert other.dataset_batch() is None


def test_every_hardware_with_an_engine_has_one_registered():
    with_engine = {h for h in EmbeddingHardware if h.has_engine}
    assert set(engine_registry.ENGINES) == with_engine
