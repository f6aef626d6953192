"""Initializers on the emulated pod (2 hosts x 2 replicas, V1 engine).

TensorFlow's `TPUEmbedding` creates each table under its sharded variable
creator, calling the table's initializer once per host, on that host, for
that host's rows. Each host must make its rows alone (never the whole
table) and they must be the rows one device makes, for every generated
initializer kind (`tests/initializer_cases.py`); an initializer that makes
only whole tables is refused on a large sharded table.
"""

import functools
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v2
from tensorflow.python.tpu import tpu_embedding_v2_utils

import keras_tpu_embed as kte
from keras_tpu_embed.tables import initialization
from keras_tpu_embed.testing import emulated_tpu
from tests import initializer_cases as cases
from tests.emulated import models

HOSTS = 2
REPLICAS = 4
SHAPE = (1003, 5)  # odd rows: the shards differ by one row


def _column(initializer, shape):
    return kte.embedding_column(
        kte.categorical_column_with_identity("item", shape[0]),
        shape[1],
        initializer=initializer,
    )


def _one_device(column):
    layer = kte.TPUEmbeddingLayer([column])
    layer.build()
    return layer.table_variable("item").numpy()


def _engine_table(strategy, column):
    """The engine's table after TF built it (at the first step)."""
    model, values = models.item_engine_values(strategy, column)
    layer = model.get_layer("embed")
    shards = layer.engine.mid_level._variables["item"]["parameters"].variables
    assert len(shards) == HOSTS
    return values["item"]


def test_a_glorot_table_is_made_per_shard_on_two_hosts(monkeypatch):
    """Issue 39: each host drew the whole table and kept its slice (which
    pinned the whole draw)."""
    column = _column(keras.initializers.GlorotUniform(seed=3), SHAPE)
    one_device = _one_device(column)
    shapes = cases.recording_calls(monkeypatch, column.initializer)
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        table = _engine_table(strategy, column)
    assert SHAPE not in shapes, shapes
    np.testing.assert_array_equal(table, one_device)


def _shards_on_the_pod(strategy, initializer, shape):
    """TF's own sharded creator on the pod's hosts, as `TPUEmbedding`
    creates a table (`_create_variables_and_slots`)."""
    hosts = tpu_embedding_v2_utils.get_list_of_hosts(strategy)
    creator = tpu_embedding_v2.make_sharded_variable_creator(hosts)
    with tf.variable_creator_scope(creator):
        variable = tf.Variable(
            name="table",
            initial_value=functools.partial(
                initializer, shape, dtype=tf.float32
            ),
            shape=shape,
            dtype=tf.float32,
            trainable=False,
        )
    assert [shard.device for shard in variable.variables] == hosts
    return [shard.numpy() for shard in variable.variables]


@pytest.fixture
def pod():
    """A new TPU strategy per test: one engine per strategy."""
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        yield strategy


@pytest.mark.parametrize("name", sorted(cases.DETERMINISTIC))
def test_every_kind_makes_the_one_device_rows_on_each_host(
    name, pod, monkeypatch
):
    monkeypatch.setattr(initialization, "BLOCK_BYTES", 4 * 5 * 37)
    column = _column(cases.DETERMINISTIC[name](SHAPE), SHAPE)
    one_device = _one_device(column)
    engine = kte.to_tpu_feature_configs([column])[column.name].table
    if cases.makes_rows_alone(name):
        shapes = cases.recording_calls(monkeypatch, column.initializer)
    shards = _shards_on_the_pod(pod, engine.initializer, SHAPE)
    assert [len(shard) for shard in shards] == [502, 501]
    np.testing.assert_array_equal(np.concatenate(shards), one_device)
    if cases.makes_rows_alone(name):
        assert SHAPE not in shapes, shapes


@pytest.mark.parametrize("name", sorted(cases.PRETRAINED))
def test_pretrained_tables_on_two_hosts(name, pod):
    """Issue 41, item 7: each host takes its rows of the matrix."""
    shape = (8200, 128)  # larger than one block of the fill
    assert shape[0] * shape[1] * 4 > initialization.BLOCK_BYTES
    table = _engine_table(pod, _column(cases.PRETRAINED[name](shape), shape))
    np.testing.assert_array_equal(table, cases.pretrained_values(name, shape))


def test_orthogonal_is_refused_on_a_large_sharded_table(monkeypatch):
    """Its rows depend on each other (a QR factorization): each host would
    make the whole table to keep its shard."""
    column = _column(keras.initializers.Orthogonal(seed=3), SHAPE)
    # Below the limit each host makes the whole table: the one-device rows.
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        table = _engine_table(strategy, column)
    np.testing.assert_array_equal(table, _one_device(column))
    limit = SHAPE[0] * SHAPE[1] * 4 - 1
    monkeypatch.setattr(
        initialization, "WHOLE_TABLE_LIMIT_BYTES", limit, raising=False
    )
    message = re.escape(
        "Table 'item' (columns item_embedding) of shape (1003, 5) (20060 "
        "bytes) is sharded over the TPU hosts, but its initializer "
        "keras.initializers.Orthogonal makes the table as a whole"
    )
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        with pytest.raises(ValueError, match=message):
            _engine_table(strategy, column)
