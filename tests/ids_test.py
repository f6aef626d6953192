"""Ids on their way to a lookup: one canonical form and the column's rules."""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.placement import ids as ids_lib
from tests import testing

VOCAB, DIM = testing.VOCAB, testing.DIM
identity_column = testing.identity_column


def test_identity_default_value_maps_out_of_range():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("x", VOCAB, default_value=0),
        DIM,
        combiner="sum",
    )
    layer = kte.TPUEmbeddingLayer([column])
    out = layer({"x": tf.constant([[100]])})["x_embedding"]
    np.testing.assert_allclose(out[0], layer.table_variable("x").numpy()[0])


def test_weights_must_match_ids():
    column = kte.embedding_column(
        kte.weighted_categorical_column(
            kte.categorical_column_with_identity("x", VOCAB), "w"
        ),
        DIM,
    )
    layer = kte.TPUEmbeddingLayer([column])
    with pytest.raises(ValueError, match="exactly the structure"):
        layer({"x": tf.constant([[1, 2]]), "w": tf.constant([[1.0]])})
    with pytest.raises(tf.errors.InvalidArgumentError, match="row lengths"):
        layer(
            {
                "x": tf.ragged.constant([[1, 2], [3]]),
                "w": tf.ragged.constant([[1.0], [1.0, 2.0]]),
            }
        )
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or inf"):
        layer({"x": tf.constant([[1]]), "w": tf.constant([[np.nan]])})


def test_large_ids_string_ids_and_int_weights():
    layer = kte.TPUEmbeddingLayer([identity_column("x")])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[0, 8\)"):
        layer({"x": tf.constant([[2**40]], tf.int64)})
    with pytest.raises(TypeError, match="Feature 'x' must hold integer ids"):
        layer({"x": tf.constant([["3"]])})
    weighted = kte.TPUEmbeddingLayer(
        [
            kte.embedding_column(
                kte.weighted_categorical_column(
                    kte.categorical_column_with_identity("x", VOCAB), "w"
                ),
                DIM,
                combiner="sum",
            )
        ]
    )
    as_int = weighted({"x": tf.constant([[1, 2]]), "w": tf.constant([[2, 3]])})
    as_float = weighted(
        {"x": tf.constant([[1, 2]]), "w": tf.constant([[2.0, 3.0]])}
    )
    name = "x_weighted_by_w_embedding"
    np.testing.assert_array_equal(as_int[name], as_float[name])


def test_map_to_default():
    ids = tf.constant([0, 7, 8, 100, -1], tf.int64)
    np.testing.assert_array_equal(
        ids_lib.map_to_default(ids, 8, 3), [0, 7, 3, 3, 3]
    )
    np.testing.assert_array_equal(
        ids_lib.map_to_default(ids, 8, 3, keep_padding=True), [0, 7, 3, 3, -1]
    )
    assert ids_lib.map_to_default(ids, 8, None) is ids


