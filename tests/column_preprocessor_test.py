"""Exports without a preprocessor: the model's own columns make it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing
from tests.serving_cases import SERVED_RAW
from tests.serving_cases import model_with_a_dense_input
from tests.serving_cases import served_feeds
from tests.serving_cases import served_model


def test_export_without_preprocessor_takes_raw_features(tmp_path):
    """It wrote a signature of int64 ids (string features too) and no
    `serve_examples`: a reloaded model, whose preprocessor lived in
    tf.data, exported for ids a client never has."""
    _, pre, model = served_model(tmp_path)
    testing.fit_on_raw(model, pre, served_feeds())
    reloaded = str(tmp_path / "m.keras")
    model.save(reloaded)
    model = keras.models.load_model(reloaded)

    path = kte.export_saved_model(model, str(tmp_path / "raw"))
    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    specs = serve.structured_input_signature[1]
    assert sorted(specs) == sorted(SERVED_RAW)
    assert specs["user"].dtype == tf.string
    assert specs["tags"].dtype == tf.string
    want = model(pre(served_feeds()), training=False).numpy()
    np.testing.assert_allclose(
        serve(**served_feeds())["score"], want, atol=1e-6
    )

    example = tf.train.Example()
    for key, value in (("user", [b"u3"]), ("tags", [b"a", b"b"])):
        example.features.feature[key].bytes_list.value.extend(value)
    example.features.feature["tag_w"].float_list.value.extend([1.0, 2.0])
    example.features.feature["item"].int64_list.value.append(9)
    example.features.feature["hist"].int64_list.value.extend([1, 2])
    by_example = loaded.signatures["serve_examples"](
        examples=tf.constant([example.SerializeToString()])
    )["score"]
    one = {
        "user": tf.constant([["u3"]]),
        "tags": tf.constant([["a", "b"]]),
        "tag_w": tf.constant([[1.0, 2.0]]),
        "item": tf.constant([[9]], tf.int64),
        "hist": tf.constant([[1, 2]], tf.int64),
    }
    np.testing.assert_allclose(by_example, serve(**one)["score"], atol=1e-6)


def test_export_refuses_what_the_columns_cannot_feed(tmp_path):
    """A model input no embedding column produces (`age`), or a model
    without embedding layers, cannot be served from raw features by
    columns alone: the error says what to pass."""
    with pytest.raises(ValueError, match="'age'.*preprocessor=.*inputs='ids'"):
        kte.export_saved_model(model_with_a_dense_input(), str(tmp_path / "a"))
    inputs = keras.Input((1,), name="x")
    plain = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    with pytest.raises(ValueError, match="no embedding layer.*inputs='ids'"):
        kte.export_saved_model(plain, str(tmp_path / "b"))


def test_export_of_a_model_holding_its_preprocessor(tmp_path):
    """Its inputs are raw features already: exported with them."""
    country = kte.categorical_column_with_vocabulary_list(
        "country", ["us", "fr"], num_oov_buckets=1
    )
    columns = [kte.embedding_column(country, 2)]
    inputs = {"country": keras.Input((1,), dtype="string", name="country")}
    ids = kte.FeaturePreprocessor(columns)(inputs)
    x = kte.TPUEmbeddingLayer(columns, output="concat")(ids)
    model = keras.Model(inputs, keras.layers.Dense(1, name="score")(x))
    path = kte.export_saved_model(model, str(tmp_path / "e"))
    serve = tf.saved_model.load(path).signatures["serving_default"]
    assert serve.structured_input_signature[1]["country"].dtype == tf.string
    raw = {"country": tf.constant([["fr"], ["xx"]])}
    np.testing.assert_allclose(
        serve(**raw)["score"], model(raw, training=False), atol=1e-6
    )
