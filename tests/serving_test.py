"""Serving export: fresh-process reload, bit for bit, assets, no slots."""

import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing


def _build(tmp_path):
    """The vocabulary file `tmp_path/users.txt`, the preprocessor, the model."""
    vocabulary = tmp_path / "users.txt"
    vocabulary.write_text("u1\nu2\nu3\n")
    user = kte.categorical_column_with_vocabulary_file(
        "user", str(vocabulary), num_oov_buckets=1
    )
    tags = kte.weighted_categorical_column(
        kte.categorical_column_with_hash_bucket("tags", 20), "tag_w"
    )
    hist = kte.sequence_categorical_column_with_identity("hist", 10)
    item = kte.categorical_column_with_identity("item", 10)
    own = [
        kte.embedding_column(user, 4),
        kte.embedding_column(tags, 3, combiner="sqrtn"),
    ]
    shared = kte.shared_embedding_columns(
        [item, hist], 5, max_sequence_lengths=[0, 3]
    )
    pre = kte.FeaturePreprocessor(own + shared)
    config = kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1))
    inputs = pre.keras_inputs()
    a = kte.TPUEmbeddingLayer(own, config=config, output="concat")(inputs)
    s = kte.SharedTPUEmbedding(shared, config=config)(inputs)
    x = keras.layers.Concatenate()(
        [
            a,
            s["item_shared_embedding"],
            keras.layers.Flatten()(s["hist_shared_embedding"]),
        ]
    )
    model = keras.Model(inputs, keras.layers.Dense(1, name="score")(x))
    model.compile("adam", "mse")
    return vocabulary, pre, model


RAW = {
    "user": {"value": ["u1", "nobody", "u3"], "dtype": "string"},
    "tags": {"value": [["a", "b"], ["c", ""], ["", ""]], "dtype": "string"},
    "tag_w": {
        "value": [[1.0, 2.0], [0.5, 0.0], [0.0, 0.0]],
        "dtype": "float32",
    },
    "item": {"value": [1, 2, 9], "dtype": "int64"},
    "hist": {
        "value": [[1, 2, 3, 4], [5, -1, -1, -1], [-1, -1, -1, -1]],
        "dtype": "int64",
    },
}


def _feeds():
    return testing.feeds(RAW)


def test_export_reload_in_fresh_process(tmp_path):
    vocabulary, pre, model = _build(tmp_path)
    testing.fit_on_raw(model, pre, _feeds())
    eager = model(pre(_feeds()), training=False).numpy()

    export = str(tmp_path / "export")
    kte.export_saved_model(model, export, preprocessor=pre)
    in_process = (
        tf.saved_model.load(export)
        .signatures["serving_default"](**_feeds())["score"]
        .numpy()
    )
    np.testing.assert_allclose(in_process, eager, atol=1e-6)

    # Moving and editing the original vocabulary changes nothing.
    vocabulary.write_text("u3\nu2\nu1\n")
    moved = tmp_path / "moved"
    shutil.move(export, moved)
    fresh = testing.serve_in_fresh_process(moved, RAW)["score"]
    np.testing.assert_array_equal(fresh.astype(np.float32), in_process)


def test_export_holds_tables_not_slots(tmp_path):
    _, pre, model = _build(tmp_path)
    model(pre(_feeds()))
    export = str(tmp_path / "export")
    kte.export_saved_model(model, export, preprocessor=pre)
    reader = tf.train.load_checkpoint(
        os.path.join(export, "variables", "variables")
    )
    saved = reader.get_variable_to_shape_map()
    shapes = sorted(tuple(s) for k, s in saved.items() if "VARIABLE_VALUE" in k)
    expected = sorted(tuple(w.shape) for w in testing.serving_weights(model))
    assert shapes == expected
    assert os.path.exists(os.path.join(export, "assets", "users.txt"))


def test_serving_signature_names_raw_features(tmp_path):
    _, pre, model = _build(tmp_path)
    export = kte.export_saved_model(
        model, str(tmp_path / "e"), preprocessor=pre
    )
    signature = tf.saved_model.load(export).signatures["serving_default"]
    assert sorted(signature.structured_input_signature[1]) == sorted(RAW)
    # A single-valued feature is accepted as [batch] and as [batch, 1].
    feeds = _feeds()
    feeds["item"] = feeds["item"][:, tf.newaxis]
    np.testing.assert_array_equal(
        signature(**feeds)["score"], signature(**_feeds())["score"]
    )


def test_serve_casts_integer_ids_of_any_width(tmp_path):
    """The int64 signature refused int32 ids with TF's generic error."""
    _, pre, model = _build(tmp_path)
    export = kte.export_saved_model(
        model, str(tmp_path / "e"), preprocessor=pre
    )
    loaded = kte.load_saved_model(export)
    want = loaded.signatures["serving_default"](**_feeds())["score"]
    for dtype in (tf.int32, tf.int16, tf.uint8, tf.uint32):
        feeds = _feeds()
        feeds["item"] = tf.cast(feeds["item"], dtype)
        feeds["hist"] = tf.cast(tf.maximum(feeds["hist"], 0), dtype)
        expected_feeds = _feeds()
        expected_feeds["hist"] = tf.maximum(expected_feeds["hist"], 0)
        expected = loaded.signatures["serving_default"](**expected_feeds)
        np.testing.assert_array_equal(
            loaded.serve(**feeds)["score"], expected["score"]
        )
    # numpy int32 and Python lists too; int weights become float32.
    feeds = {k: np.asarray(v["value"]) for k, v in RAW.items()}
    feeds["item"] = feeds["item"].astype(np.int32)
    np.testing.assert_array_equal(loaded.serve(**feeds)["score"], want)
    with pytest.raises(TypeError, match="Feature 'item'.*float64"):
        loaded.serve(**dict(feeds, item=np.array([1.0, 2.0, 9.0])))
    with pytest.raises(ValueError, match="Feature 'item'.*2\\*\\*63"):
        loaded.serve(**dict(feeds, item=np.array([2**63, 1, 1], np.uint64)))
    with pytest.raises(KeyError, match="Missing feature 'item'"):
        loaded.serve(**{k: v for k, v in feeds.items() if k != "item"})


