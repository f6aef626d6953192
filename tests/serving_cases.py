"""Serving cases: every column kind with raw features, a fresh-process
server for many SavedModels at once, and a model of every layer kind with
its raw features (`served_model`)."""

import json

import keras
import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing


def _strings(rows):
    return tf.constant(rows, tf.string)


def _ints(rows):
    return tf.constant(rows, tf.int64)


def column_kinds(tmp_path):
    """Per column kind: (columns, raw features). Rows include padding,
    empty examples, negative ids and out-of-vocabulary values."""
    vocabulary = tmp_path / "words.txt"
    vocabulary.write_text("w1\nw2\nw3\n")
    ident = kte.categorical_column_with_identity
    hist = kte.sequence_categorical_column_with_identity("hist", 12)
    ids = _ints([[1, 2, 3], [4, -1, -1], [-1, -1, -1], [11, 0, 5]])
    weights = tf.constant([[1.0, 2.0, -1.0], [0.5, 0, 0], [0, 0, 0], [3, 0, 1]])
    weighted = kte.weighted_categorical_column(ident("ids", 12), "w")
    seq_ids = _ints(
        [[1, 2, 3, 4, 5], [6, -1, -1, -1, -1], [-1] * 5, [7, 8, -1, 9, -1]]
    )
    kinds = {
        "identity_mean": (
            [kte.embedding_column(ident("ids", 12), 4)],
            {"ids": ids},
        ),
        "identity_sum": (
            [kte.embedding_column(ident("ids", 12), 4, combiner="sum")],
            {"ids": ids},
        ),
        "identity_sqrtn": (
            [kte.embedding_column(ident("ids", 12), 4, combiner="sqrtn")],
            {"ids": ids},
        ),
        "identity_default_value": (
            [
                kte.embedding_column(
                    ident("ids", 6, default_value=2), 4, combiner="sum"
                )
            ],
            {"ids": _ints([[1, 9, -3], [-1, -1, -1], [7, 5, -1], [0, 0, 0]])},
        ),
        "negative_ids": (
            [kte.embedding_column(ident("ids", 12), 4)],
            {
                "ids": _ints(
                    [[-2, 3, -1], [-5, -1, -1], [1, -7, 2], [-1, -1, -1]]
                )
            },
        ),
        "hashed": (
            [
                kte.embedding_column(
                    kte.categorical_column_with_hash_bucket("s", 7), 3
                )
            ],
            {
                "s": _strings(
                    [
                        ["a", "b", ""],
                        ["", "", ""],
                        ["c", "d", "e"],
                        ["f", "", ""],
                    ]
                )
            },
        ),
        "vocabulary_list": (
            [
                kte.embedding_column(
                    kte.categorical_column_with_vocabulary_list(
                        "s", ["a", "b", "c"], num_oov_buckets=2
                    ),
                    3,
                    combiner="sqrtn",
                )
            ],
            {
                "s": _strings(
                    [
                        ["a", "zz", ""],
                        ["", "", ""],
                        ["c", "b", "a"],
                        ["q", "", ""],
                    ]
                )
            },
        ),
        "vocabulary_list_no_oov": (
            [
                kte.embedding_column(
                    kte.categorical_column_with_vocabulary_list(
                        "s", ["a", "b"]
                    ),
                    3,
                )
            ],
            {
                "s": _strings(
                    [
                        ["a", "zz", ""],
                        ["zz", "", ""],
                        ["b", "b", "a"],
                        ["", "", ""],
                    ]
                )
            },
        ),
        "vocabulary_file": (
            [
                kte.embedding_column(
                    kte.categorical_column_with_vocabulary_file(
                        "s", str(vocabulary), num_oov_buckets=1
                    ),
                    3,
                )
            ],
            {
                "s": _strings(
                    [
                        ["w1", "w9", ""],
                        ["", "", ""],
                        ["w3", "w2", ""],
                        ["w1", "", ""],
                    ]
                )
            },
        ),
        "weighted_mean": (
            [kte.embedding_column(weighted, 4)],
            {"ids": ids, "w": weights},
        ),
        "weighted_sum": (
            [kte.embedding_column(weighted, 4, combiner="sum")],
            {"ids": ids, "w": weights},
        ),
        "weighted_sqrtn": (
            [kte.embedding_column(weighted, 4, combiner="sqrtn")],
            {"ids": ids, "w": weights},
        ),
        "weighted_unsafe_mean": (
            [
                kte.embedding_column(
                    weighted, 4, use_safe_embedding_lookup=False
                )
            ],
            {"ids": ids, "w": tf.abs(weights) + 0.5},
        ),
        "max_norm": (
            [kte.embedding_column(ident("ids", 12), 4, max_norm=0.05)],
            {"ids": ids},
        ),
        "sequence": (
            [kte.embedding_column(hist, 3, max_sequence_length=3)],
            {"hist": seq_ids},
        ),
        "sequence_longer_than_input": (
            [
                kte.embedding_column(
                    hist, 3, max_sequence_length=8, combiner="sum"
                )
            ],
            {"hist": seq_ids},
        ),
        "weighted_sequence": (
            [
                kte.embedding_column(
                    kte.weighted_categorical_column(hist, "hw"),
                    3,
                    max_sequence_length=4,
                    combiner="sqrtn",
                )
            ],
            {
                "hist": seq_ids,
                "hw": tf.constant(
                    [
                        [1.0, -2, 0, 3, 1],
                        [2, 0, 0, 0, 0],
                        [0.0] * 5,
                        [1, 2, 0, 4, 0],
                    ]
                ),
            },
        ),
        "shared_table": (
            kte.shared_embedding_columns(
                [ident("ids", 12), hist], 4, max_sequence_lengths=[0, 3]
            ),
            {"ids": ids, "hist": seq_ids},
        ),
        "bucketized": (
            [
                kte.embedding_column(
                    kte.bucketized_column(
                        kte.numeric_column("p", (2,)), [0.0, 1.0, 2.0]
                    ),
                    3,
                )
            ],
            {
                "p": tf.constant(
                    [[-1.0, 0.5], [1.5, 3.0], [0.0, 0.0], [2.5, 2.5]]
                )
            },
        ),
        "crossed": (
            [
                kte.embedding_column(
                    kte.crossed_column(["a", "b"], 13), 3, combiner="sum"
                )
            ],
            {
                "a": _strings([["x", "y"], ["z", ""], ["", ""], ["x", "x"]]),
                "b": _strings([["1", ""], ["2", "3"], ["4", ""], ["5", "6"]]),
            },
        ),
    }
    return kinds


