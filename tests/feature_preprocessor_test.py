"""FeaturePreprocessor: ids like feature columns, errors naming the feature."""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing


def _dense(sparse, default=-1):
    return tf.sparse.to_dense(sparse, default_value=default).numpy().tolist()


def test_vocabulary_list_default_and_oov():
    plain = kte.categorical_column_with_vocabulary_list("a", ["x", "y"])
    pre = kte.FeaturePreprocessor([plain])
    out = pre({"a": tf.constant([["y", "zz", ""]])})
    # Unknown values map to default_value -1 (kept, skipped by the lookup);
    # "" pads dense string input and is dropped.
    assert _dense(out["a"], -9) == [[1, -1, -9]]


def test_identity_checks_range_and_maps_default():
    strict = kte.FeaturePreprocessor(
        [kte.categorical_column_with_identity("a", 5)]
    )
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"Feature 'a'.*\[0, 5\)"
    ):
        strict({"a": tf.constant([[1, 7]])})
    lenient = kte.FeaturePreprocessor(
        [kte.categorical_column_with_identity("a", 5, default_value=0)]
    )
    assert _dense(lenient({"a": tf.constant([[1, 7, -1]])})["a"]) == [
        [1, 0, -1]
    ]


def test_errors_name_the_feature():
    pre = kte.FeaturePreprocessor(
        [kte.categorical_column_with_hash_bucket("h", 10)]
    )
    with pytest.raises(KeyError, match=r"Missing feature 'h'.*\['h'\]"):
        with pytest.warns(UserWarning, match=r"ignores features \['other'\]"):
            pre({"other": tf.constant(["x"])})
    with pytest.raises(TypeError, match="Feature 'h' must hold strings"):
        pre({"h": tf.constant([1.5])})
    with pytest.raises(ValueError, match="Feature 'h' must be rank 1"):
        pre({"h": tf.constant([[["x"]]])})


def test_extra_keys_warn_once():
    pre = kte.FeaturePreprocessor(
        [kte.categorical_column_with_hash_bucket("h", 10)]
    )
    with pytest.warns(
        UserWarning, match=r"ignores features \['label'\]"
    ) as record:
        pre({"h": tf.constant(["x"]), "label": tf.constant([1])})
    # Attributed to this line, not to Keras' traceback_utils.py.
    assert [w.filename for w in record] == [__file__]


def test_weighted_inputs_keep_alignment():
    column = kte.weighted_categorical_column(
        kte.categorical_column_with_vocabulary_list("a", ["x", "y"]), "w"
    )
    pre = kte.FeaturePreprocessor([column])
    out = pre(
        {"a": tf.constant([["x", "", "y"]]), "w": tf.constant([[1.0, 9.0, 2]])}
    )
    assert _dense(out["a"]) == [[0, -1, 1]]
    np.testing.assert_array_equal(out["w"].values, [1.0, 2.0])
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="exactly the shape"
    ):
        pre({"a": tf.constant([["x", "y"]]), "w": tf.constant([[1.0]])})


def test_runs_in_tf_data_with_ragged_input():
    pre = kte.FeaturePreprocessor(
        [kte.categorical_column_with_hash_bucket("h", 10)]
    )
    dataset = tf.data.Dataset.from_tensors(
        {"h": tf.ragged.constant([["a", "b"], []])}
    ).map(pre)
    out = next(iter(dataset))["h"]
    assert out.dense_shape.numpy().tolist() == [2, 2]
    expected = tf.strings.to_hash_bucket_fast(["a", "b"], 10).numpy()
    np.testing.assert_array_equal(out.values, expected)


def test_make_parse_example_spec():
    spec = kte.make_parse_example_spec(
        [
            kte.categorical_column_with_identity("i", 3),
            kte.weighted_categorical_column(
                kte.categorical_column_with_hash_bucket("h", 10), "hw"
            ),
        ]
    )
    assert spec == {
        "i": tf.io.VarLenFeature(tf.int64),
        "h": tf.io.VarLenFeature(tf.string),
        "hw": tf.io.VarLenFeature(tf.float32),
    }


def test_config_round_trip():
    pre = kte.FeaturePreprocessor(
        [kte.embedding_column(kte.categorical_column_with_identity("i", 3), 2)]
    )
    rebuilt = testing.assert_config_round_trip(pre)
    assert rebuilt.expected_keys == ["i"]


@pytest.mark.parametrize("form", ["dense", "sparse"])
def test_weights_of_another_rank_are_named_as_ids_are(form):
    """Weights go through the ids' rank check: rank 3 is refused naming
    the weight feature, not left to a shape assertion."""
    column = kte.weighted_categorical_column(
        kte.categorical_column_with_vocabulary_list("a", ["x", "y"]), "w"
    )
    pre = kte.FeaturePreprocessor([column])
    weights = tf.ones([1, 1, 1])
    if form == "sparse":
        weights = tf.sparse.from_dense(weights)
    with pytest.raises(ValueError, match="Feature 'w' must be rank 1"):
        pre({"a": tf.constant([["x"]]), "w": weights})
