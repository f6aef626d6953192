"""Numerics against legacy feature columns (`tf_keras` DenseFeatures).

The reference runs in a subprocess with `TF_USE_LEGACY_KERAS=1`
(`legacy_reference.py`); both sides build the same `tf.feature_column`
columns from `reference_cases.py`, load the same table values and read the
same raw features. Our side converts the TF columns, so this also checks the
conversion. Every column kind, combiner and input form must agree to 1e-6.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed import columns as column_conversion
from keras_tpu_embed.columns import input_keys
from tests import reference_cases as cases
from tests import serving_cases
from tests import testing

pytestmark = pytest.mark.filterwarnings("ignore:FeaturePreprocessor ignores")

HERE = os.path.dirname(os.path.abspath(__file__))
FORMS = ("ragged", "sparse", "dense")
DEVICES = ["cpu", "tpu_tensor_core"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    work = tmp_path_factory.mktemp("legacy")
    output = work / "reference.npz"
    completed = testing.run_python(
        os.path.join(HERE, "legacy_reference.py"),
        str(work),
        str(output),
        timeout=600,
        TF_USE_LEGACY_KERAS="1",
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    values = dict(np.load(output))
    return values, cases.write_vocabulary(str(work))


def raw_features(form):
    features = {}
    for key, rows in cases.RAW.items():
        if key in cases.STRING_KEYS:
            dtype, pad = tf.string, ""
        elif key in cases.WEIGHT_KEYS:
            dtype, pad = tf.float32, 0.0
        else:
            dtype, pad = tf.int64, -1
        ragged = tf.ragged.constant(rows, dtype=dtype, ragged_rank=1)
        if form == "ragged":
            features[key] = ragged
        elif form == "sparse":
            features[key] = ragged.to_sparse()
        else:
            features[key] = ragged.to_tensor(default_value=pad)
    for key, rows in cases.NUMERIC.items():
        features[key] = tf.constant(rows, tf.float32)
    return features


def embed(columns, form, table_names=None):
    layer = kte.TPUEmbeddingLayer(columns, return_sequence_lengths=True)
    pre = kte.FeaturePreprocessor(columns)
    layer.build()
    for table in layer.table_specs:
        variable = layer.table_variable(table.name)
        variable.assign(cases.table_values(table.name, variable.shape))
    return layer(pre(raw_features(form)))


@pytest.mark.parametrize("form", FORMS)
def test_dense_features_match(reference, form):
    expected, vocabulary = reference
    for column in cases.dense_columns(vocabulary):
        ours = embed([column], form)
        name = column.name
        np.testing.assert_allclose(
            ours[name].numpy(),
            expected[name],
            atol=1e-6,
            rtol=0,
            err_msg=f"{name} ({form})",
        )


@pytest.mark.parametrize("form", FORMS)
def test_weighted_sum_keeps_non_positive_weights(reference, form):
    expected, _ = reference
    column = cases.weighted_sum_column()
    ours = embed([column], form)
    np.testing.assert_allclose(
        ours[column.name].numpy(), expected[column.name + "__sum"], atol=1e-6
    )


@pytest.mark.parametrize("form", FORMS)
def test_shared_embeddings_match(reference, form):
    expected, _ = reference
    shared = kte.shared_embedding_columns(
        cases.shared_categorical_columns(), 5, combiner="mean"
    )
    assert shared[0].table_name == "s1_s2_shared_embedding"
    ours = embed(shared, form)
    for column in shared:
        np.testing.assert_allclose(
            ours[column.name].numpy(), expected[column.name], atol=1e-6
        )


@pytest.mark.parametrize("form", FORMS)
def test_sequence_features_match_padded_and_truncated(reference, form):
    expected, _ = reference
    for tf_column, max_length in cases.sequence_columns():
        for column in (
            kte.embedding_column(
                tf_column.categorical_column,
                tf_column.dimension,
                max_sequence_length=max_length,
                max_norm=tf_column.max_norm,
                embedding_lookup_device=device,
            )
            for device in (None, "tpu_tensor_core")
        ):
            _check_sequence(expected, tf_column, column, max_length, form)


def _check_sequence(expected, tf_column, column, max_length, form):
    ours = embed([column], form)
    want = expected[tf_column.name]
    padded = np.zeros((want.shape[0], max_length, want.shape[2]))
    keep = min(max_length, want.shape[1])
    padded[:, :keep] = want[:, :keep]
    np.testing.assert_allclose(
        ours[column.name].numpy(),
        padded,
        atol=1e-6,
        err_msg=f"{column.name} ({form})",
    )
    np.testing.assert_array_equal(
        ours[column.name + "_sequence_length"].numpy(),
        np.minimum(expected[tf_column.name + "__length"], max_length),
    )


def _tensor_core(tf_column, width=3, categorical=None):
    """The same column on the dense XLA (`tpu_tensor_core`) lookup."""
    return kte.embedding_column(
        categorical or tf_column.categorical_column,
        tf_column.dimension,
        combiner=tf_column.combiner,
        max_norm=tf_column.max_norm,
        embedding_lookup_device="tpu_tensor_core",
        tensor_core_shape=[None, width],
    )


@pytest.mark.parametrize("form", FORMS)
def test_max_norm_clips_rows_before_combining(reference, form):
    expected, _ = reference
    for tf_column in cases.max_norm_columns():
        name = tf_column.name
        for column in (tf_column, _tensor_core(tf_column)):
            ours = embed([column], form)
            np.testing.assert_allclose(
                ours[name].numpy(),
                expected[name],
                atol=1e-6,
                rtol=0,
                err_msg=f"{name} ({form}, {column})",
            )


def _dense_raw(keys):
    raw = {}
    for key in keys:
        if key in cases.WEIGHT_KEYS:
            dtype, pad = "float32", 0.0
        else:
            dtype, pad = "int64", -1
        rows = cases.RAW[key]
        width = max(len(r) for r in rows)
        raw[key] = {
            "value": [list(r) + [pad] * (width - len(r)) for r in rows],
            "dtype": dtype,
        }
    return raw


@pytest.mark.parametrize("device", DEVICES)
def test_max_norm_survives_serving_export(served_exports, reference, device):
    expected, _ = reference
    columns, served = served_exports["max_norm", device]
    for column in columns:
        np.testing.assert_allclose(
            served[column.name],
            expected[column.name],
            atol=1e-6,
            rtol=0,
            err_msg=f"{column.name} ({device})",
        )


@pytest.mark.parametrize("form", FORMS)
def test_bucketized_and_crossed_ids_are_tfs(reference, form):
    expected, _ = reference
    for tf_column in cases.derived_columns():
        name = tf_column.name
        # TF crosses a dense input's padding like a value (see crossed_ids).
        want = expected[name + ("__dense" if form == "dense" else "")]
        # A converted crossed column declares its keys strings and refuses
        # the integer "ci": that one is built with its key declared.
        declared = _declared_integer_cross(tf_column)
        on_cpu = tf_column
        if declared is not None:
            on_cpu = kte.embedding_column(
                declared, tf_column.dimension, combiner=tf_column.combiner
            )
        for column in (on_cpu, _tensor_core(tf_column, 9, declared)):
            ours = embed([column], form)
            np.testing.assert_allclose(
                ours[name].numpy(),
                want,
                atol=1e-6,
                rtol=0,
                err_msg=f"{name} ({form}, {column})",
            )


def _declared_integer_cross(tf_column):
    keys = getattr(tf_column.categorical_column, "keys", ())
    if "ci" not in keys:
        return None
    return kte.crossed_column(["ci", "cb"], 50, key_dtypes=["int64", "string"])


def _served_derived_columns():
    """The derived columns for export; the integer crossed key declared."""
    columns = []
    for tf_column in cases.derived_columns():
        categorical = column_conversion.to_categorical_column(
            tf_column.categorical_column
        )
        if "ci" in getattr(categorical, "keys", ()):
            categorical = kte.crossed_column(
                ["ci", "cb"], 50, key_dtypes=["int64", "string"]
            )
        columns.append(_tensor_core(tf_column, 9, categorical))
    return columns


def _derived_raw(pre):
    """The derived columns' raw features, strings and ids padded dense."""
    raw = {}
    for key in pre.expected_keys:
        if key in cases.NUMERIC:
            raw[key] = {"value": cases.NUMERIC[key], "dtype": "float32"}
        else:
            rows = cases.RAW[key]
            pad = "" if key in cases.STRING_KEYS else -1
            width = max(len(r) for r in rows)
            raw[key] = {
                "value": [list(r) + [pad] * (width - len(r)) for r in rows],
                "dtype": "string" if key in cases.STRING_KEYS else "int64",
            }
    return raw


