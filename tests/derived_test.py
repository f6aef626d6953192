"""Bucketized and crossed column specs: validation, names, configs, ids."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
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


def _example(features):
    feature = {}
    for key, values in features.items():
        if values and isinstance(values[0], str):
            feature[key] = tf.train.Feature(
                bytes_list=tf.train.BytesList(
                    value=[v.encode() for v in values]
                )
            )
        else:
            feature[key] = tf.train.Feature(
                int64_list=tf.train.Int64List(value=values)
            )
    return tf.train.Example(
        features=tf.train.Features(feature=feature)
    ).SerializeToString()


def _crossed_model(crossed):
    column = kte.embedding_column(crossed, 3, combiner="sum")
    pre = kte.FeaturePreprocessor([column])
    inputs = pre.keras_inputs()
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    model = keras.Model(inputs, layer(inputs))
    return pre, layer, model


@pytest.mark.parametrize("lookup_device", ["cpu", "tpu_tensor_core"])
def test_crossed_export_drops_the_signature_padding(tmp_path, lookup_device):
    pre, layer, model = _crossed_model(
        kte.crossed_column(["a", "i"], 97, key_dtypes=["string", "int64"])
    )
    if lookup_device == "tpu_tensor_core":
        column = kte.embedding_column(
            kte.crossed_column(["a", "i"], 97, key_dtypes=["string", "int64"]),
            3,
            combiner="sum",
            tensor_core_shape=[None, 9],
        )
        pre = kte.FeaturePreprocessor([column])
        inputs = pre.keras_inputs()
        layer = kte.TPUEmbeddingLayer([column], output="concat")
        model = keras.Model(inputs, layer(inputs))
    rows = [
        {"a": ["x", "y"], "i": [1]},
        {"a": ["z"], "i": [2, 3]},
        {"a": ["x", "w", "y"], "i": [4]},
    ]
    ragged = {
        "a": tf.ragged.constant([r["a"] for r in rows]),
        "i": tf.ragged.constant([r["i"] for r in rows], tf.int64),
    }
    trained = layer(pre(ragged)).numpy()
    path = kte.export_saved_model(
        model, str(tmp_path / "e"), pre, lookup_device=lookup_device
    )
    loaded = tf.saved_model.load(path)
    served = next(
        iter(
            loaded.signatures["serving_default"](
                a=ragged["a"].to_tensor(""), i=ragged["i"].to_tensor(-1)
            ).values()
        )
    ).numpy()
    examples = tf.constant([_example(r) for r in rows])
    parsed = next(
        iter(loaded.signatures["serve_examples"](examples=examples).values())
    ).numpy()
    np.testing.assert_allclose(parsed, trained, rtol=1e-6)
    np.testing.assert_allclose(served, trained, rtol=1e-6)


def test_crossed_key_declared_string_refuses_integers():
    # tf.feature_column.crossed_column declares no dtypes: converted, its
    # keys are strings, and int 1 hashes differently from "1".
    converted = tf.feature_column.embedding_column(
        tf.feature_column.crossed_column(["a", "i"], 97), 3
    )
    pre = kte.FeaturePreprocessor([converted])
    raw = {
        "a": tf.constant([["x"], ["y"]]),
        "i": tf.constant([[1], [2]], tf.int64),
    }
    with pytest.raises(TypeError, match=r"'i'.*a_X_i.*string.*key_dtypes"):
        pre(raw)
    declared = kte.crossed_column(
        ["a", "i"], 97, key_dtypes=["string", "int64"]
    )
    pre = kte.FeaturePreprocessor([kte.embedding_column(declared, 3)])
    with pytest.raises(TypeError, match=r"'a'.*a_X_i.*int64.*key_dtypes"):
        pre({"a": raw["i"], "i": raw["i"]})
    # Declared, integers are crossed as integers, as TF crosses them.
    ids = pre(raw)["a_X_i"]
    expected = tf.sparse.cross_hashed([raw["a"], raw["i"]], num_buckets=97)
    np.testing.assert_array_equal(
        tf.sparse.to_dense(ids).numpy(), tf.sparse.to_dense(expected).numpy()
    )


def test_float64_numeric_column_exports_and_serves_examples(tmp_path):
    column = kte.embedding_column(
        kte.bucketized_column(
            kte.numeric_column("x", dtype="float64"), [0.0, 10.0]
        ),
        3,
    )
    pre = kte.FeaturePreprocessor([column])
    inputs = pre.keras_inputs()
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    model = keras.Model(inputs, layer(inputs))
    # tf.Example holds 32-bit floats: the parse spec reads them as such.
    assert kte.make_parse_example_spec([column])["x"].dtype == tf.float32
    path = kte.export_saved_model(model, str(tmp_path / "f"), pre)
    loaded = tf.saved_model.load(path)
    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                "x": tf.train.Feature(
                    float_list=tf.train.FloatList(value=[5.0])
                )
            }
        )
    ).SerializeToString()
    parsed = next(
        iter(
            loaded.signatures["serve_examples"](
                examples=tf.constant([example])
            ).values()
        )
    )
    trained = layer(pre({"x": tf.constant([[5.0]], tf.float64)}))
    np.testing.assert_allclose(parsed.numpy(), trained.numpy(), rtol=1e-6)
