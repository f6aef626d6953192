"""Tables on parameter servers: TF's "div" layout, each shard's rows
those of the one-device table, saved under a one-device table's key.

The shards here are local variables (the strategy's creator is the
default one); `parameter_server_test.py` makes them on real servers.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte  # noqa: F401  (loads the backend first)
from keras_tpu_embed.parameter_server.sharded_tables import ShardedTable
from keras_tpu_embed.parameter_server.sharded_tables import is_sharded
from keras_tpu_embed.parameter_server.sharded_tables import shard_layout
from keras_tpu_embed.tables.initialization import EngineInitializer


@pytest.mark.parametrize("rows, shards", [(10, 3), (7, 2), (2, 3), (5, 1)])
def test_the_layout_is_the_one_tfs_sharded_scatters_accept(rows, shards):
    layout = shard_layout((rows, 2), shards)
    parts = [tf.Variable(tf.zeros(s.shape)) for s in layout]
    table = tf.__internal__.distribute.ShardedVariable(parts)
    values = np.arange(rows * 2, dtype="f4").reshape(rows, 2)
    # TF raises NotImplementedError for any layout but its "div" one.
    table.scatter_update(tf.IndexedSlices(values, tf.range(rows)))
    np.testing.assert_array_equal(tf.convert_to_tensor(table), values)
    assert [s.offset[0] for s in layout] == list(
        np.cumsum([0] + [s.shape[0] for s in layout])[:-1]
    )


def _table(initializer, shape=(11, 3), shards=2):
    return ShardedTable(
        shard_layout(shape, shards),
        EngineInitializer(initializer, table="item"),
        tf.distribute.get_strategy(),
        initializer=keras.initializers.Zeros(),
        shape=shape,
        dtype="float32",
        trainable=False,
        autocast=False,
        name="item",
    )


def test_each_shard_holds_the_one_device_tables_rows():
    initializer = keras.initializers.RandomUniform(-1.0, 1.0, seed=7)
    table = _table(initializer)
    assert is_sharded(table) and len(table.value.variables) == 2
    whole = EngineInitializer(initializer)((11, 3), "float32")
    np.testing.assert_array_equal(
        tf.concat(table.value.variables, 0).numpy(), whole.numpy()
    )


def test_a_sharded_table_saves_under_a_one_device_tables_key(tmp_path):
    table = _table(keras.initializers.RandomNormal(seed=2))
    path = tf.train.Checkpoint(item=table).save(tmp_path / "ckpt")
    keys = [k for k, _ in tf.train.list_variables(path) if "item" in k]
    assert keys == ["item/.ATTRIBUTES/VARIABLE_VALUE"]
    one = tf.Variable(tf.zeros((11, 3)))
    tf.train.Checkpoint(item=one).restore(path).assert_consumed()
    np.testing.assert_array_equal(
        one.numpy(), tf.concat(table.value.variables, 0).numpy()
    )
    # And back: a one-device table restores into the shards.
    one.assign(tf.ones((11, 3)))
    path = tf.train.Checkpoint(item=one).save(tmp_path / "back")
    tf.train.Checkpoint(item=table).restore(path).assert_consumed()
    np.testing.assert_array_equal(
        tf.concat(table.value.variables, 0).numpy(), np.ones((11, 3))
    )


def test_a_plain_variable_is_not_sharded():
    assert not is_sharded(tf.Variable(tf.zeros((2, 2))))
    assert not is_sharded(keras.Variable(np.zeros((2, 2), "f4")))
