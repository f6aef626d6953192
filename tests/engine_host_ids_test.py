"""The columns' id rules as the engine's enqueue applies them on the host.

Training under the emulated engine against one device:
`tests/emulated/engine_host_ids_test.py`.
"""

import types

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.engines import engine_host_ids


def _as_lists(sparse):
    return sorted(
        zip(
            map(tuple, sparse.indices.numpy().tolist()),
            sparse.values.numpy().tolist(),
        )
    )


def test_sequence_positions_past_the_length_are_dropped_in_place():
    column = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("hist", 10),
        2,
        max_sequence_length=2,
    )
    rule = engine_host_ids.HostIdRule.of(column)
    ids = tf.ragged.constant([[1, 2, 3], [4], [5, 6, 7, 8]], tf.int64)
    sparse, weights = rule.apply(ids, None)
    assert weights is None
    assert _as_lists(sparse) == [
        ((0, 0), 1),
        ((0, 1), 2),
        ((1, 0), 4),
        ((2, 0), 5),
        ((2, 1), 6),
    ]
    assert sparse.dense_shape.numpy().tolist() == [3, 2]


def test_non_positive_weights_are_pruned_for_mean_only():
    tags = kte.weighted_categorical_column(
        kte.categorical_column_with_identity("tags", 10), "w"
    )
    ids = tf.sparse.from_dense(tf.constant([[1, 2], [3, 4]], tf.int64))
    weights = tf.SparseTensor(ids.indices, [2.0, -1.0, 0.0, 5.0], [2, 2])
    kept = {}
    for combiner in ("mean", "sum"):
        rule = engine_host_ids.HostIdRule.of(
            kte.embedding_column(tags, 2, combiner=combiner)
        )
        sparse, sparse_weights = rule.apply(ids, weights)
        kept[combiner] = (_as_lists(sparse), _as_lists(sparse_weights))
    assert kept["mean"] == (
        [((0, 0), 1), ((1, 1), 4)],
        [((0, 0), 2.0), ((1, 1), 5.0)],
    )
    assert kept["sum"][0] == [
        ((0, 0), 1),
        ((0, 1), 2),
        ((1, 0), 3),
        ((1, 1), 4),
    ]


def test_identity_ids_map_to_the_default_or_raise_naming_the_feature():
    def rule(default_value):
        column = kte.embedding_column(
            kte.categorical_column_with_identity(
                "item", 5, default_value=default_value
            ),
            2,
        )
        return engine_host_ids.HostIdRule.of(column)

    # Dense ids: -1 is padding, dropped; 7 is out of range.
    ids = tf.constant([[3], [7], [-1]], tf.int64)
    sparse, _ = rule(0).apply(ids, None)
    assert _as_lists(sparse) == [((0, 0), 3), ((1, 0), 0)]
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Feature 'item' \(table 'item'\) has ids outside",
    ):
        rule(None).apply(ids, None)


def test_the_enqueue_op_takes_the_rewritten_ids():
    column = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("hist", 10),
        2,
        max_sequence_length=1,
    )
    received = {}

    def generate_enqueue_op(flat_inputs, flat_weights, flat_features, *rest):
        received["inputs"] = flat_inputs
        received["rest"] = rest

    mid_level = types.SimpleNamespace(_generate_enqueue_op=generate_enqueue_op)
    engine_host_ids.apply_on_host(
        mid_level, engine_host_ids.host_id_rules([column])
    )
    ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
    raw = tf.constant([[9]], tf.int64)
    mid_level._generate_enqueue_op(
        [ids, raw],
        [None, None],
        [(column.name, None), ("their_feature", None)],
        -1,
        "train",
    )
    rewritten, untouched = received["inputs"]
    assert _as_lists(rewritten) == [((0, 0), 1), ((1, 0), 3)]
    assert untouched is raw
    assert received["rest"] == (-1, "train")
    np.testing.assert_array_equal(rewritten.dense_shape, [2, 1])
