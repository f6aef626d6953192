"""One TPU embedding engine per strategy, picked by the hardware."""

import ast
import pathlib

import tensorflow as tf

import keras_tpu_embed
from keras_tpu_embed.lookup import engine_registry
from keras_tpu_embed.lookup.embedding_core import SharedEngine
from keras_tpu_embed.lookup.sparsecore import SparseCoreEngine
from keras_tpu_embed.placement.hardware import EmbeddingHardware

LOOKUP = pathlib.Path(keras_tpu_embed.__file__).parent / "lookup"


def _lookup_imports(path):
    """The `lookup/` modules `path` imports, at the top or in a function."""
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
        for name in names:
            prefix = "keras_tpu_embed.lookup."
            stem = name[len(prefix) :].split(".")[0]
            if name.startswith(prefix) and (LOOKUP / f"{stem}.py").exists():
                imported.add(stem)
    imported.discard(path.stem)
    return imported


def test_lookup_modules_import_each_other_without_a_circle():
    graph = {p.stem: _lookup_imports(p) for p in LOOKUP.glob("*.py")}
    circles = []

    def visit(stem, path):
        for target in sorted(graph[stem]):
            if target in path:
                circles.append(path[path.index(target) :] + [target])
            else:
                visit(target, path + [target])

    for stem in sorted(graph):
        visit(stem, [stem])
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
    assert type(v1) is SharedEngine
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
