"""Every class that appears in a config is registered, one way."""

import inspect

import keras
import pytest

import keras_tpu_embed as kte
from keras_tpu_embed import columns
from keras_tpu_embed import optimizers
from keras_tpu_embed.serialization import serializable

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