def test_export_passes_the_model_only_its_own_inputs(tmp_path):
    """A preprocessor with more columns than the model gave the model an
    extra key, which Keras matched by position: `b` served `a`'s row."""
    a = kte.embedding_column(kte.categorical_column_with_identity("a", 10), 2)
    b = kte.embedding_column(kte.categorical_column_with_identity("b", 10), 2)
    inputs = kte.FeaturePreprocessor([b]).keras_inputs()
    layer = kte.TPUEmbeddingLayer([b], output="concat")
    model = keras.Model(inputs, layer(inputs))
    path = kte.export_saved_model(
        model, str(tmp_path / "e"), preprocessor=kte.FeaturePreprocessor([a, b])
    )
    serve = kte.load_saved_model(path).signatures["serving_default"]
    out = serve(a=tf.constant([5], tf.int64), b=tf.constant([1], tf.int64))
    np.testing.assert_allclose(
        next(iter(out.values()))[0], layer.table_variable("b").numpy()[1]
    )


def test_export_refuses_a_model_input_the_preprocessor_lacks(tmp_path):
    b = kte.embedding_column(kte.categorical_column_with_identity("b", 10), 2)
    c = kte.embedding_column(kte.categorical_column_with_identity("c", 10), 2)
    inputs = kte.FeaturePreprocessor([b, c]).keras_inputs()
    layer = kte.TPUEmbeddingLayer([b, c], output="concat")
    model = keras.Model(inputs, layer(inputs))
    with pytest.raises(KeyError, match="'c'"):
        kte.export_saved_model(
            model,
            str(tmp_path / "e"),
            preprocessor=kte.FeaturePreprocessor([b]),
        )


def test_export_without_preprocessor_takes_raw_features(tmp_path):
    """It wrote a signature of int64 ids (string features too) and no
    `serve_examples`: a reloaded model, whose preprocessor lived in
    tf.data, exported for ids a client never has."""
    _, pre, model = _build(tmp_path)
    testing.fit_on_raw(model, pre, _feeds())
    reloaded = str(tmp_path / "m.keras")
    model.save(reloaded)
    model = keras.models.load_model(reloaded)

    path = kte.export_saved_model(model, str(tmp_path / "raw"))
    loaded = tf.saved_model.load(path)
    serve = loaded.signatures["serving_default"]
    specs = serve.structured_input_signature[1]
    assert sorted(specs) == sorted(RAW)
    assert specs["user"].dtype == tf.string
    assert specs["tags"].dtype == tf.string
    want = model(pre(_feeds()), training=False).numpy()
    np.testing.assert_allclose(serve(**_feeds())["score"], want, atol=1e-6)

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


def _model_with_a_dense_input():
    item = kte.categorical_column_with_identity("item", 10)
    pre = kte.FeaturePreprocessor([kte.embedding_column(item, 2)])
    inputs = dict(pre.keras_inputs(), age=keras.Input((1,), name="age"))
    layer = kte.TPUEmbeddingLayer(
        [kte.embedding_column(item, 2)], output="concat"
    )
    x = keras.layers.Concatenate()([layer(inputs), inputs["age"]])
    return keras.Model(inputs, keras.layers.Dense(1, name="score")(x))


def test_export_refuses_what_the_columns_cannot_feed(tmp_path):
    """A model input no embedding column produces (`age`), or a model
    without embedding layers, cannot be served from raw features by
    columns alone: the error says what to pass."""
    with pytest.raises(ValueError, match="'age'.*preprocessor=.*inputs='ids'"):
        kte.export_saved_model(_model_with_a_dense_input(), str(tmp_path / "a"))
    inputs = keras.Input((1,), name="x")
    plain = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    with pytest.raises(ValueError, match="no embedding layer.*inputs='ids'"):
        kte.export_saved_model(plain, str(tmp_path / "b"))


def test_export_of_ids_is_an_explicit_choice(tmp_path):
    model = _model_with_a_dense_input()
    path = kte.export_saved_model(model, str(tmp_path / "ids"), inputs="ids")
    serve = tf.saved_model.load(path).signatures["serving_default"]
    specs = serve.structured_input_signature[1]
    assert sorted(specs) == ["age", "item"]
    assert specs["item"].dtype == tf.int64
    with pytest.raises(ValueError, match="inputs.*'raw'.*'ids'.*'features'"):
        kte.export_saved_model(model, str(tmp_path / "x"), inputs="features")
    layer = next(
        x for x in model.layers if isinstance(x, kte.TPUEmbeddingLayer)
    )
    pre = kte.FeaturePreprocessor(layer.columns)
    with pytest.raises(ValueError, match="preprocessor=.*inputs='ids'"):
        kte.export_saved_model(
            model, str(tmp_path / "y"), preprocessor=pre, inputs="ids"
        )


def test_export_prints_its_signatures_and_output_keys(tmp_path, capsys):
    _, pre, model = _build(tmp_path)
    path = kte.export_saved_model(model, str(tmp_path / "e"), pre)
    printed = capsys.readouterr().out
    assert path in printed
    assert "serving_default" in printed and "serve_examples" in printed
    assert "'score'" in printed
    assert "user: string" in printed
    kte.export_saved_model(model, str(tmp_path / "q"), pre, verbose=False)
    assert capsys.readouterr().out == ""


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
