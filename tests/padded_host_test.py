"""The `cpu` serving lookup: compiled padded path equals the sparse path."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.ids import to_id_batch
from keras_tpu_embed.lookup import padded_host


def _strings(rows):
    return tf.constant(rows, tf.string)


def _ints(rows):
    return tf.constant(rows, tf.int64)


def _kinds(tmp_path):
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


def _xla_compiled(concrete):
    """Whether a graph (or a function it calls) holds an XLA cluster."""
    library = concrete.graph.as_graph_def().library
    return any(
        "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b
        for f in library.function
    )


@pytest.mark.parametrize("branch", ["padded", "sparse_fallback"])
@pytest.mark.parametrize("kind", KINDS)
def test_cpu_serving_equals_sparse_path(kind, branch, tmp_path, monkeypatch):
    kinds = _kinds(tmp_path)
    assert sorted(kinds) == sorted(KINDS)
    columns, raw = kinds[kind]
    if branch == "sparse_fallback":
        # No batch fits: every column takes the sparse branch of the cond.
        monkeypatch.setattr(padded_host, "PADDING_LIMIT", 0)
    pre = kte.FeaturePreprocessor(columns)
    layer = kte.TPUEmbeddingLayer(
        columns,
        return_sequence_lengths=any(c.is_sequence for c in columns),
    )
    features = pre(raw)
    layer(features)
    expected = layer(features, training=False)
    with layer.serving_lookups():
        serve = tf.function(
            lambda f: layer(f, training=False)
        ).get_concrete_function(features)
    assert _xla_compiled(serve)
    served = serve(features)
    flat_expected, flat_served = (
        tf.nest.flatten(expected),
        tf.nest.flatten(served),
    )
    assert len(flat_expected) == len(flat_served)
    for want, got in zip(flat_expected, flat_served):
        assert want.shape == got.shape
        np.testing.assert_allclose(
            got.numpy(), want.numpy(), atol=1e-6, rtol=1e-6
        )


def test_dense_ids_serve_as_the_sparse_path():
    """Ids given dense (no preprocessor), -1 padding and other negatives."""
    column = kte.embedding_column(
        kte.categorical_column_with_identity("ids", 50), 4, combiner="sqrtn"
    )
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    ids = tf.constant(
        [[3, -1, 7, -2], [-1, -1, -1, -1], [49, 0, 0, 1]], tf.int64
    )
    expected = layer({"ids": ids}, training=False)
    with layer.serving_lookups():
        served = tf.function(lambda x: layer({"ids": x}, training=False))(ids)
    np.testing.assert_allclose(served.numpy(), expected.numpy(), atol=1e-6)


def _fits(ids, length=0):
    batch = to_id_batch("f", ids)
    return bool(padded_host._layout(batch, length)[3].numpy())


def test_one_long_row_takes_the_sparse_branch():
    short = tf.ragged.constant([[1, 2]] * 63 + [[1]], tf.int64)
    long = tf.ragged.constant([[1, 2]] * 63 + [list(range(200))], tf.int64)
    assert _fits(short)
    assert not _fits(long)
    # A sequence column's output is padded anyway: it always fits.
    assert _fits(long, length=4)


def test_unsorted_or_repeated_sparse_entries_take_the_sparse_branch():
    def sparse(indices):
        return tf.SparseTensor(
            indices, tf.ones([len(indices)], tf.int64), [2, 3]
        )

    assert _fits(sparse([[0, 0], [0, 1], [1, 0]]))
    assert not _fits(sparse([[1, 0], [0, 0], [0, 1]]))
    assert not _fits(sparse([[0, 0], [0, 0], [1, 0]]))
    assert not _fits(sparse([[0, 0], [0, 0], [1, 0]]), length=3)


@pytest.mark.parametrize(
    "indices",
    [[[1, 0], [0, 1], [0, 0]], [[0, 0], [0, 0], [1, 2]]],
    ids=["unsorted", "repeated"],
)
@pytest.mark.parametrize("length", [0, 2])
def test_unsorted_or_repeated_sparse_entries_serve_as_the_sparse_path(
    indices, length
):
    category = kte.categorical_column_with_identity("ids", 9)
    if length:
        category = kte.sequence_categorical_column_with_identity("ids", 9)
    column = kte.embedding_column(category, 3, max_sequence_length=length)
    layer = kte.TPUEmbeddingLayer([column])
    ids = tf.SparseTensor(indices, tf.constant([4, 5, 6], tf.int64), [2, 3])
    expected = layer({"ids": ids}, training=False)
    with layer.serving_lookups():
        served = tf.function(lambda: layer({"ids": ids}, training=False))()
    np.testing.assert_allclose(
        served[column.name].numpy(), expected[column.name].numpy(), atol=1e-6
    )


def test_bucket_rounds_up_to_powers_of_two():
    sizes = tf.constant([0, 1, 2, 3, 4, 5, 1000, 1024, 1025], tf.int64)
    assert padded_host.bucket(sizes).numpy().tolist() == [
        1,
        1,
        2,
        4,
        4,
        8,
        1024,
        1024,
        2048,
    ]


def test_serving_ids_out_of_range_raise():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("ids", 5), 2
    )
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    with layer.serving_lookups():
        serve = tf.function(lambda x: layer({"ids": x}, training=False))
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=r"Feature .*ids.* \(table .*ids.*\) has ids outside"
        ):
            serve(tf.constant([[1, 7]], tf.int64))
