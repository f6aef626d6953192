"""A layer's inputs are read by name; its outputs assembled in name order."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.preprocessing.layer_io import SEQUENCE_LENGTH_SUFFIX
from keras_tpu_embed.preprocessing.layer_io import LayerInputs
from keras_tpu_embed.preprocessing.layer_io import LayerOutputs
from keras_tpu_embed.preprocessing.layer_io import check_output_mode


def _columns():
    item = kte.categorical_column_with_identity("item", 10)
    tags = kte.weighted_categorical_column(
        kte.categorical_column_with_identity("tags", 10), "tag_w"
    )
    hist = kte.sequence_categorical_column_with_identity("hist", 10)
    return [
        kte.embedding_column(item, 2),
        kte.embedding_column(tags, 3),
        kte.embedding_column(hist, 2, max_sequence_length=4),
    ]


def test_inputs_by_name_extra_keys_ignored_without_a_warning():
    """One feature dict feeding several layers is the documented usage."""
    inputs = LayerInputs("layer 'x'", _columns())
    assert inputs.expected == ["item", "tags", "tag_w", "hist"]
    features = {k: tf.constant([[1]]) for k in inputs.expected}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert inputs.features(dict(features, extra=1)) is not None
    assert not caught
    with pytest.raises(KeyError, match="Missing feature 'tag_w'"):
        inputs.features({k: v for k, v in features.items() if k != "tag_w"})
    with pytest.raises(TypeError, match="pass a dict"):
        inputs.features(tf.constant([[1]]))


def test_single_feature_and_keys_from_shape():
    [item, *_] = _columns()
    inputs = LayerInputs("layer 'x'", [item])
    ids = tf.constant([[1]])
    assert inputs.features(ids) == {"item": ids}
    assert inputs.keys_from_shape((None, 1)) == frozenset({"item"})
    assert inputs.keys_from_shape({"a": 1, "b": 2}) == frozenset({"a", "b"})
    assert LayerInputs("x", _columns()).keys_from_shape((None, 1)) is None


def test_outputs_cast_name_lengths_and_concat():
    columns = _columns()
    values = {
        "item_embedding": tf.ones([2, 2], tf.float64),
        "tags_weighted_by_tag_w_embedding": tf.zeros([2, 3]),
        "hist_embedding": tf.ones([2, 4, 2]),
    }
    lengths = {"hist_embedding": tf.constant([1, 3], tf.int64)}
    outputs = LayerOutputs(columns, {}, False, True, "float16")
    got = outputs.assemble(values, lengths)
    assert got["item_embedding"].dtype == tf.float16
    np.testing.assert_array_equal(
        got["hist_embedding" + SEQUENCE_LENGTH_SUFFIX], [1, 3]
    )
    spec = outputs.spec()
    assert spec["hist_embedding"].shape == (None, 4, 2)
    assert spec["hist_embedding_sequence_length"].dtype == "int64"
    flat = LayerOutputs(columns[:2], {}, True, False, "float32")
    joined = flat.assemble(values, {})
    # Name order, as DenseFeatures: item (2) before tags (3).
    np.testing.assert_array_equal(joined[0], [1, 1, 0, 0, 0])
    assert flat.spec().shape == (None, 5)
    assert isinstance(flat.spec(), keras.KerasTensor)


def test_output_mode_is_checked():
    with pytest.raises(ValueError, match="Invalid value for argument `output`"):
        check_output_mode("list", _columns())
    with pytest.raises(
        ValueError, match=r"sequence columns \['hist_embedding'\]"
    ):
        check_output_mode("concat", _columns())
    assert check_output_mode("concat", _columns()[:2]) == "concat"
