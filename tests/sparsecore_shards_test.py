"""A SparseCore table one SparseCore's rows at a time.

The layouts are TensorFlow's own stacking (`sparsecore_layout.
stacking_layouts`); the expected stacked arrays come from
`sparsecore_layout.restack_table` / `unstack_table` (checked against TF's
checkpoint adapter in `sparsecore_layout_test.py`) and the checkpoint
layout from TF's `tpu_embedding_v3_utils.shard_table`. The stacked
variable is a stand-in holding one `tf.Variable` per chip, as
`TPUEmbeddingShardedVariable.values` does.
"""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3_utils

from keras_tpu_embed.tables import initialization
from keras_tpu_embed.tables import sparsecore_layout
from keras_tpu_embed.tables import sparsecore_shards

E = tf.tpu.experimental.embedding


def _layouts():
    """Three tables of width 4 stacked on 2 chips of 4 SparseCores, with
    rows and widths that TF pads and rotated shards."""
    adagrad = E.Adagrad(0.1)
    tables = [
        E.TableConfig(10, 4, name="a", optimizer=adagrad),
        E.TableConfig(37, 4, name="b", optimizer=adagrad),
        E.TableConfig(21, 4, name="c", optimizer=adagrad),
    ]
    features = {
        f"f_{t.name}": E.FeatureConfig(t, output_shape=[8]) for t in tables
    }
    layouts = sparsecore_layout.stacking_layouts(features, 2, 4)
    assert any(layout.sparse_core_shard_rotation for layout in layouts.values())
    return layouts


def _table(layout, seed):
    shape = list(layout.unsharded_shape)
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _stacked(layout, value):
    rows = layout.num_sparse_cores * layout.total_rows_per_sparse_core_shard
    chips = np.split(
        np.asarray(value, np.float32).reshape(
            rows, layout.unsharded_padded_shape[1]
        ),
        layout.num_partitions,
    )
    return types.SimpleNamespace(values=[tf.Variable(chip) for chip in chips])


def _whole(variable):
    return np.concatenate([shard.numpy() for shard in variable.values])


def _zeros(layout):
    rows = layout.num_sparse_cores * layout.total_rows_per_sparse_core_shard
    return np.zeros([rows, layout.unsharded_padded_shape[1]], np.float32)


def test_core_rows_are_where_tensorflow_maps_each_row():
    for layout in _layouts().values():
        rows = np.arange(layout.unsharded_shape[0])
        core, position = tpu_embedding_v3_utils.map_indices_in_shard(
            layout.num_sparse_cores,
            layout.sparse_core_shard_row_offset,
            layout.sparse_core_shard_rotation,
            tf.constant(rows),
        )
        per_shard = layout.num_sparse_cores // layout.num_partitions
        size = layout.total_rows_per_sparse_core_shard
        for place in sparsecore_layout.core_rows(layout):
            held = rows[core.numpy() == place.core]
            assert (
                held.tolist()
                == list(
                    range(
                        place.first,
                        layout.unsharded_shape[0],
                        layout.num_sparse_cores,
                    )
                )[: len(held)]
            )
            assert place.shard == place.core // per_shard
            np.testing.assert_array_equal(
                position.numpy()[held] + (place.core % per_shard) * size,
                place.shard_row + np.arange(len(held)),
            )


def test_write_and_read_a_table_where_the_stack_keeps_it(monkeypatch):
    # Blocks of 3 rows: every SparseCore's rows take several blocks.
    monkeypatch.setattr(initialization, "BLOCK_BYTES", 3 * 4 * 8)
    layouts = _layouts()
    variable = _stacked(layouts["a"], _zeros(layouts["a"]))
    expected = _zeros(layouts["a"])
    for seed, name in enumerate("abc"):
        value = _table(layouts[name], seed)
        sparsecore_shards.write_table(
            variable, layouts[name], sparsecore_shards.ArrayRows(value)
        )
        expected = sparsecore_layout.restack_table(
            expected, value, layouts[name]
        )
    np.testing.assert_array_equal(_whole(variable), expected)
    for seed, name in enumerate("abc"):
        np.testing.assert_array_equal(
            sparsecore_shards.read_table(variable, layouts[name]),
            _table(layouts[name], seed),
        )


def test_a_write_leaves_the_other_tables_and_zeroes_the_padding():
    layouts = _layouts()
    before = np.arange(_zeros(layouts["a"]).size, dtype=np.float32)
    variable = _stacked(layouts["b"], before)
    value = _table(layouts["b"], 1)
    sparsecore_shards.write_table(
        variable, layouts["b"], sparsecore_shards.ArrayRows(value)
    )
    after = _whole(variable)
    for name in "ac":
        np.testing.assert_array_equal(
            sparsecore_layout.unstack_table(after, layouts[name]),
            sparsecore_layout.unstack_table(
                before.reshape(after.shape), layouts[name]
            ),
        )
    zeros = sparsecore_layout.restack_table(
        _zeros(layouts["b"]), np.zeros_like(value), layouts["b"]
    )
    padded = sparsecore_layout.restack_table(zeros, value, layouts["b"])
    # The table's region of every SparseCore: its rows, zeros elsewhere.
    for place in sparsecore_layout.core_rows(layouts["b"]):
        start = (
            place.shard * after.shape[0] // layouts["b"].num_partitions
            + place.shard_row
        )
        np.testing.assert_array_equal(
            after[start : start + place.count],
            padded[start : start + place.count],
        )


def test_a_table_of_another_shape_is_refused():
    layouts = _layouts()
    variable = _stacked(layouts["a"], _zeros(layouts["a"]))
    with pytest.raises(ValueError, match=r"\[11, 4\].*'a'.*\[10, 4\]"):
        sparsecore_shards.write_table(
            variable,
            layouts["a"],
            sparsecore_shards.ArrayRows(np.zeros([11, 4], np.float32)),
        )


