"""Serving export: fresh-process reload, bit for bit, assets, no slots."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing
from tests.serving_cases import SERVED_RAW
from tests.serving_cases import model_with_a_dense_input
from tests.serving_cases import served_feeds
from tests.serving_cases import served_model


def test_export_reload_in_fresh_process(tmp_path):
    vocabulary, pre, model = served_model(tmp_path)
    testing.fit_on_raw(model, pre, served_feeds())
    eager = model(pre(served_feeds()), training=False).numpy()

    export = str(tmp_path / "export")
    kte.export_saved_model(model, export, preprocessor=pre)
    in_process = (
        tf.saved_model.load(export)
        .signatures["serving_default"](**served_feeds())["score"]
        .numpy()
    )
    np.testing.assert_allclose(in_process, eager, atol=1e-6)

    # Moving and editing the original vocabulary changes nothing.
    vocabulary.write_text("u3\nu2\nu1\n")
    moved = tmp_path / "moved"
    shutil.move(export, moved)
    fresh = testing.serve_in_fresh_process(moved, SERVED_RAW)["score"]
    np.testing.assert_array_equal(fresh.astype(np.float32), in_process)


def test_export_holds_tables_not_slots(tmp_path):
    _, pre, model = served_model(tmp_path)
    model(pre(served_feeds()))
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


def test_serve_casts_integer_ids_of_any_width(tmp_path):
    """The int64 signature refused int32 ids with TF's generic error."""
    _, pre, model = served_model(tmp_path)
    export = kte.export_saved_model(
        model, str(tmp_path / "e"), preprocessor=pre
    )
    loaded = kte.load_saved_model(export)
    want = loaded.signatures["serving_default"](**served_feeds())["score"]
    for dtype in (tf.int32, tf.int16, tf.uint8, tf.uint32):
        feeds = served_feeds()
        feeds["item"] = tf.cast(feeds["item"], dtype)
        feeds["hist"] = tf.cast(tf.maximum(feeds["hist"], 0), dtype)
        expected_feeds = served_feeds()
        expected_feeds["hist"] = tf.maximum(expected_feeds["hist"], 0)
        expected = loaded.signatures["serving_default"](**expected_feeds)
        np.testing.assert_array_equal(
            loaded.serve(**feeds)["score"], expected["score"]
        )
    # numpy int32 and Python lists too; int weights become float32.
    feeds = {k: np.asarray(v["value"]) for k, v in SERVED_RAW.items()}
    feeds["item"] = feeds["item"].astype(np.int32)
    np.testing.assert_array_equal(loaded.serve(**feeds)["score"], want)
    with pytest.raises(TypeError, match="Feature 'item'.*float64"):
        loaded.serve(**dict(feeds, item=np.array([1.0, 2.0, 9.0])))
    with pytest.raises(ValueError, match="Feature 'item'.*2\\*\\*63"):
        loaded.serve(**dict(feeds, item=np.array([2**63, 1, 1], np.uint64)))
    with pytest.raises(KeyError, match="Missing feature 'item'"):
        loaded.serve(**{k: v for k, v in feeds.items() if k != "item"})


def test_export_of_ids_is_an_explicit_choice(tmp_path):
    model = model_with_a_dense_input()
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
    _, pre, model = served_model(tmp_path)
    path = kte.export_saved_model(model, str(tmp_path / "e"), pre)
    printed = capsys.readouterr().out
    assert path in printed
    assert "serving_default" in printed and "serve_examples" in printed
    assert "'score'" in printed
    assert "user: string" in printed
    kte.export_saved_model(model, str(tmp_path / "q"), pre, verbose=False)
    assert capsys.readouterr().out == ""