def _model_with_reference_tables(columns):
    """A model of one layer over `columns`, its tables the reference's."""
    pre = kte.FeaturePreprocessor(columns)
    inputs = pre.keras_inputs()
    layer = kte.TPUEmbeddingLayer(columns)
    model = keras.Model(inputs, layer(inputs))
    for table in layer.table_specs:
        variable = layer.table_variable(table.name)
        variable.assign(cases.table_values(table.name, variable.shape))
    return pre, model


@pytest.fixture(scope="module")
def served_exports(tmp_path_factory):
    """Per (case, lookup device): the case's columns and what its export
    serves, from one fresh process that loads all four exports with
    TensorFlow alone (a process each cost as much as the exports).

    "max_norm": the max-norm columns on dense raw ids; "derived": the
    bucketized and crossed columns on their raw features."""
    root = tmp_path_factory.mktemp("exports")
    max_norm = [_tensor_core(c) for c in cases.max_norm_columns()]
    cases_to_serve = {
        "max_norm": (max_norm, lambda _: _dense_raw(input_keys(max_norm))),
        "derived": (_served_derived_columns(), _derived_raw),
    }
    keys, jobs = [], []
    for case, (columns, raw) in cases_to_serve.items():
        pre, model = _model_with_reference_tables(columns)
        for device in DEVICES:
            path = root / case / device
            kte.export_saved_model(model, str(path), pre, lookup_device=device)
            keys.append((case, device))
            jobs.append((path, raw(pre)))
    served = serving_cases.serve_many_in_fresh_process(jobs, root)
    return {
        key: (cases_to_serve[key[0]][0], outputs)
        for key, outputs in zip(keys, served)
    }


