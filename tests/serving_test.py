"""Serving export: fresh-process reload, bit for bit, assets, no slots."""

import contextlib
import io
import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed._compat import keras
from keras_tpu_embed.serving.serving import EXPORT_INPUTS
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


@pytest.fixture(scope="module")
def served_export(tmp_path_factory):
    """`served_model` untrained, called once, and exported once (with
    `verbose`) for the tests that only read the export: the model, the
    preprocessor, the export's path and what the export printed."""
    _, pre, model = served_model(tmp_path_factory.mktemp("served"))
    model(pre(served_feeds()))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        export = kte.export_saved_model(
            model, str(tmp_path_factory.mktemp("export") / "e"), pre
        )
    return model, pre, export, printed.getvalue()


def test_export_holds_tables_not_slots(served_export):
    model, _, export, _ = served_export
    reader = tf.train.load_checkpoint(
        os.path.join(export, "variables", "variables")
    )
    saved = reader.get_variable_to_shape_map()
    shapes = sorted(tuple(s) for k, s in saved.items() if "VARIABLE_VALUE" in k)
    expected = sorted(tuple(w.shape) for w in testing.serving_weights(model))
    assert shapes == expected
    assert os.path.exists(os.path.join(export, "assets", "users.txt"))


def test_serve_casts_integer_ids_of_any_width(served_export):
    """The int64 signature refused int32 ids with TF's generic error."""
    _, _, export, _ = served_export
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


def test_export_prints_its_signatures_and_output_keys(
    served_export, tmp_path, capsys
):
    model, pre, path, printed = served_export
    assert path in printed
    assert "serving_default" in printed and "serve_examples" in printed
    assert "'score'" in printed
    assert "user: string" in printed
    kte.export_saved_model(model, str(tmp_path / "q"), pre, verbose=False)
    assert capsys.readouterr().out == ""


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


# --- One batch size per call, in every export variant ------------------------

EXPORT_OPTIONS = {
    "default": {},
    "jit_compile": {"jit_compile": True},
    "pad_batches": {"pad_batches": True},
    "bfloat16": {"table_dtype": "bfloat16"},
    "int8": {"table_dtype": "int8"},
    "tensor_core": {"lookup_device": "tpu_tensor_core"},
}
"""The export's options, each exported with every kind of input."""

EXPORT_VARIANTS = {
    f"{inputs}_{name}": dict(options, inputs=inputs)
    for inputs in EXPORT_INPUTS
    for name, options in EXPORT_OPTIONS.items()
}


def _user_and_item_model(inputs):
    """A model that adds a user's and an item's embedding (Keras'
    `Add` broadcasts one user row over a batch of items); from ids, with
    a numeric `age` input beside them too. Returns the model and a
    function from features to its inputs."""
    ident = kte.categorical_column_with_identity
    user, item = (
        kte.embedding_column(ident(key, size), 4, tensor_core_shape=[None, 1])
        for key, size in (("user", 10), ("item", 20))
    )
    if inputs == "raw":
        preprocessor = kte.FeaturePreprocessor([user, item])
        given = preprocessor.keras_inputs()
    else:
        given = {
            key: keras.Input((1,), dtype="int64", name=key)
            for key in ("user", "item")
        }
        given["age"] = keras.Input((1,), name="age")
        preprocessor = dict
    users = kte.TPUEmbeddingLayer([user], output="concat", name="users")
    items = kte.TPUEmbeddingLayer([item], output="concat", name="items")
    top = keras.layers.Add()([users(given), items(given)])
    if inputs == "ids":
        top = keras.layers.Concatenate()([top, given["age"]])
    model = keras.Model(given, keras.layers.Dense(1, name="score")(top))
    return model, preprocessor


def _feeds(inputs, batches, rank_3=()):
    """Features by key as `{"value": ..., "dtype": ...}`, each of its
    batch size in `batches` (4 where not given); those named in `rank_3`
    are `[batch, 1, 1]`."""
    rows = {"user": 3, "item": 7, "age": 0.5}
    keys = ["user", "item"] + (["age"] if inputs == "ids" else [])
    feeds = {}
    for key in keys:
        value = np.full([batches.get(key, 4), 1], rows[key])
        if key in rank_3:
            value = value[:, :, np.newaxis]
        dtype = "float32" if key == "age" else "int64"
        feeds[key] = {"value": value.tolist(), "dtype": dtype}
    return feeds


def _bad_calls(inputs):
    """Per name, features a served call must refuse naming them."""
    calls = {
        "one_user": _feeds(inputs, {"user": 1}),
        "two_items": _feeds(inputs, {"user": 3, "item": 2}),
        "rank_3_user": _feeds(inputs, {}, rank_3=("user",)),
    }
    if inputs == "ids":
        # An input no embedding layer reads, beside the lookups.
        calls["one_age"] = _feeds(inputs, {"age": 1})
    return calls


def _expected_refusal(call, feeds):
    """The refusal of a bad call: its rank-3 feature named, or every
    feature named with its batch size (in the signature's order, by key;
    Assert escapes the quotes of its message)."""
    if call.startswith("rank_3_"):
        key = call[len("rank_3_") :]
        return (
            rf"(Shape of tensor {key} \[4,1,1\] is not compatible|"
            rf"Feature .{{1,2}}{key}.{{1,2}} must be \[batch\] or \[batch, n\])"
        )
    keys = sorted(feeds)
    names = ", ".join(f".{{1,2}}{key}.{{1,2}}" for key in keys)
    sizes = " ".join(str(len(feeds[key]["value"])) for key in keys)
    return (
        rf"Features {names} must each hold one row per example(.|\n)*"
        rf"in that order:\] \[{sizes}\]"
    )