def _padded(layout, value):
    rows, width = (int(d) for d in layout.unsharded_padded_shape)
    padded = np.zeros([rows, width], np.float32)
    padded[: value.shape[0], : value.shape[1]] = value
    return padded


def test_core_slices_are_tensorflows_internal_layout():
    layouts = _layouts()
    variable = _stacked(layouts["a"], _zeros(layouts["a"]))
    for seed, name in enumerate("abc"):
        sparsecore_shards.write_table(
            variable,
            layouts[name],
            sparsecore_shards.ArrayRows(_table(layouts[name], seed)),
        )
    for seed, name in enumerate("abc"):
        layout = layouts[name]
        internal = tpu_embedding_v3_utils.shard_table(
            layout.num_sparse_cores, _padded(layout, _table(layout, seed))
        ).numpy()
        internal = internal.reshape(sparsecore_layout.checkpoint_shape(layout))
        for place in sparsecore_layout.core_rows(layout):
            np.testing.assert_array_equal(
                sparsecore_shards.core_slice(variable, layout, place.core),
                internal[place.first : place.first + 1],
            )
        # And back: each SparseCore's slice where it was.
        copy = _stacked(layout, _zeros(layout))
        for place in sparsecore_layout.core_rows(layout):
            saved = internal[place.first : place.first + 1]
            sparsecore_shards.write_core(copy, layout, place.core, saved)
        np.testing.assert_array_equal(
            sparsecore_shards.read_table(copy, layout), _table(layout, seed)
        )


def test_the_initializer_answers_each_sparse_core_as_tf_asks():
    # TF's per-SparseCore call (`table_initialize_fn_non_batch`): the padded
    # shape, and shard_info of one SparseCore's rows.
    layouts = _layouts()
    layout = layouts["b"]
    value = _table(layout, 4)
    initializer = sparsecore_shards.SparseCoreInitializer("b")
    initializer.bind(layout, sparsecore_shards.ArrayRows(value))
    expected = sparsecore_layout.restack_table(_zeros(layout), value, layout)
    per_core = sparsecore_layout.rows_per_core(layout)
    width = layout.unsharded_padded_shape[1]
    size = layout.total_rows_per_sparse_core_shard
    for core in range(layout.num_sparse_cores):
        rows = initializer(
            list(layout.unsharded_padded_shape),
            tf.float32,
            shard_info=types.SimpleNamespace(
                shape=[per_core, width], offset=[core * per_core, 0]
            ),
        )
        start = core * size + layout.sparse_core_shard_row_offset
        np.testing.assert_array_equal(rows, expected[start : start + per_core])
    with pytest.raises(RuntimeError, match="one SparseCore's rows"):
        initializer(
            list(layout.unsharded_padded_shape),
            tf.float32,
            shard_info=types.SimpleNamespace(
                shape=[2 * per_core, width], offset=[0, 0]
            ),
        )


def test_initializer_rows_are_the_rows_of_the_one_device_table(monkeypatch):
    monkeypatch.setattr(initialization, "BLOCK_BYTES", 5 * 4 * 3)
    seeded = keras.initializers.RandomNormal(seed=4)
    matrix = np.arange(60, dtype=np.float32).reshape(20, 3)
    for initializer in (seeded, tf.constant_initializer(matrix)):
        rows = sparsecore_shards.InitializerRows(initializer, (20, 3))
        whole = np.asarray(initializer((20, 3), dtype="float32"))
        np.testing.assert_array_equal(rows.strided(3, 4, 4), whole[3:16:4])
        np.testing.assert_array_equal(rows.strided(0, 1, 20), whole)
    assert sparsecore_shards.makes_rows_alone(seeded)
    # A pretrained matrix is sliced by rows; an orthogonal draw is not.
    assert sparsecore_shards.makes_rows_alone(tf.constant_initializer(matrix))
    assert not sparsecore_shards.makes_rows_alone(
        keras.initializers.Orthogonal(seed=1)
    )


def test_checkpoint_rows_in_both_layouts(tmp_path, monkeypatch):
    monkeypatch.setattr(initialization, "BLOCK_BYTES", 2 * 4 * 4)
    layout = _layouts()["b"]
    value = _table(layout, 2)
    internal = tpu_embedding_v3_utils.shard_table(
        layout.num_sparse_cores, _padded(layout, value)
    ).numpy()
    internal = internal.reshape(sparsecore_layout.checkpoint_shape(layout))
    path = tf.train.Checkpoint(
        cpu=tf.Variable(value), sparse_core=tf.Variable(internal)
    ).write(str(tmp_path / "c"))
    key = "{}/.ATTRIBUTES/VARIABLE_VALUE".format
    sources = [
        sparsecore_shards.CheckpointRows(
            path, key("cpu"), value.shape, tf.float32
        ),
        sparsecore_shards.SparseCoreCheckpointRows(
            path, key("sparse_core"), value.shape, internal.shape, tf.float32
        ),
    ]
    n = layout.num_sparse_cores
    for rows in sources:
        np.testing.assert_array_equal(np.asarray(rows), value)
        np.testing.assert_array_equal(
            rows.strided(5, n, 2), value[5 : 5 + 2 * n : n]
        )
        np.testing.assert_array_equal(rows.strided(1, 3, 9), value[1:26:3])
    with pytest.raises(ValueError, match="cannot hold a table of shape"):
        sparsecore_shards.SparseCoreCheckpointRows(
            path, key("sparse_core"), [70, 4], internal.shape, tf.float32
        )
