"""The embedding layers' own variables in a `.keras` file, by name."""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.backends import layer_variables
from tests import testing


def _built(key):
    layer = kte.TPUEmbeddingLayer([testing.identity_column(key)])
    layer(tf.constant([[1]], tf.int64))
    return layer


def test_variables_are_stored_and_loaded_by_name():
    source = _built("a")
    store = {}
    layer_variables.save_layer_variables(source, store)
    assert {"a", "embedding_step", "table_update_trigger"} <= set(store)
    target = _built("a")
    assert layer_variables.load_layer_variables(target, store)
    np.testing.assert_array_equal(target.table_variable("a"), store["a"])


def test_positional_files_and_other_tables_are_told_apart():
    layer = _built("a")
    assert not layer_variables.load_layer_variables(layer, {"0": 1, "1": 2})
    store = {}
    layer_variables.save_layer_variables(layer, store)
    other = _built("b")
    with pytest.raises(ValueError, match="differ in name or shape"):
        layer_variables.load_layer_variables(other, store)