@pytest.mark.parametrize(
    "width, want",
    [(2, [[1, 2], [4, 5]]), (3, [[1, 2, 3], [4, 5, 6]])],
)
def test_fit_width_truncates(width, want):
    dense = tf.constant([[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(ids_lib.fit_width(dense, width, -1), want)


def test_fit_width_pads_known_and_unknown_widths():
    dense = tf.constant([[1, 2], [3, -1]])
    want = [[1, 2, -1, -1], [3, -1, -1, -1]]
    np.testing.assert_array_equal(ids_lib.fit_width(dense, 4, -1), want)
    unknown = tf.function(
        lambda x: ids_lib.fit_width(x, 4, -1),
        input_signature=[tf.TensorSpec([None, None], tf.int32)],
    )
    np.testing.assert_array_equal(unknown(dense), want)
    np.testing.assert_array_equal(unknown(tf.ones([1, 6], tf.int32)), [[1] * 4])
    # Rank 1: one id per example.
    np.testing.assert_array_equal(
        ids_lib.fit_width(tf.constant([5, 6]), 2, 0), [[5, 0], [6, 0]]
    )


def test_densify_gives_every_form_one_matrix():
    ragged = tf.ragged.constant([[1, 2, 3], [], [4]], dtype=tf.int64)
    want = [[1, 2], [-1, -1], [4, -1]]
    for form in (ragged, ragged.to_sparse(), ragged.to_tensor(-1)):
        np.testing.assert_array_equal(ids_lib.densify(form, 2, -1), want)
    # Rank 1 sparse: one id per example, the middle example has none.
    rank_one = tf.sparse.from_dense(tf.constant([7, 0, 9], tf.int64))
    np.testing.assert_array_equal(
        ids_lib.densify(rank_one, 2, -1), [[7, -1], [-1, -1], [9, -1]]
    )


def test_width_of():
    sequence = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("s", 5),
        2,
        max_sequence_length=4,
    )
    assert ids_lib.width_of(sequence) == 4
    assert ids_lib.width_of(identity_column(tensor_core_shape=[None, 3])) == 3
    with pytest.raises(ValueError, match="'ids_embedding' has no tensor_core"):
        ids_lib.width_of(identity_column())


def test_every_form_flattens_to_the_same_batch():
    ragged = tf.ragged.constant([[3, 1], [], [2, 0, 4]], dtype=tf.int64)
    forms = {
        "ragged": ragged,
        "sparse": ragged.to_sparse(),
        "dense": ragged.to_tensor(-1),
    }
    for name, ids in forms.items():
        batch = ids_lib.to_id_batch("x", ids)
        np.testing.assert_array_equal(batch.ids, [3, 1, 2, 0, 4], name)
        np.testing.assert_array_equal(batch.rows, [0, 0, 2, 2, 2], name)
        np.testing.assert_array_equal(batch.positions, [0, 1, 0, 1, 2], name)
        assert int(batch.batch_size) == 3 and batch.weights is None
        assert batch.row_major == (name != "sparse")


def test_weights_in_another_form_are_refused():
    ids = tf.constant([[1, 2]])
    with pytest.raises(TypeError, match="'w' is sparse but its ids 'x'"):
        ids_lib.to_id_batch(
            "x", ids, tf.sparse.from_dense(tf.constant([[1.0, 2.0]])), "w"
        )
    with pytest.raises(TypeError, match="Weight feature 'w' must be numeric"):
        ids_lib.to_id_batch("x", ids, tf.constant([["a", "b"]]), "w")


def _prepare(ids, weights=None, **rules):
    batch = ids_lib.to_id_batch("x", tf.constant(ids), weights)
    arguments = dict(
        feature="x",
        table="t",
        vocabulary_size=8,
        identity_default=None,
        prune_weights=False,
        max_sequence_length=0,
    )
    arguments.update(rules)
    return ids_lib.prepare_for_lookup(batch, **arguments)


def test_prepare_prunes_negative_ids_and_keeps_weights_aligned():
    weights = tf.constant([[1.0, 0.0, -2.0, 3.0]])
    kept = _prepare([[5, -3, 6, 7]], weights)
    np.testing.assert_array_equal(kept.ids, [5, 6, 7])
    np.testing.assert_array_equal(kept.weights, [1.0, -2.0, 3.0])
    pruned = _prepare([[5, -3, 6, 7]], weights, prune_weights=True)
    np.testing.assert_array_equal(pruned.ids, [5, 7])
    np.testing.assert_array_equal(pruned.positions, [0, 3])


def test_prepare_drops_positions_past_the_sequence_length():
    kept = _prepare([[1, 2, 3], [4, -1, -1]], max_sequence_length=2)
    np.testing.assert_array_equal(kept.ids, [1, 2, 4])
    np.testing.assert_array_equal(kept.rows, [0, 0, 1])


def test_prepare_maps_defaults_before_the_range_check():
    np.testing.assert_array_equal(
        _prepare([[9, 2]], identity_default=0).ids, [0, 2]
    )
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Feature 'x' \(table 't'\) has ids outside .*\[0, 8\)",
    ):
        _prepare([[9, 2]])


def test_column_rules():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("x", 5, default_value=4), 2
    )
    assert ids_lib.identity_default(column) == 4
    hashed = kte.categorical_column_with_hash_bucket("h", 5)
    assert ids_lib.identity_default(kte.embedding_column(hashed, 2)) is None
    assert ids_lib.prunes_weights(column)  # mean, safe
    assert not ids_lib.prunes_weights(identity_column(combiner="sum"))
    assert not ids_lib.prunes_weights(
        identity_column(combiner="sqrtn", use_safe_embedding_lookup=False)
    )


@pytest.mark.parametrize("device", [None, "tpu_tensor_core"])
def test_negative_ids_map_to_default_value_like_feature_columns(device):
    """IdentityCategoricalColumn._transform_input_tensor (TF feature_column
    v2) sends every id outside [0, num_buckets), negative ones included, to
    default_value; -1 in a dense input is padding and never an id."""
    column = kte.embedding_column(
        kte.categorical_column_with_identity("x", VOCAB, default_value=3),
        DIM,
        combiner="sum",
        embedding_lookup_device=device,
        tensor_core_shape=None if device is None else [None, 2],
    )
    layer = kte.TPUEmbeddingLayer([column])
    out = layer({"x": tf.constant([[-5, 1], [-1, -1]])})["x_embedding"]
    table = layer.table_variable("x").numpy()
    np.testing.assert_allclose(out[0], table[3] + table[1], rtol=1e-6)
    np.testing.assert_allclose(out[1], np.zeros(DIM))
    if device is None:
        ragged = layer({"x": tf.ragged.constant([[-1, 2]])})["x_embedding"]
        np.testing.assert_allclose(ragged[0], table[3] + table[2], rtol=1e-6)