KINDS = [
    "identity_mean",
    "identity_sum",
    "identity_sqrtn",
    "identity_default_value",
    "negative_ids",
    "hashed",
    "vocabulary_list",
    "vocabulary_list_no_oov",
    "vocabulary_file",
    "weighted_mean",
    "weighted_sum",
    "weighted_sqrtn",
    "weighted_unsafe_mean",
    "max_norm",
    "sequence",
    "sequence_longer_than_input",
    "weighted_sequence",
    "shared_table",
    "bucketized",
    "crossed",
]


def as_raw(features):
    """Tensors by key as `{key: {"value": ..., "dtype": ...}}` (JSON)."""
    raw = {}
    for key, value in features.items():
        array = value.numpy()
        if array.dtype == object:
            array = array.astype(str)
        raw[key] = {"value": array.tolist(), "dtype": value.dtype.name}
    return raw


# Loads SavedModels with TensorFlow only; prints each one's outputs.
SERVE_MANY_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
jobs = json.loads(open(sys.argv[1]).read())
results = []
for path, raw in jobs:
    serve = tf.saved_model.load(path).signatures["serving_default"]
    feeds = {
        k: tf.constant(v["value"], getattr(tf, v["dtype"]))
        for k, v in raw.items()
    }
    out = serve(**feeds)
    results.append({k: v.numpy().astype(np.float64).tolist()
                    for k, v in out.items()})
print(json.dumps(results))
# `import tensorflow` itself loads parts of keras (its lazy `tf.keras`);
# this script imports neither keras nor keras_tpu_embed.
assert "keras_tpu_embed" not in sys.modules
"""


def serve_many_in_fresh_process(jobs, tmp_path):
    """Per `(path, raw)` job, the serving signature's outputs, computed in
    one fresh process that imports TensorFlow only."""
    listing = tmp_path / "jobs.json"
    listing.write_text(json.dumps([[str(p), raw] for p, raw in jobs]))
    completed = testing.run_python(
        "-c", SERVE_MANY_SCRIPT, str(listing), TF_CPP_MIN_LOG_LEVEL="3"
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout.strip().splitlines()[-1])
    return [{k: np.array(v) for k, v in r.items()} for r in results]


def served_model(tmp_path):
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


SERVED_RAW = {
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


def served_feeds():
    """`SERVED_RAW` as tensors."""
    return testing.feeds(SERVED_RAW)


def model_with_a_dense_input():
    item = kte.categorical_column_with_identity("item", 10)
    pre = kte.FeaturePreprocessor([kte.embedding_column(item, 2)])
    inputs = dict(pre.keras_inputs(), age=keras.Input((1,), name="age"))
    layer = kte.TPUEmbeddingLayer(
        [kte.embedding_column(item, 2)], output="concat"
    )
    x = keras.layers.Concatenate()([layer(inputs), inputs["age"]])
    return keras.Model(inputs, keras.layers.Dense(1, name="score")(x))
