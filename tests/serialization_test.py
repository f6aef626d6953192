"""Every class that appears in a config is registered, one way."""

import inspect
import json

import keras
import pytest

import keras_tpu_embed as kte
from keras_tpu_embed import columns
from keras_tpu_embed import optimizers
from keras_tpu_embed.serialization import serializable
from tests import testing

CONFIG_CLASSES = [
    kte.TPUEmbeddingLayer,
    kte.SharedTPUEmbedding,
    kte.FeaturePreprocessor,
    kte.EmbeddingConfig,
    columns.IdentityColumn,
    columns.VocabularyListColumn,
    columns.VocabularyFileColumn,
    columns.HashedColumn,
    columns.WeightedColumn,
    columns.EmbeddingColumn,
    columns.SharedEmbeddingColumn,
    *optimizers.SUPPORTED_OPTIMIZERS,
]


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda c: c.__name__)
def test_registered_under_the_package_name(cls):
    name = f"keras_tpu_embed>{cls.__name__}"
    assert keras.saving.get_registered_name(cls) == name
    assert keras.saving.get_registered_object(name) is cls


def test_every_public_class_with_a_config_is_listed():
    public = [getattr(kte, n) for n in kte.__all__]
    public += [getattr(optimizers, n) for n in optimizers.__all__]
    with_config = {
        c
        for c in public
        if inspect.isclass(c)
        and hasattr(c, "get_config")
        and c is not optimizers.EmbeddingOptimizer
    }
    assert with_config <= set(CONFIG_CLASSES)


def test_serializable_registers_a_new_class():
    @serializable
    class Probe:
        def get_config(self):
            return {}

    assert keras.saving.get_registered_name(Probe) == "keras_tpu_embed>Probe"


# Loads a `.keras` file with Keras alone; prints the outcome as JSON.
LOAD_SCRIPT = """
import json, sys
import keras
try:
    keras.models.load_model(sys.argv[1])
    outcome = {"loaded": True, "error": ""}
except Exception as error:
    outcome = {"loaded": False, "error": str(error)}
outcome["imported"] = "keras_tpu_embed" in sys.modules
print(json.dumps(outcome))
"""


@pytest.mark.slow
def test_keras_file_loads_or_names_the_import_without_the_package(tmp_path):
    """Keras 3 imports a registered class's module only for keras and
    keras_hub/cv/nlp (`serialization_lib._retrieve_class_or_fn`), so a
    process that never imported the package cannot find the layers; the
    error gave Keras' generic advice, the package only deep inside a
    config dump. It must name the import to add."""
    item = kte.categorical_column_with_identity("item", 10)
    inputs = kte.FeaturePreprocessor([kte.embedding_column(item, 2)])
    inputs = inputs.keras_inputs()
    layer = kte.TPUEmbeddingLayer([kte.embedding_column(item, 2)])
    model = keras.Model(inputs, layer(inputs)["item_embedding"])
    path = str(tmp_path / "m.keras")
    model.save(path)
    # cwd: tmp_path, so that the fresh process cannot find the package.
    completed = testing.run_python(
        "-c", LOAD_SCRIPT, path, cwd=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3"
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    outcome = json.loads(completed.stdout.strip().splitlines()[-1])
    assert not outcome["imported"]
    if not outcome["loaded"]:
        head = outcome["error"][:1200]
        assert "`import keras_tpu_embed`" in head, head


# The `module` Keras writes next to each registered class in a `.keras`
# config (`serialization_lib.serialize_keras_object`). Loading resolves the
# registered name, but a module that moves would change every new file's
# `config.json`: the modules that define these classes stay where they are.
CONFIG_MODULES = {
    "TPUEmbeddingLayer": "keras_tpu_embed.layers",
    "SharedTPUEmbedding": "keras_tpu_embed.shared_layer",
    "FeaturePreprocessor": "keras_tpu_embed.preprocessing.feature_preprocessor",
    "EmbeddingConfig": "keras_tpu_embed.config",
    "IdentityColumn": "keras_tpu_embed.columns.categorical",
    "VocabularyListColumn": "keras_tpu_embed.columns.categorical",
    "VocabularyFileColumn": "keras_tpu_embed.columns.categorical",
    "HashedColumn": "keras_tpu_embed.columns.categorical",
    "WeightedColumn": "keras_tpu_embed.columns.categorical",
    "EmbeddingColumn": "keras_tpu_embed.columns.embedding",
    "SharedEmbeddingColumn": "keras_tpu_embed.columns.embedding",
    "SGD": "keras_tpu_embed.optimizers.sgd",
    "Adagrad": "keras_tpu_embed.optimizers.adagrad",
    "AdagradMomentum": "keras_tpu_embed.optimizers.adagrad",
    "Adam": "keras_tpu_embed.optimizers.adam",
    "FTRL": "keras_tpu_embed.optimizers.ftrl",
}


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda c: c.__name__)
def test_the_module_a_keras_file_names_stays(cls):
    assert cls.__module__ == CONFIG_MODULES[cls.__name__]


def test_a_layer_config_names_the_pinned_modules():
    """What a `.keras` file really holds, read from a serialized layer."""
    item = kte.categorical_column_with_identity("item", 10)
    config = kte.EmbeddingConfig(optimizer=optimizers.SGD(0.1))
    layer = kte.TPUEmbeddingLayer([kte.embedding_column(item, 2)], config)
    serialized = keras.saving.serialize_keras_object(layer)
    found = set()

    def walk(value):
        if isinstance(value, dict):
            if "module" in value and "registered_name" in value:
                found.add((value["registered_name"], value["module"]))
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(serialized)
    ours = {(n, m) for n, m in found if n and n.startswith("keras_tpu_embed>")}
    assert {n.split(">")[1] for n, _ in ours} >= {
        "TPUEmbeddingLayer",
        "EmbeddingConfig",
        "SGD",
        "IdentityColumn",
        "EmbeddingColumn",
    }
    for name, module in ours:
        assert CONFIG_MODULES[name.split(">")[1]] == module
