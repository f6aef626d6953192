"""Bucketized and crossed column specs: validation, names, configs, ids."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed import id_mapping
from keras_tpu_embed.columns import derived
from tests import testing


def test_bucketized_names_buckets_and_raw_inputs_are_tfs():
    ours = kte.bucketized_column(kte.numeric_column("p", (3,)), [0, 1, 2])
    theirs = tf.feature_column.bucketized_column(
        tf.feature_column.numeric_column("p", (3,)), [0, 1, 2]
    )
    assert ours.name == theirs.name and ours.num_buckets == theirs.num_buckets
    assert ours.raw_inputs == {"p": "float32"}
    assert ours.feature_key == "p_bucketized"
    testing.assert_serialization_round_trip(ours)


def test_bucketized_refuses_bad_boundaries_and_normalizer():
    with pytest.raises(ValueError, match="strictly increasing"):
        kte.bucketized_column(kte.numeric_column("p"), [2, 1])
    with pytest.raises(ValueError, match="normalizer_fn"):
        kte.numeric_column("p", normalizer_fn=abs)
    with pytest.raises(TypeError, match="numeric_column"):
        kte.bucketized_column(kte.categorical_column_with_identity("p", 3), [1])


def test_crossed_name_raw_inputs_and_config():
    price = kte.bucketized_column(kte.numeric_column("p"), [1.0])
    crossed = kte.crossed_column(
        ["b", price, "a"], 9, key_dtypes=["string", "int64"]
    )
    assert crossed.name == "a_X_b_X_p_bucketized"
    assert crossed.raw_inputs == {"b": "string", "p": "float32", "a": "int64"}
    testing.assert_serialization_round_trip(crossed)
    with pytest.raises(ValueError, match="one dtype per feature key"):
        kte.crossed_column(["a", "b"], 9, key_dtypes=["string"])
    with pytest.raises(TypeError, match="feature keys or bucketized"):
        kte.crossed_column(
            ["a", kte.categorical_column_with_identity("b", 3)], 9
        )


def test_bucketized_ids_refuse_sparse_input():
    column = kte.bucketized_column(kte.numeric_column("p"), [1.0])
    sparse = tf.sparse.from_dense(tf.constant([[2.0]]))
    with pytest.raises(TypeError, match="dense tensor of shape"):
        id_mapping.bucketized_ids(column, sparse)


def test_bucketized_ids_offset_each_dimension():
    column = kte.bucketized_column(kte.numeric_column("p", 2), [0.0, 10.0])
    ids = id_mapping.bucketized_ids(column, tf.constant([[-1.0, 5.0]]))
    # Dimension 0 in bucket 0; dimension 1 in bucket 1, offset by 3.
    np.testing.assert_array_equal(ids.values.numpy(), [0, 4])


def test_numeric_column_from_tf_keeps_shape_and_default():
    theirs = tf.feature_column.numeric_column("p", 2, default_value=(1, 2))
    ours = derived.to_numeric_column(theirs)
    assert ours.shape == (2,) and ours.default_value == (1.0, 2.0)


def _bucketized_pre_and_model():
    column = kte.embedding_column(
        kte.bucketized_column(kte.numeric_column("x", 2), [0.0, 10.0]), 3
    )
    pre = kte.FeaturePreprocessor([column])
    inputs = pre.keras_inputs()
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    return column, pre, keras.Model(inputs, layer(inputs))


@pytest.mark.parametrize("shape", [[4, 3], [4, 1], [4], [2, 2, 2]])
def test_bucketized_refuses_numbers_per_row_other_than_its_shape(shape):
    # [4, 3] has 12 numbers: reshaped to [-1, 2] it would be 6 examples.
    column = kte.bucketized_column(kte.numeric_column("x", 2), [0.0, 10.0])
    raw = tf.zeros(shape)
    with pytest.raises(
        (ValueError, tf.errors.InvalidArgumentError),
        match=r"x_bucketized.*\[batch, 2\]",
    ):
        id_mapping.bucketized_ids(column, raw)
    dynamic = tf.function(
        lambda r: id_mapping.bucketized_ids(column, r).dense_shape,
        input_signature=[tf.TensorSpec(None, tf.float32)],
    )
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"x_bucketized.*\[batch, 2\]"
    ):
        dynamic(raw)


def test_bucketized_keeps_the_batch_in_the_preprocessor_and_export(tmp_path):
    _, pre, model = _bucketized_pre_and_model()
    raw = {"x": tf.zeros([4, 3])}
    with pytest.raises(
        (ValueError, tf.errors.InvalidArgumentError),
        match=r"x_bucketized.*\[batch, 2\]",
    ):
        pre(raw)
    path = kte.export_saved_model(model, str(tmp_path / "b"), pre)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"x_bucketized.*\[batch, 2\]"
    ):
        serve(x=tf.zeros([4, 3]))
    # The right shape serves one row per example.
    assert next(iter(serve(x=tf.zeros([4, 2])).values())).shape[0] == 4
