"""The embedding layers' arguments as a Keras config, and back."""

import json

import keras

import keras_tpu_embed as kte
from keras_tpu_embed import layer_config
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.serialization import LOAD_HINT_KEY


def _columns():
    vocabulary = kte.categorical_column_with_vocabulary_list(
        "country", ["de", "fr", "us"]
    )
    return [
        kte.embedding_column(
            kte.categorical_column_with_identity("item_id", 10), 4
        ),
        kte.embedding_column(vocabulary, 2, combiner="sum"),
    ]


def _serialized(columns):
    # Initializers compare by identity: compare what Keras stores instead.
    return [keras.saving.serialize_keras_object(c) for c in columns]


def test_arguments_round_trip_through_json():
    columns = _columns()
    config = kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1))
    saved = layer_config.layer_config(
        {"name": "embed", "trainable": True},
        columns,
        config,
        LookupDevice.TPU_TENSOR_CORE,
        "concat",
        True,
    )
    arguments = layer_config.layer_arguments(json.loads(json.dumps(saved)))
    assert _serialized(arguments["columns"]) == _serialized(columns)
    assert arguments["config"].optimizer.get_config() == (
        config.optimizer.get_config()
    )
    assert arguments["serving_lookup_device"] == "tpu_tensor_core"
    assert arguments["output"] == "concat"
    assert arguments["return_sequence_lengths"] is True
    assert arguments["name"] == "embed"
    assert LOAD_HINT_KEY in saved
    assert LOAD_HINT_KEY not in arguments


def test_a_layer_rebuilt_from_its_config_has_the_same_config():
    layer = kte.TPUEmbeddingLayer(
        _columns(), serving_lookup_device="cpu", output="concat"
    )
    rebuilt = kte.TPUEmbeddingLayer.from_config(layer.get_config())
    assert rebuilt.get_config() == layer.get_config()
    assert _serialized(rebuilt.columns) == _serialized(layer.columns)
    assert rebuilt.serving_lookup_device is LookupDevice.CPU