# Loads each SavedModel with TensorFlow only and calls it with each feed;
# prints per variant and call the outputs or the error's type and message.
CALLS_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
jobs = json.loads(open(sys.argv[1]).read())

def unhex(value):
    if isinstance(value, list):
        return [unhex(v) for v in value]
    return bytes.fromhex(value)

results = {}
for variant, path, signature, calls in jobs:
    serve = tf.saved_model.load(path).signatures[signature]
    results[variant] = {}
    for name, raw in calls.items():
        feeds = {}
        for key, value in raw.items():
            if value["dtype"] == "hex":
                feeds[key] = tf.constant(unhex(value["value"]), tf.string)
            else:
                dtype = getattr(tf, value["dtype"])
                feeds[key] = tf.constant(value["value"], dtype)
        try:
            out = serve(**feeds)
            results[variant][name] = {"outputs": {
                k: v.numpy().astype(np.float64).tolist()
                for k, v in out.items()}}
        except Exception as error:
            results[variant][name] = {
                "error": type(error).__name__,
                "message": getattr(error, "message", str(error))}
print(json.dumps(results))
assert "keras_tpu_embed" not in sys.modules
"""


def _example_calls():
    """`serve_examples` calls: a good one, and `examples` of rank 2 and 0."""
    one = (
        tf.train.Example(
            features=tf.train.Features(
                feature={
                    key: tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[v])
                    )
                    for key, v in (("user", 3), ("item", 7))
                }
            )
        )
        .SerializeToString()
        .hex()
    )
    return {
        name: {"examples": {"value": value, "dtype": "hex"}}
        for name, value in (
            ("good", [one] * 4),
            ("rank_2", [[one]] * 2),
            ("scalar", one),
        )
    }


@pytest.fixture(scope="module")
def served_calls(tmp_path_factory):
    """Every export variant of `_user_and_item_model`, called with its bad
    feeds (and one good one) from one fresh process that loads them with
    TensorFlow alone: per variant (and `<variant>/examples` for
    `serve_examples`) and call, its outputs or its error; and per variant,
    the model's own answer to the good call."""
    root = tmp_path_factory.mktemp("variants")
    jobs, wanted = [], {}
    for variant, options in EXPORT_VARIANTS.items():
        inputs = options["inputs"]
        model, model_inputs = _user_and_item_model(inputs)
        path = str(root / variant)
        kte.export_saved_model(model, path, verbose=False, **options)
        good = _feeds(inputs, {})
        wanted[variant] = model(
            model_inputs(testing.feeds(good)), training=False
        ).numpy()
        calls = dict(_bad_calls(inputs), good=good)
        jobs.append([variant, path, "serving_default", calls])
        if inputs == "raw":
            examples = [f"{variant}/examples", path, "serve_examples"]
            jobs.append(examples + [_example_calls()])
    listing = root / "jobs.json"
    listing.write_text(json.dumps(jobs))
    completed = testing.run_python(
        "-c", CALLS_SCRIPT, str(listing), TF_CPP_MIN_LOG_LEVEL="3"
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1]), wanted


@pytest.mark.parametrize("variant", EXPORT_VARIANTS)
def test_every_variant_refuses_features_of_other_batch_sizes(
    served_calls, variant
):
    """Issue 41 (6, 13): the bare signature broadcast one user's row over
    a batch of items (`Add`), or failed with a `ConcatOp` / `PadV2` error
    naming no feature."""
    results, wanted = served_calls
    served = results[variant]
    inputs = EXPORT_VARIANTS[variant]["inputs"]
    for call, feeds in _bad_calls(inputs).items():
        assert served[call].get("error") == "InvalidArgumentError", (
            call,
            served[call],
        )
        expected = _expected_refusal(call, feeds)
        assert re.search(expected, served[call]["message"]), (
            call,
            served[call]["message"],
        )
    quantized = EXPORT_VARIANTS[variant].get("table_dtype")
    np.testing.assert_allclose(
        served["good"]["outputs"]["score"],
        wanted[variant],
        atol=0.02 if quantized else 1e-5,
    )


@pytest.mark.parametrize(
    "variant", [v for v, o in EXPORT_VARIANTS.items() if o["inputs"] == "raw"]
)
def test_serve_examples_takes_one_batch_and_names_another_rank(
    served_calls, variant
):
    """Every feature parsed from one `[batch]` tensor of examples has its
    batch size, so a call cannot disagree on it; `examples` of another
    rank failed in the parser (rank 2, naming `serialized`) or in a
    lookup (a scalar, naming nothing)."""
    results, wanted = served_calls
    served = results[f"{variant}/examples"]
    quantized = EXPORT_VARIANTS[variant].get("table_dtype")
    np.testing.assert_allclose(
        served["good"]["outputs"]["score"],
        wanted[variant],
        atol=0.02 if quantized else 1e-5,
    )
    for call, shape in (("rank_2", r"\[2,1\]"), ("scalar", r"\[\]")):
        assert served[call].get("error") == "InvalidArgumentError"
        assert re.search(
            rf"Shape of tensor examples {shape} is not compatible with "
            r"expected shape \[\?\]",
            served[call]["message"],
        ), served[call]["message"]
