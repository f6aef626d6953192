"""Host-side clean-up of negative ids before the TPU embedding engine.

The tensor-core padding runs end to end in `distribute_test.py` (a TPU
without an engine).
"""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.pipelines.host_ids import dense_ids_of
from keras_tpu_embed.pipelines.host_ids import drop_negative_ids


def test_ragged_ids_lose_negatives_with_their_weights():
    ids = tf.ragged.constant([[3, -1, 4], [-1], [5]], tf.int64)
    weights = tf.ragged.constant([[0.5, 9.0, 2.0], [9.0], [1.5]])
    cleaned = drop_negative_ids(
        {"tags": ids, "tags_w": weights}, {"tags": "tags_w"}, set()
    )
    assert cleaned["tags"].to_list() == [[3, 4], [], [5]]
    assert cleaned["tags_w"].to_list() == [[0.5, 2.0], [], [1.5]]


def test_sparse_ids_lose_negatives_with_their_weights():
    indices = [[0, 0], [0, 1], [1, 0], [2, 1]]
    ids = tf.SparseTensor(
        indices, tf.constant([-1, 7, 2, -1], tf.int64), [3, 2]
    )
    weights = tf.SparseTensor(indices, [9.0, 0.25, 0.5, 9.0], [3, 2])
    cleaned = drop_negative_ids(
        {"item": ids, "item_w": weights}, {"item": "item_w"}, set()
    )
    np.testing.assert_array_equal(cleaned["item"].indices, [[0, 1], [1, 0]])
    np.testing.assert_array_equal(cleaned["item"].values, [7, 2])
    np.testing.assert_array_equal(cleaned["item_w"].values, [0.25, 0.5])
    np.testing.assert_array_equal(cleaned["item_w"].indices, [[0, 1], [1, 0]])


def test_dense_features_not_on_the_engine_keep_their_padding():
    padded = tf.constant([[3, -1], [-1, -1]], tf.int64)  # tensor-core input
    cleaned = drop_negative_ids({"hist": padded}, {}, {"user"})
    np.testing.assert_array_equal(cleaned["hist"], padded)


def test_weights_whose_ids_are_unknown_are_an_error():
    ids = tf.SparseTensor([[0, 0]], tf.constant([-1], tf.int64), [1, 1])
    weights = tf.SparseTensor([[0, 0]], [2.0], [1, 1])
    with pytest.raises(ValueError, match=r"\['w'\] look like weights"):
        drop_negative_ids({"x": ids, "w": weights}, {}, set(), False)


def _sparse(rows, dtype=tf.int64):
    """A `[len(rows), width]` sparse tensor of `{position: value}` rows."""
    indices = [[r, p] for r, row in enumerate(rows) for p in sorted(row)]
    values = [row[p] for row in rows for p in sorted(row)]
    width = 1 + max((p for row in rows for p in row), default=0)
    return tf.SparseTensor(
        tf.constant(indices, tf.int64, [len(indices), 2]),
        tf.constant(values, dtype),
        [len(rows), width],
    )


def _every_column_kind():
    # Vocabularies without OOV buckets: the preprocessor's -1 for values
    # out of them stays in sparse ids.
    pooled = [
        kte.embedding_column(
            kte.categorical_column_with_vocabulary_list(
                f"tag_{combiner}", ["a", "b", "c"]
            ),
            3,
            combiner=combiner,
        )
        for combiner in ("sum", "mean", "sqrtn")
    ]
    weighted = kte.embedding_column(
        kte.weighted_categorical_column(
            kte.categorical_column_with_identity("item", 6), "item_w"
        ),
        2,
        combiner="mean",
    )
    # An identity column with a default maps a sparse -1 to it.
    defaulted = kte.embedding_column(
        kte.categorical_column_with_identity("uid", 6, default_value=0), 2
    )
    sequences = [
        kte.embedding_column(
            kte.sequence_categorical_column_with_vocabulary_list(
                "hist", ["a", "b", "c"]
            ),
            2,
            max_sequence_length=4,
        ),
        kte.embedding_column(
            kte.sequence_categorical_column_with_identity(
                "clicks", 6, default_value=1
            ),
            2,
            max_sequence_length=3,
        ),
        # The tensor-core lookup densifies sparse ids with -1 itself.
        kte.embedding_column(
            kte.sequence_categorical_column_with_identity("tc", 6),
            2,
            max_sequence_length=3,
            embedding_lookup_device="tpu_tensor_core",
        ),
    ]
    return pooled + [weighted, defaulted] + sequences


def test_dense_ids_give_the_layers_answer_on_sparse_ids():
    """What `distribute_dataset` feeds Keras' `fit` under MirroredStrategy
    gives every column kind the answer of the sparse ids it replaces: -1
    ids (out of a vocabulary without OOV buckets) last, in the middle and
    alone, sparse gaps, empty rows, weights."""
    columns = _every_column_kind()
    rows = [{0: 1, 1: -1}, {0: -1}, {}, {0: 2, 1: 0, 2: -1}, {1: 2, 3: 1}]
    features = {f"tag_{c}": _sparse(rows) for c in ("sum", "mean", "sqrtn")}
    features["item"] = _sparse([{0: 3, 1: -1}, {0: -1}, {}, {0: 5}, {2: 1}])
    features["item_w"] = _sparse(
        [{0: 0.5, 1: 2.0}, {0: 3.0}, {}, {0: 1.5}, {2: 0.25}], tf.float32
    )
    features["uid"] = _sparse([{0: -1}, {0: 4, 1: -1}, {}, {0: 7}, {0: 2}])
    features["hist"] = _sparse(rows)
    features["clicks"] = _sparse(
        [{0: 2, 1: -1}, {0: -1}, {}, {0: 4, 2: -1}, {1: 3}]
    )
    features["tc"] = _sparse(rows)
    layer = kte.TPUEmbeddingLayer(columns, return_sequence_lengths=True)
    want = layer(features)
    dense = dense_ids_of(columns)(features)
    assert not any(isinstance(v, tf.SparseTensor) for v in dense.values())
    got = layer(dense)
    assert sorted(got) == sorted(want)
    assert "hist_embedding_sequence_length" in want
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-6, err_msg=key)


def test_dense_ids_refuse_features_they_cannot_read_one_way():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 6), 2
    )
    on_tensor_core = kte.embedding_column(
        kte.categorical_column_with_identity("item", 6),
        2,
        tensor_core_shape=[None, 2],
        embedding_lookup_device="tpu_tensor_core",
    )
    features = {"item": _sparse([{0: 1}]), "other": _sparse([{0: 1}])}
    with pytest.raises(ValueError, match=r"features \['other'\]"):
        dense_ids_of([column])(features)
    with pytest.raises(ValueError, match=r"\['item'\] are read by a host"):
        dense_ids_of([column, on_tensor_core])({"item": features["item"]})
    sequence = kte.sequence_categorical_column_with_identity("item", 6)
    with pytest.raises(ValueError, match=r"only the categorical columns"):
        dense_ids_of([sequence])({"item": features["item"]})
    # An embedding column says where its lookup runs.
    both = [sequence, kte.embedding_column(sequence, 2, max_sequence_length=2)]
    assert dense_ids_of(both)({"item": features["item"]})["item"].shape == (
        1,
        1,
    )
    ragged = tf.ragged.constant([[1, -1], []], tf.int64)
    np.testing.assert_array_equal(
        dense_ids_of([column])({"item": ragged})["item"], [[1, -2], [-1, -1]]
    )