@pytest.mark.parametrize("device", DEVICES)
def test_bucketized_and_crossed_in_a_saved_model(
    served_exports, reference, device
):
    expected, _ = reference
    columns, served = served_exports["derived", device]
    for column in columns:
        # The signature's padding is dropped before crossing (issue 25):
        # served as ragged features are, not as TF crosses dense padding.
        np.testing.assert_allclose(
            served[column.name],
            expected[column.name],
            atol=1e-6,
            rtol=0,
            err_msg=f"{column.name} ({device})",
        )


def test_bucketized_and_crossed_in_tf_data_and_parse_spec(reference):
    expected, _ = reference
    columns = _served_derived_columns()
    spec = kte.make_parse_example_spec(columns)
    assert spec["price"] == tf.io.FixedLenFeature((1,), tf.float32)
    assert spec["geo"] == tf.io.FixedLenFeature((2,), tf.float32)
    assert spec["ci"] == tf.io.VarLenFeature(tf.int64)
    assert spec["ca"] == tf.io.VarLenFeature(tf.string)
    examples = []
    for row in range(4):
        feature = {}
        for key in spec:
            if key in cases.NUMERIC:
                feature[key] = tf.train.Feature(
                    float_list=tf.train.FloatList(value=cases.NUMERIC[key][row])
                )
            elif key in cases.STRING_KEYS:
                values = [v.encode() for v in cases.RAW[key][row]]
                feature[key] = tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=values)
                )
            else:
                feature[key] = tf.train.Feature(
                    int64_list=tf.train.Int64List(value=cases.RAW[key][row])
                )
        examples.append(
            tf.train.Example(
                features=tf.train.Features(feature=feature)
            ).SerializeToString()
        )
    pre = kte.FeaturePreprocessor(columns)
    layer = kte.TPUEmbeddingLayer(columns)
    layer.build()
    for table in layer.table_specs:
        variable = layer.table_variable(table.name)
        variable.assign(cases.table_values(table.name, variable.shape))
    data = (
        tf.data.Dataset.from_tensor_slices(examples)
        .batch(4)
        .map(lambda e: pre(tf.io.parse_example(e, spec)))
    )
    ours = layer(next(iter(data)))
    for column in columns:
        np.testing.assert_allclose(
            ours[column.name].numpy(), expected[column.name], atol=1e-6
        )
