"""The registry hands layers their backends; one engine per strategy."""

import inspect

import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.lookup import registry
from keras_tpu_embed.lookup.backend import Activations
from keras_tpu_embed.lookup.backend import Phase
from keras_tpu_embed.lookup.backend import TableBackend
from keras_tpu_embed.lookup.devices import LookupDevice
from keras_tpu_embed.tpu.hardware import EmbeddingHardware


def test_one_engine_per_strategy():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert registry.registered_engine(strategy) is None
    first = registry.engine_for(strategy, EmbeddingHardware.V1)
    assert registry.engine_for(strategy, EmbeddingHardware.V1) is first
    assert registry.registered_engine(strategy) is first
    other = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert registry.engine_for(other, EmbeddingHardware.V1) is not first


def test_backends_answer_the_protocol():
    wanted = inspect.signature(TableBackend.activations)
    for backend in (registry.LocalTables, registry.EngineTables):
        got = inspect.signature(backend.activations)
        assert list(got.parameters) == list(wanted.parameters)


def test_local_tables_answer_activations_for_every_column():
    item = kte.categorical_column_with_identity("item", 10)
    layer = kte.TPUEmbeddingLayer([kte.embedding_column(item, 4)])
    layer.build()
    local = layer._local
    phase = Phase(
        training=False, serving=False, devices={"item": LookupDevice.CPU}
    )
    answer = local.activations({"item": tf.constant([[1, 2]])}, phase)
    assert isinstance(answer, Activations)
    assert sorted(answer.values) == ["item_embedding"]
    table = layer.table_variable("item").numpy()
    np.testing.assert_allclose(
        answer.values["item_embedding"], [(table[1] + table[2]) / 2]
    )
