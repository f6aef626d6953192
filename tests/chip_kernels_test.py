"""The emulated chip's per-step math, on hand-made enqueues and tables.

`emulated_chip_test.py` runs it under TF's own `TPUEmbedding`; here the
cells and scales of each input form, and the reads and updates of a table
held as shards, are checked alone against numpy.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

from keras_tpu_embed.testing import chip_kernels


def _cells_and_scales(kind, positions, weights, shape, combiner):
    count = len(weights)
    batch = chip_kernels.Enqueued(
        ids=[tf.zeros([count], tf.int64)],
        positions=[None if positions is None else tf.constant(positions)],
        kinds=[kind],
        weights=[tf.constant(weights, tf.float32)],
        combiners=[combiner],
    )
    cells, scales = chip_kernels.cells_and_scales(batch, 0, shape, combiner)
    return cells.numpy().tolist(), scales.numpy()


@pytest.mark.parametrize(
    "combiner, want",
    [
        ("sum", [1.0, 3.0, 2.0]),
        ("mean", [0.25, 0.75, 1.0]),
        ("sqrtn", [1 / np.sqrt(10), 3 / np.sqrt(10), 1.0]),
    ],
)
def test_sparse_ids_combine_per_example(combiner, want):
    cells, scales = _cells_and_scales(
        "sparse", [[0, 0], [0, 1], [1, 0]], [1.0, 3.0, 2.0], [2], combiner
    )
    assert cells == [0, 0, 1]
    np.testing.assert_allclose(scales, want, rtol=1e-6)


def test_ragged_ids_take_their_rows_cells():
    cells, scales = _cells_and_scales(
        "ragged", [0, 2, 3], [1.0, 1.0, 4.0], [2], "mean"
    )
    assert cells == [0, 0, 1]
    np.testing.assert_allclose(scales, [0.5, 0.5, 1.0])


def test_sequence_ids_past_the_length_weigh_nothing():
    # Batch 2, sequence length 2: the third id of example 0 is dropped.
    cells, scales = _cells_and_scales(
        "sparse",
        [[0, 0], [0, 1], [0, 2], [1, 0]],
        [1.0, 1.0, 1.0, 1.0],
        [2, 2],
        "sum",
    )
    assert cells == [0, 1, 0, 2]
    np.testing.assert_allclose(scales, [1.0, 1.0, 0.0, 1.0])


def test_cells_in_a_shape():
    assert chip_kernels.cells_in([4, 3]) == 12


def test_ids_outside_the_table_fail_naming_it():
    table = chip_kernels.ChipTable(
        name="items",
        vocabulary_size=4,
        dim=2,
        parameters=None,
        kind="stochastic_gradient_descent",
        num_shards=1,
    )
    ids = tf.constant([0, 3], tf.int64)
    np.testing.assert_array_equal(chip_kernels.checked_ids(ids, table), [0, 3])
    with pytest.raises(tf.errors.InvalidArgumentError, match="'items'"):
        chip_kernels.checked_ids(tf.constant([4], tf.int64), table)


def _sharded_table(values, rows_per_shard, kind="stochastic_gradient_descent"):
    """A table of `values` as shards of `rows_per_shard` rows each."""
    parameters = optimization_parameters_pb2.OptimizationParameters()
    parameters.learning_rate.constant = 0.5
    getattr(parameters, kind).SetInParent()
    shards = {}
    start = 0
    for index, rows in enumerate(rows_per_shard):
        shards[index] = chip_kernels.ChipShard(
            host="/cpu:0",
            start=start,
            rows=rows,
            variables={"parameters": tf.Variable(values[start : start + rows])}
            if rows
            else {},
        )
        start += rows
    return chip_kernels.ChipTable(
        name="items",
        vocabulary_size=len(values),
        dim=values.shape[1],
        parameters=parameters,
        kind=kind,
        num_shards=len(rows_per_shard),
        shards=shards,
    )


def test_rows_come_from_the_shard_that_holds_them():
    values = np.arange(14.0, dtype=np.float32).reshape(7, 2)
    # TF's split of 7 rows over 3 hosts: 3, 2, 2.
    table = _sharded_table(values, [3, 2, 2])
    ids = tf.constant([6, 0, 3, 2, 6, 5], tf.int64)
    np.testing.assert_array_equal(
        chip_kernels.gather_rows(table, ids), values[[6, 0, 3, 2, 6, 5]]
    )


def test_a_host_without_rows_holds_no_shard():
    values = np.arange(4.0, dtype=np.float32).reshape(2, 2)
    table = _sharded_table(values, [1, 1, 0])
    assert [s.start for s in table.held_shards()] == [0, 1]
    ids = tf.constant([1, 0], tf.int64)
    np.testing.assert_array_equal(
        chip_kernels.gather_rows(table, ids), values[[1, 0]]
    )


def test_the_step_updates_each_row_in_its_shard_once():
    values = np.arange(14.0, dtype=np.float32).reshape(7, 2)
    table = _sharded_table(values, [3, 2, 2])
    ids = tf.constant([6, 0, 6, 4], tf.int64)
    gradients = tf.constant([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]])
    chip_kernels.apply_table(table, ids, gradients, [])
    expected = values.copy()
    for row, gradient in ((6, 4.0), (0, 2.0), (4, 4.0)):
        expected[row] -= 0.5 * gradient
    got = np.concatenate(
        [table.shards[i].variables["parameters"].numpy() for i in range(3)]
    )
    np.testing.assert_array_equal(got, expected)


def test_a_shard_never_loaded_is_named():
    values = np.zeros((4, 2), np.float32)
    table = _sharded_table(values, [2, 2])
    del table.shards[1]
    with pytest.raises(
        RuntimeError, match=r"'items' has no shard for hosts \[1\]"
    ):
        table.held_shards()
