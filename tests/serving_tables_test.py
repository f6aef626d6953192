"""A layer's tables as one export serves them, held apart from the layer."""

import threading

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.backends import serving_tables
from tests import testing


def test_an_export_on_one_thread_leaves_another_threads_calls_alone():
    """While one thread traces an int8 export, the layer answers another
    thread's calls from its float32 tables (the export used to set its
    serving plan and int8 copies on the layer, which every thread read)."""
    layer = kte.TPUEmbeddingLayer([testing.identity_column()])
    ids = tf.constant([[3]], tf.int64)
    trained = layer(ids)["ids_embedding"].numpy()
    exporting, answered = threading.Event(), threading.Event()
    seen = {}

    def other_thread():
        exporting.wait()
        seen["answer"] = layer(ids)["ids_embedding"].numpy()
        seen["served"] = serving_tables.served(layer)
        answered.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with layer.serving_lookups(table_dtype="int8"):
        exporting.set()
        answered.wait()
        exported = layer(ids)["ids_embedding"].numpy()
    thread.join()
    np.testing.assert_array_equal(seen["answer"], trained)
    assert seen["served"] is None
    assert not np.allclose(exported, trained, atol=1e-7)


def test_the_serving_tables_are_the_layers_only_inside():
    layer = kte.TPUEmbeddingLayer([testing.identity_column()])
    layer(tf.constant([[1]], tf.int64))
    other = kte.TPUEmbeddingLayer([testing.identity_column()])
    assert serving_tables.served(layer) is None
    with layer.serving_lookups(table_dtype="bfloat16"):
        tables = serving_tables.served(layer)
        assert set(tables.copies) == {"ids"}
        assert tables.engine_lookups is None
        assert serving_tables.served(other) is None
    assert serving_tables.served(layer) is None


def test_a_failed_export_leaves_nothing_behind():
    layer = kte.TPUEmbeddingLayer([testing.identity_column()])
    layer(tf.constant([[1]], tf.int64))
    with pytest.raises(RuntimeError, match="boom"):
        with layer.serving_lookups(table_dtype="int8"):
            raise RuntimeError("boom")
    assert serving_tables.served(layer) is None
