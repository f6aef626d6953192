"""SparseCore's stacked, sharded tables <-> the per-table CPU layout.

The layouts are TensorFlow's own (`tpu_embedding_v3.py`,
`_stack_tables_with_same_table_dim_and_optimizer`, run on CPU); the
expected stacked arrays are built by hand from the layout TF documents in
`tpu_embedding_v3_utils.map_indices_in_shard`, or by TF's checkpoint
adapter (`tpu_embedding_v3_checkpoint_adapter._shard_from_cpu_to_sc`).
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3_checkpoint_adapter

from keras_tpu_embed.tables import sparsecore_layout

E = tf.tpu.experimental.embedding


def _layouts(tables, samples, partitions, cores_per_partition):
    features = {
        f"f_{t.name}": E.FeatureConfig(t, output_shape=[samples])
        for t in tables
    }
    return sparsecore_layout.stacking_layouts(
        features, partitions, cores_per_partition
    )


def _table(rows, dim, seed):
    return (
        np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    )


def test_two_stacked_tables_against_a_hand_built_array():
    sgd = E.SGD(0.1)
    layouts = _layouts(
        [
            E.TableConfig(3, 2, name="a", optimizer=sgd),
            E.TableConfig(5, 2, name="b", optimizer=sgd),
        ],
        samples=4,
        partitions=1,
        cores_per_partition=2,
    )
    a, b = layouts["a"], layouts["b"]
    # What TF decided (the hand-built array below depends on it).
    assert a.stacked_table_name == b.stacked_table_name == "a_b"
    assert a.num_sparse_cores == 2 and a.total_rows_per_sparse_core_shard == 16
    assert list(a.unsharded_padded_shape) == [16, 8]
    assert a.sparse_core_shard_row_offset == 0
    assert b.sparse_core_shard_row_offset == 8
    assert a.sparse_core_shard_rotation == b.sparse_core_shard_rotation == 0
    table_a, table_b = _table(3, 2, 0), _table(5, 2, 1)
    # Row r of a table is on SparseCore r % 2 (shard rows 0-15, 16-31), at
    # row offset + r // 2 of that shard; the width is padded to 8.
    expected = np.zeros([32, 8], np.float32)
    expected[0, :2], expected[16, :2], expected[1, :2] = table_a
    (
        expected[8, :2],
        expected[24, :2],
        expected[9, :2],
        expected[25, :2],
        expected[10, :2],
    ) = table_b
    stacked = np.zeros([32, 8], np.float32)
    stacked = sparsecore_layout.restack_table(stacked, table_a, a)
    stacked = sparsecore_layout.restack_table(stacked, table_b, b)
    np.testing.assert_array_equal(stacked, expected)
    np.testing.assert_array_equal(
        sparsecore_layout.unstack_table(expected, a), table_a
    )
    np.testing.assert_array_equal(
        sparsecore_layout.unstack_table(expected, b), table_b
    )


def test_rotated_shards_against_tensorflows_checkpoint_adapter():
    adagrad = E.Adagrad(0.1)
    tables = [
        E.TableConfig(10, 4, name="a", optimizer=adagrad),
        E.TableConfig(37, 4, name="b", optimizer=adagrad),
        E.TableConfig(21, 4, name="c", optimizer=adagrad),
    ]
    layouts = _layouts(tables, samples=8, partitions=2, cores_per_partition=4)
    stack = [layouts[name] for name in ("a", "b", "c")]
    assert {layout.stacked_table_name for layout in stack} == {"a_b_c"}
    assert any(layout.sparse_core_shard_rotation for layout in stack)
    values = [_table(t.vocabulary_size, t.dim, i) for i, t in enumerate(tables)]
    rows = stack[0].num_sparse_cores * stack[0].total_rows_per_sparse_core_shard
    width = stack[0].unsharded_padded_shape[1]
    ordered = sorted(
        zip(stack, values), key=lambda p: p[0].sparse_core_shard_row_offset
    )
    tensorflows = tpu_embedding_v3_checkpoint_adapter._shard_from_cpu_to_sc(
        [tf.constant(v) for _, v in ordered],
        f"{rows} {width} 0,{rows}:0,{width}",
        [layout for layout, _ in ordered],
    ).numpy()
    ours = np.zeros([rows, width], np.float32)
    for layout, value in zip(stack, values):
        ours = sparsecore_layout.restack_table(ours, value, layout)
    np.testing.assert_array_equal(ours, tensorflows)
    for layout, value in zip(stack, values):
        np.testing.assert_array_equal(
            sparsecore_layout.unstack_table(ours, layout), value
        )


def test_restack_keeps_the_other_tables_and_the_padding():
    sgd = E.SGD(0.1)
    layouts = _layouts(
        [
            E.TableConfig(3, 2, name="a", optimizer=sgd),
            E.TableConfig(5, 2, name="b", optimizer=sgd),
        ],
        samples=4,
        partitions=1,
        cores_per_partition=2,
    )
    before = np.arange(32 * 8, dtype=np.float32).reshape(32, 8)
    after = sparsecore_layout.restack_table(
        before, _table(3, 2, 2), layouts["a"]
    )
    np.testing.assert_array_equal(
        sparsecore_layout.unstack_table(after, layouts["b"]),
        sparsecore_layout.unstack_table(before, layouts["b"]),
    )
    changed = np.argwhere(after != before)
    assert sorted({int(r) for r, _ in changed}) == [0, 1, 16]
    assert sorted({int(c) for _, c in changed}) == [0, 1]
    assert before.sum() != 0  # the input is left as it was
    np.testing.assert_array_equal(
        before, np.arange(32 * 8, dtype=np.float32).reshape(32, 8)
    )


def test_a_table_of_another_shape_is_refused():
    sgd = E.SGD(0.1)
    layouts = _layouts(
        [E.TableConfig(3, 2, name="a", optimizer=sgd)],
        samples=4,
        partitions=1,
        cores_per_partition=2,
    )
    with pytest.raises(ValueError, match=r"'a'.*\[3, 2\].*\[4, 2\]"):
        sparsecore_layout.restack_table(
            np.zeros([16, 8], np.float32), _table(4, 2, 0), layouts["a"]
        )
