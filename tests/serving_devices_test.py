"""The serving switch: cpu and tensor-core exports, tf.Example input, size."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import serving_cases
from tests import testing

RAW = {
    "country": {
        "value": [["us", ""], ["fr", "de"], ["zz", ""]],
        "dtype": "string",
    },
    "tags": {
        "value": [["a", "b", ""], ["c", "", ""], ["", "", ""]],
        "dtype": "string",
    },
    "tag_w": {
        "value": [[1.0, 2.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]],
        "dtype": "float32",
    },
    "hist": {
        "value": [[1, 2, 3, 4], [5, -1, -1, -1], [-1, -1, -1, -1]],
        "dtype": "int64",
    },
}


def _feeds():
    return testing.feeds(RAW)


def _model(serving_lookup_device=None, column_device=None):
    shape = lambda width: dict(  # noqa: E731
        tensor_core_shape=[None, width], embedding_lookup_device=column_device
    )
    country = kte.embedding_column(
        kte.categorical_column_with_vocabulary_list(
            "country", ["us", "fr", "de"], num_oov_buckets=1
        ),
        4,
        **shape(2),
    )
    tags = kte.embedding_column(
        kte.weighted_categorical_column(
            kte.categorical_column_with_hash_bucket("tags", 20), "tag_w"
        ),
        3,
        combiner="sqrtn",
        **shape(3),
    )
    hist = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("hist", 10),
        2,
        max_sequence_length=3,
        **shape(3),
    )
    columns = [country, tags, hist]
    pre = kte.FeaturePreprocessor(columns)
    inputs = pre.keras_inputs()
    out = kte.TPUEmbeddingLayer(
        columns,
        serving_lookup_device=serving_lookup_device,
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
    )(inputs)
    x = keras.layers.Concatenate()(
        [
            out["country_embedding"],
            out["tags_weighted_by_tag_w_embedding"],
            keras.layers.Flatten()(out["hist_embedding"]),
        ]
    )
    model = keras.Model(inputs, keras.layers.Dense(1, name="score")(x))
    model.compile("adam", "mse")
    testing.fit_on_raw(model, pre, _feeds())
    return pre, model


def _graph(path):
    with open(os.path.join(path, "saved_model.pb"), "rb") as handle:
        return handle.read()


def _uses_xla(path):
    return b"_XlaMustCompile" in _graph(path)


def _has_sparse_lookup(path):
    """The cpu export keeps the sparse lookup for batches that do not pad;
    the tensor-core export has none."""
    graph = _graph(path)
    return b"UnsortedSegment" in graph or b"SparseSegment" in graph


# Training and exporting dominate this file: each model below is trained
# once and each export made once per module, and every export that must be
# served by TensorFlow alone is served by one fresh process for all.


@pytest.fixture(scope="module")
def default_model():
    """`_model()` trained, and its eager outputs on `RAW`."""
    pre, model = _model()
    return pre, model, model(pre(_feeds())).numpy()


@pytest.fixture(scope="module")
def default_exports(default_model, tmp_path_factory):
    """`_model()`'s exports by name: "cpu" (no lookup_device given, the
    default) and "core" (`lookup_device="tpu_tensor_core"`)."""
    pre, model, _ = default_model
    root = tmp_path_factory.mktemp("default_exports")
    return {
        "cpu": kte.export_saved_model(model, str(root / "cpu"), pre),
        "core": kte.export_saved_model(
            model, str(root / "core"), pre, lookup_device="tpu_tensor_core"
        ),
    }


@pytest.fixture(scope="module")
def tensor_core_trained(tmp_path_factory):
    """A model whose columns train on the tensor core: its eager outputs
    and its exports by serving device ("cpu", "tpu_tensor_core")."""
    pre, model = _model(column_device="tpu_tensor_core")
    eager = model(pre(_feeds())).numpy()
    root = tmp_path_factory.mktemp("tensor_core_trained")
    exports = {
        device: kte.export_saved_model(
            model, str(root / device), pre, lookup_device=device
        )
        for device in ("cpu", "tpu_tensor_core")
    }
    return eager, exports


@pytest.fixture(scope="module")
def served_in_fresh_process(
    default_exports, tensor_core_trained, tmp_path_factory
):
    """Per export path, its "score" on `RAW`, served by one fresh process
    that loads every export with TensorFlow alone."""
    paths = [*default_exports.values(), *tensor_core_trained[1].values()]
    results = serving_cases.serve_many_in_fresh_process(
        [(path, RAW) for path in paths], tmp_path_factory.mktemp("serve")
    )
    return {path: result["score"] for path, result in zip(paths, results)}


def test_cpu_and_tensor_core_exports_agree(
    default_model, default_exports, served_in_fresh_process
):
    _, _, eager = default_model
    cpu, core = default_exports["cpu"], default_exports["core"]
    # Both compile their lookups; only the cpu export can fall back.
    assert _uses_xla(cpu) and _uses_xla(core)
    assert _has_sparse_lookup(cpu) and not _has_sparse_lookup(core)
    for path in (cpu, core):
        np.testing.assert_allclose(
            served_in_fresh_process[path], eager, atol=1e-6, err_msg=path
        )


def test_layer_switch_picks_the_serving_device(tmp_path):
    pre, model = _model(serving_lookup_device="tpu_tensor_core")
    path = kte.export_saved_model(model, str(tmp_path / "e"), pre)
    assert not _has_sparse_lookup(path)
    # One override for all wins over the layer's choice.
    path = kte.export_saved_model(
        model, str(tmp_path / "c"), pre, lookup_device="cpu"
    )
    assert _has_sparse_lookup(path)


def test_tensor_core_trained_model_exports_to_both(
    tensor_core_trained, served_in_fresh_process
):
    eager, exports = tensor_core_trained
    for device, path in exports.items():
        np.testing.assert_allclose(
            served_in_fresh_process[path], eager, atol=1e-6, err_msg=device
        )


def test_embedding_core_column_needs_a_serving_choice(tmp_path):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("i", 5),
        2,
        embedding_lookup_device="tpu_embedding_core",
    )
    inputs = {"i": keras.Input((None,), dtype="int64", name="i")}
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    model = keras.Model(inputs, layer(inputs))
    with pytest.raises(
        ValueError, match="'i_embedding'.*not valid for serving"
    ):
        kte.export_saved_model(model, str(tmp_path / "x"))
    kte.export_saved_model(
        model, str(tmp_path / "y"), lookup_device="cpu", inputs="ids"
    )


def _example(row):
    feature = {}
    for key, spec in RAW.items():
        values = spec["value"][row]
        if spec["dtype"] == "string":
            kept = [v.encode() for v in values if v]
            feature[key] = tf.train.Feature(
                bytes_list=tf.train.BytesList(value=kept)
            )
        elif spec["dtype"] == "int64":
            kept = [v for v in values if v != -1]
            feature[key] = tf.train.Feature(
                int64_list=tf.train.Int64List(value=kept)
            )
        else:
            ids = RAW["tags"]["value"][row]
            kept = [w for w, i in zip(values, ids) if i]
            feature[key] = tf.train.Feature(
                float_list=tf.train.FloatList(value=kept)
            )
    return tf.train.Example(
        features=tf.train.Features(feature=feature)
    ).SerializeToString()


def test_serve_examples_matches_raw_features(default_exports):
    loaded = tf.saved_model.load(default_exports["cpu"])
    raw = loaded.signatures["serving_default"](**_feeds())["score"]
    examples = tf.constant([_example(row) for row in range(3)])
    parsed = loaded.signatures["serve_examples"](examples=examples)["score"]
    np.testing.assert_allclose(parsed, raw, atol=1e-6)


def test_saved_model_holds_tables_once_and_no_slots(
    default_model, default_exports
):
    _, model, _ = default_model
    path = default_exports["cpu"]
    reader = tf.train.load_checkpoint(
        os.path.join(path, "variables", "variables")
    )
    saved = [
        reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if key != "_CHECKPOINTABLE_OBJECT_GRAPH"
    ]
    # Each serving weight (tables and the head) exactly once, nothing else:
    # a slot, or a second copy of a table, is one saved tensor too many.
    # Adagrad's accumulators differ from every table after the fit.
    wanted = [w.numpy() for w in testing.serving_weights(model)]
    assert len(saved) == len(wanted), (
        sorted(reader.get_variable_to_shape_map()),
        [w.path for w in testing.serving_weights(model)],
    )
    for want in wanted:
        copies = [
            got
            for got in saved
            if got.shape == want.shape and np.array_equal(got, want)
        ]
        assert len(copies) == 1, (want.shape, len(copies))


def test_outputs_follow_the_dtype_policy():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        for device in (None, "tpu_tensor_core"):
            column = kte.embedding_column(
                kte.categorical_column_with_identity("i", 5),
                2,
                embedding_lookup_device=device,
                tensor_core_shape=[None, 2],
            )
            layer = kte.TPUEmbeddingLayer([column])
            out = layer({"i": tf.constant([[1, 2]])})["i_embedding"]
            assert out.dtype == tf.bfloat16, device
            assert layer.table_variable("i").dtype == "float32"
    finally:
        keras.config.set_dtype_policy(previous)
