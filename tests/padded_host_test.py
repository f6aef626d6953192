"""The `cpu` serving lookup: compiled padded path equals the sparse path."""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.lookups import padded_host
from keras_tpu_embed.placement.ids import to_id_batch
from tests.serving_cases import KINDS
from tests.serving_cases import column_kinds


def _xla_compiled(concrete):
    """Whether a graph (or a function it calls) holds an XLA cluster."""
    library = concrete.graph.as_graph_def().library
    return any(
        "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b
        for f in library.function
    )


def _dense(value):
    if not isinstance(value, tf.SparseTensor):
        return value
    pad = -1 if value.dtype.is_integer else 0.0
    return tf.sparse.to_dense(value, tf.constant(pad, value.dtype))


def _poison(monkeypatch, name):
    """`padded_host.<name>` with NaN added to whatever it returns."""
    original = getattr(padded_host, name)

    def nan(value):
        return value + tf.constant(float("nan"), value.dtype)

    def poisoned(*args, **kwargs):
        result = original(*args, **kwargs)
        if callable(result):  # _device_part returns the device function
            return lambda *a: nan(result(*a))
        return nan(result)

    monkeypatch.setattr(padded_host, name, poisoned)


@pytest.mark.parametrize("branch", ["padded", "sparse_fallback", "dense_ids"])
@pytest.mark.parametrize("kind", KINDS)
def test_cpu_serving_equals_sparse_path(kind, branch, tmp_path, monkeypatch):
    kinds = column_kinds(tmp_path)
    assert sorted(kinds) == sorted(KINDS)
    columns, raw = kinds[kind]
    if branch == "sparse_fallback":
        # No batch is worth padding: every column takes the sparse branch.
        monkeypatch.setattr(
            padded_host, "worth_padding", lambda *_: tf.constant(False)
        )
    # The branch not named poisons its output with NaN, so the comparison
    # below fails unless the named branch ran.
    poisoned = (
        "_device_part" if branch == "sparse_fallback" else "_sparse_column"
    )
    _poison(monkeypatch, poisoned)
    pre = kte.FeaturePreprocessor(columns)
    layer = kte.TPUEmbeddingLayer(
        columns,
        return_sequence_lengths=any(c.is_sequence for c in columns),
    )
    features = pre(raw)
    if branch == "dense_ids":
        # Ids given dense: real -1 ids become padding, for both paths.
        features = {k: _dense(v) for k, v in features.items()}
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
            tf.errors.InvalidArgumentError,
            match=r"Feature .*ids.* \(table .*ids.*\) has ids outside",
        ):
            serve(tf.constant([[1, 7]], tf.int64))


def test_a_batch_with_one_long_row_serves_as_the_sparse_path():
    """The run-time choice itself (no patching): a long row goes sparse,
    the short batch padded; both equal the sparse path."""
    column = kte.embedding_column(
        kte.categorical_column_with_identity("ids", 300), 4, combiner="sum"
    )
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    with layer.serving_lookups():
        serve = tf.function(lambda x: layer({"ids": x}, training=False))
    for rows in ([[1, 2]] * 63 + [[1]], [[1, 2]] * 63 + [list(range(200))]):
        ids = tf.ragged.constant(rows, tf.int64)
        np.testing.assert_allclose(
            serve(ids).numpy(),
            layer({"ids": ids}, training=False).numpy(),
            atol=1e-6,
        )


@pytest.mark.parametrize("weighted", [False, True])
def test_mostly_padded_dense_ids_are_compacted(monkeypatch, weighted):
    """A [64, 2000] batch of -1 with a few ids per row: padded as sent it
    gathers 64 * 2048 rows; compacted, a few per example."""
    categorical = kte.categorical_column_with_identity("ids", 50)
    if weighted:
        categorical = kte.weighted_categorical_column(categorical, "w")
    column = kte.embedding_column(categorical, 4, combiner="sqrtn")
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    rng = np.random.default_rng(0)
    ids = np.full([64, 2000], -1, np.int64)
    weights = np.zeros([64, 2000], np.float32)
    for row in range(64):
        at = rng.choice(2000, size=3, replace=False)
        ids[row, at] = rng.integers(0, 50, size=3)
        weights[row, at] = rng.uniform(0.5, 2.0, size=3)
    features = {"ids": tf.constant(ids)}
    if weighted:
        features["w"] = tf.constant(weights)
    expected = layer(features, training=False)
    widest = tf.Variable(0, dtype=tf.int64)
    original = padded_host._device_part

    def recording(*args, **kwargs):
        device = original(*args, **kwargs)

        def run(ids, *rest):
            # Assigned only in the branch that runs (a cond traces both).
            width = tf.shape(ids, out_type=tf.int64)[1]
            with tf.control_dependencies(
                [widest.assign(tf.maximum(widest, width))]
            ):
                return tf.identity(device(ids, *rest))

        return run

    monkeypatch.setattr(padded_host, "_device_part", recording)
    with layer.serving_lookups():
        served = tf.function(lambda f: layer(f, training=False))(features)
    np.testing.assert_allclose(served.numpy(), expected.numpy(), atol=1e-6)
    # The branch that ran padded to a few ids per example, not 2048.
    assert 0 < int(widest.numpy()) <= 4


def test_bucket_is_the_next_power_of_two():
    sizes = [0, 1, 2, 3, 4, 5, 63, 64, 65, 1000, 4096, 4097, 2**40 + 1]
    want = [1, 1, 2, 4, 4, 8, 64, 64, 128, 1024, 4096, 8192, 2**41]
    assert padded_host.bucket(tf.constant(sizes)).numpy().tolist() == want
    assert int(padded_host.bucket(tf.constant(5, tf.int64))) == 8
    assert padded_host.bucket(tf.constant(5)).shape == []
