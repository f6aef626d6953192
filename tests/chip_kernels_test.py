"""The emulated chip's per-step math, on hand-made enqueues.

`emulated_chip_test.py` runs it under TF's own `TPUEmbedding`; here the
cells and scales of each input form are checked alone against numpy.
"""

import numpy as np
import pytest
import tensorflow as tf

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
