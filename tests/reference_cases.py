"""Reference cases shared by our side and the legacy `tf_keras` side.

Imports TensorFlow and NumPy only (no Keras), so that both the test process
(Keras 3) and the subprocess with `TF_USE_LEGACY_KERAS=1` can build the very
same `tf.feature_column` columns, raw inputs and table values.
"""

import os
import zlib

import numpy as np
import tensorflow as tf

fc = tf.feature_column

VOCAB_TOKENS = ["apple", "banana", "cherry", "date", "elder"]


def write_vocabulary(directory):
    path = os.path.join(directory, "fruit.txt")
    with open(path, "w") as handle:
        handle.write("\n".join(VOCAB_TOKENS) + "\n")
    return path


def table_values(name, shape):
    """Deterministic table values keyed by table name."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.normal(size=shape).astype(np.float32)


# Raw multi-valued inputs as ragged lists; the reference gets them sparse.
RAW = {
    "a": [[1, 2, 2], [5], [], [19, 0]],
    "b": [[3, 3, 4], [], [7], [1, 2, 3, 4]],
    "c": [[0], [8, 9], [10, 11, 12], []],
    "u": [[4, 4], [], [9], [0, 1, 2]],
    "country": [["us", "zz"], ["fr"], [], ["jp", "de", "qq"]],
    "country2": [["us", "zz"], ["fr"], ["de"], []],
    "code": [[10, 99], [30], [], [20, 20, 77]],
    "fruit": [["apple", "kiwi"], ["date"], ["elder", "fig", "grape"], []],
    "tag": [["x", "y"], ["z"], [], ["x", "w", "v"]],
    "num": [[1, 22], [333], [4444, 1], []],
    "wk": [["p", "q", "r"], ["s"], [], ["p", "t"]],
    "wk_w": [[1.0, 0.0, 2.0], [-1.0], [], [0.5, 3.0]],
    "wi": [[1, 2, 3], [4], [5, 6], []],
    "wi_w": [[2.0, -1.0, 0.5], [0.0], [1.5, 2.5], []],
    "m1": [[1, 2, 2], [5], [], [19, 0]],
    "m2": [[3], [8, 9, 4], [0, 11], []],
    "mw": [[1, 2, 3], [4], [5, 6], []],
    "mw_w": [[2.0, -1.0, 0.5], [0.0], [1.5, 2.5], []],
    "s1": [[1, 2], [29], [], [3]],
    "s2": [[4], [], [5, 6, 7], [8, 8]],
    # Sequences.
    "h": [[1, 2, 3, 4, 5, 6], [7], [], [8, 9]],
    "hv": [["apple", "zzz", "cherry"], [], ["date"], ["elder"] * 5],
    "hh": [["x", "y", "z"], ["w"], ["v", "u"], []],
}
# Dense numeric features (bucketized sources): one row per example.
NUMERIC = {
    "price": [[3.0], [15.0], [40.0], [-2.0]],
    "geo": [[1.0, 50.0], [7.0, 5.0], [2.5, 99.0], [0.0, 60.0]],
}
RAW.update(
    {
        "ca": [["x", "y"], ["z"], [], ["x", "w", "y"]],
        "cb": [["p"], ["q", "r"], ["p"], ["s", "t"]],
        "ci": [[1, 2], [3], [4, 5], []],
    }
)
STRING_KEYS = {
    "ca",
    "cb",
    "country",
    "country2",
    "fruit",
    "tag",
    "hv",
    "hh",
    "wk",
}
WEIGHT_KEYS = {"wk_w", "wi_w", "mw_w"}


def dense_columns(vocabulary_file):
    """(column, max_sequence_length) pairs checked through DenseFeatures."""
    identity = fc.categorical_column_with_identity
    return [
        fc.embedding_column(identity("a", 20), 4, combiner="mean"),
        fc.embedding_column(identity("b", 10), 3, combiner="sum"),
        fc.embedding_column(identity("c", 13), 5, combiner="sqrtn"),
        fc.embedding_column(
            identity("u", 10),
            3,
            combiner="sum",
            use_safe_embedding_lookup=False,
        ),
        fc.embedding_column(
            fc.categorical_column_with_vocabulary_list(
                "country", ["us", "fr", "de", "jp"], num_oov_buckets=3
            ),
            4,
        ),
        fc.embedding_column(
            fc.categorical_column_with_vocabulary_list(
                "country2", ["us", "fr", "de"]
            ),
            2,
            combiner="sum",
        ),
        fc.embedding_column(
            fc.categorical_column_with_vocabulary_list(
                "code", [10, 20, 30], dtype=tf.int64, num_oov_buckets=2
            ),
            3,
        ),
        fc.embedding_column(
            fc.categorical_column_with_vocabulary_file(
                "fruit", vocabulary_file, num_oov_buckets=3
            ),
            4,
            combiner="sqrtn",
        ),
        fc.embedding_column(
            fc.categorical_column_with_hash_bucket("tag", 50), 3
        ),
        fc.embedding_column(
            fc.categorical_column_with_hash_bucket("num", 40, dtype=tf.int64),
            3,
            combiner="sum",
        ),
        fc.embedding_column(
            fc.weighted_categorical_column(
                fc.categorical_column_with_hash_bucket("wk", 30), "wk_w"
            ),
            4,
            combiner="sqrtn",
        ),
        fc.embedding_column(
            fc.weighted_categorical_column(identity("wi", 10), "wi_w"),
            3,
            combiner="mean",
        ),
    ]


def max_norm_columns():
    """Columns with `max_norm`: rows are clipped before they are combined.

    Table values are standard normal, so rows of 3-4 values have norms
    around 2 and most are clipped; some stay below the norm.
    """
    identity = fc.categorical_column_with_identity
    return [
        fc.embedding_column(identity("m1", 20), 4, max_norm=0.8),
        fc.embedding_column(
            identity("m2", 13), 3, combiner="sqrtn", max_norm=1.5
        ),
        fc.embedding_column(
            fc.weighted_categorical_column(identity("mw", 10), "mw_w"),
            4,
            combiner="mean",
            max_norm=0.5,
        ),
    ]


def derived_columns():
    """Bucketized and crossed columns (one and several values per key)."""
    price = fc.bucketized_column(
        fc.numeric_column("price"), [0.0, 10.0, 20.0, 30.0]
    )
    geo = fc.bucketized_column(
        fc.numeric_column("geo", shape=(2,)), [2.0, 6.0, 60.0]
    )
    return [
        fc.embedding_column(price, 3),
        fc.embedding_column(geo, 4, combiner="sum"),
        fc.embedding_column(
            fc.crossed_column(["ca", "cb"], 40), 3, combiner="sqrtn"
        ),
        fc.embedding_column(
            fc.crossed_column(["ca", price], 30, hash_key=12345), 4
        ),
        fc.embedding_column(fc.crossed_column(["ci", "cb"], 50), 2),
    ]


def weighted_sum_column():
    return fc.embedding_column(
        fc.weighted_categorical_column(
            fc.categorical_column_with_identity("wi", 10), "wi_w"
        ),
        3,
        combiner="sum",
    )


def shared_categorical_columns():
    identity = fc.categorical_column_with_identity
    return [identity("s1", 30), identity("s2", 30)]


def sequence_columns():
    """(tf column, max_sequence_length) for SequenceFeatures."""
    seq = fc.sequence_categorical_column_with_identity("h", 12)
    seq_vocab = fc.sequence_categorical_column_with_vocabulary_list(
        "hv", VOCAB_TOKENS, num_oov_buckets=1
    )
    seq_hash = fc.sequence_categorical_column_with_hash_bucket("hh", 20)
    return [
        (fc.embedding_column(seq, 3), 4),
        # max_norm clips each position's row, as for pooled columns.
        (fc.embedding_column(seq_vocab, 2, max_norm=0.7), 3),
        (fc.embedding_column(seq_hash, 4), 5),
    ]


def reference_input(key):
    """The reference's form of a raw feature: a rank-2 SparseTensor
    (numeric features: a dense float32 tensor)."""
    if key in NUMERIC:
        return tf.constant(NUMERIC[key], tf.float32)
    values = RAW[key]
    if key in STRING_KEYS:
        dtype = tf.string
    elif key in WEIGHT_KEYS:
        dtype = tf.float32
    else:
        dtype = tf.int64
    return tf.ragged.constant(values, dtype=dtype, ragged_rank=1).to_sparse()


def dense_input(key):
    """A raw feature dense, padded with "" (strings) or -1 (integers)."""
    if key in NUMERIC:
        return tf.constant(NUMERIC[key], tf.float32)
    values = RAW[key]
    if key in STRING_KEYS:
        dtype, pad = tf.string, ""
    elif key in WEIGHT_KEYS:
        dtype, pad = tf.float32, 0.0
    else:
        dtype, pad = tf.int64, -1
    ragged = tf.ragged.constant(values, dtype=dtype, ragged_rank=1)
    return ragged.to_tensor(default_value=pad)
