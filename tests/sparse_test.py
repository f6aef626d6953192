"""The sparse lookup: every input form against numpy, and its pieces.

Sparse, ragged and -1-padded dense inputs agree, against numpy.

A property test over random batches: empty rows, repeated ids, weights
(including zero and negative), every combiner, pooled and sequence columns,
safe and unsafe lookup.
"""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import keras_tpu_embed as kte
from keras_tpu_embed.lookups import sparse
from keras_tpu_embed.placement.ids import to_id_batch
from keras_tpu_embed.tables.table_specs import group_into_tables
from tests import testing

VOCAB, DIM = 7, 2
TABLE = np.random.default_rng(0).normal(size=(VOCAB, DIM)).astype(np.float32)

rows = st.lists(
    st.lists(
        st.tuples(
            st.integers(0, VOCAB - 1),
            st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]),
        ),
        max_size=5,
    ),
    min_size=1,
    max_size=6,
).filter(any)  # a batch with no id at all checks nothing


def forms(batch):
    ids = tf.ragged.constant(
        [[i for i, _ in row] for row in batch], dtype=tf.int64, ragged_rank=1
    )
    weights = tf.ragged.constant(
        [[w for _, w in row] for row in batch], dtype=tf.float32, ragged_rank=1
    )
    width = max([len(row) for row in batch] + [1])
    return {
        "ragged": (ids, weights),
        "sparse": (ids.to_sparse(), weights.to_sparse()),
        "dense": (
            ids.to_tensor(-1, shape=[len(batch), width]),
            weights.to_tensor(0.0, shape=[len(batch), width]),
        ),
    }


@settings(max_examples=40, deadline=None)
@given(
    batch=rows,
    combiner=st.sampled_from(["mean", "sum", "sqrtn"]),
    safe=st.booleans(),
    sequence_length=st.sampled_from([0, 3]),
)
def test_input_forms_agree_with_numpy(batch, combiner, safe, sequence_length):
    # Unsafe mean/sqrtn over non-positive weights included: TF divides by
    # the total with `div_no_nan`, so a zero total gives zeros, as numpy.
    categorical = (
        kte.sequence_categorical_column_with_identity
        if sequence_length
        else kte.categorical_column_with_identity
    )
    column = kte.embedding_column(
        kte.weighted_categorical_column(categorical("x", VOCAB), "w"),
        DIM,
        combiner=combiner,
        max_sequence_length=sequence_length,
        use_safe_embedding_lookup=safe,
    )
    layer = kte.TPUEmbeddingLayer([column])
    layer.build()
    layer.table_variable("x_weighted_by_w").assign(TABLE)
    want = testing.numpy_lookup(TABLE, batch, combiner, safe, sequence_length)
    for form, (ids, weights) in forms(batch).items():
        got = layer({"x": ids, "w": weights})[column.name].numpy()
        assert got.shape == want.shape, form
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=form)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_combine_matches_numpy(combiner, weighted):
    batch = [[(1, 2.0), (1, 0.5), (4, 1.0)], [], [(6, 3.0)]]
    ids = [i for row in batch for i, _ in row]
    weights = [w if weighted else 1.0 for row in batch for _, w in row]
    segments = [r for r, row in enumerate(batch) for _ in row]
    got = sparse.combine(
        tf.gather(TABLE, ids),
        tf.constant(weights) if weighted else None,
        tf.constant(segments),
        len(batch),
        combiner,
    )
    pairs = [[(i, w if weighted else 1.0) for i, w in row] for row in batch]
    want = testing.numpy_lookup(TABLE, pairs, combiner, False, 0)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_distinct_ids_and_their_index():
    ids = tf.constant([5, 3, 5, 2**20, 3], tf.int64)
    for vocabulary_size in (2**21, 2**40):
        unique, index = sparse.distinct(ids, vocabulary_size)
        assert unique.dtype == tf.int64 and index.dtype == tf.int32
        np.testing.assert_array_equal(unique, [5, 3, 2**20])
        np.testing.assert_array_equal(index, [0, 1, 0, 2, 1])


def test_sequence_lengths_count_to_the_last_entry_and_clip():
    ragged = tf.ragged.constant([[1, -5, 2, 3], [], [-1, 4]], dtype=tf.int64)
    batch = to_id_batch("x", ragged)
    np.testing.assert_array_equal(sparse.sequence_lengths(batch, 3), [3, 0, 2])


def test_training_rows_come_padded_and_dense_steps_get_them_cut():
    """Lazy steps get the padded distinct rows and their count (the
    compiled step); dense steps and replicas get the distinct rows only,
    so the padding's row 0 never takes a zero-gradient step."""
    [table] = group_into_tables([testing.identity_column(vocabulary_size=9)])
    ids = tf.constant([[3, 1], [3, -1]], tf.int64)
    lookup = sparse.SparseTableLookup(table, {"ids": ids}, False)
    variable = tf.Variable(
        tf.reshape(tf.range(9 * DIM, dtype=tf.float32), [9, DIM])
    )
    rows = lookup.training_rows({table.name: variable})[table.name]
    assert rows.shape[0] == 64
    gradient = tf.ones_like(rows)
    lazy = lookup.update_arguments(
        {table.name: gradient}, updates_all_rows=False
    )[table.name]
    assert int(lazy["count"]) == 2
    padded = lazy["unique_ids"].numpy()
    assert sorted(padded[:2]) == [1, 3] and not padded[2:].any()
    np.testing.assert_array_equal(rows, tf.gather(variable, padded))
    dense = lookup.update_arguments(
        {table.name: gradient}, updates_all_rows=True
    )[table.name]
    assert "count" not in dense
    assert sorted(dense["unique_ids"].numpy()) == [1, 3]
    assert dense["gradient"].shape[0] == 2


def test_position_gradient_is_the_gathers_summed_per_row():
    """A sequence's gradient reaches the distinct rows as the gradient of
    the gather it replaces: each row's positions summed; slot 0 (an empty
    position, the zero row) reaches no row."""
    rng = np.random.default_rng(3)
    rows = tf.constant(rng.normal(size=(6, 4)), tf.float32)
    # Row 2 is read at three positions, row 5 at none, two positions empty.
    slots = tf.constant([3, 0, 1, 3, 2, 3, 0, 6, 4], tf.int32)
    upstream = tf.constant(rng.normal(size=(9, 4)), tf.float32)

    def gradient(gather) -> np.ndarray:
        with tf.GradientTape() as tape:
            tape.watch(rows)
            out = gather(rows)
        return tf.convert_to_tensor(tape.gradient(out, rows, upstream)).numpy()

    ours = gradient(
        lambda r: sparse.gather_positions(r, sparse.with_zero_row(r), slots)
    )
    expected = np.zeros((6, 4), np.float32)
    for position, slot in enumerate(slots.numpy()):
        if slot:
            expected[slot - 1] += upstream.numpy()[position]
    np.testing.assert_allclose(ours, expected, rtol=1e-6)
    np.testing.assert_allclose(
        ours,
        gradient(lambda r: tf.gather(sparse.with_zero_row(r), slots)),
        rtol=1e-6,
    )
    np.testing.assert_array_equal(
        sparse.gather_positions(rows, sparse.with_zero_row(rows), slots),
        tf.gather(sparse.with_zero_row(rows), slots),
    )
