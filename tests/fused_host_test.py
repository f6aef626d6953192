"""`cpu` serving of dense ids: one compiled program for every column."""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.lookups import fused_host
from keras_tpu_embed.lookups import padded_host


def _programs(concrete):
    """How many XLA-compiled functions a serving graph holds."""
    library = concrete.graph.as_graph_def().library
    return sum(
        1
        for f in library.function
        if "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b
    )


def _columns():
    ident = kte.categorical_column_with_identity
    shared = kte.shared_embedding_columns(
        [ident("a", 30), ident("b", 30)], 4, combiner="sum"
    )
    return [
        *shared,
        kte.embedding_column(
            kte.weighted_categorical_column(ident("c", 20), "c_w"),
            3,
            combiner="sqrtn",
        ),
        kte.embedding_column(
            ident("d", 10, default_value=2), 5, combiner="mean", max_norm=0.5
        ),
        kte.embedding_column(
            kte.sequence_categorical_column_with_identity("s", 15),
            2,
            max_sequence_length=3,
        ),
    ]


def _features(batch=4, seed=0):
    rng = np.random.default_rng(seed)

    def ids(vocabulary, width):
        values = rng.integers(-1, vocabulary, size=(batch, width))
        return tf.constant(values, tf.int64)

    return {
        "a": ids(30, 1)[:, 0],  # rank 1: one id per example
        "b": ids(30, 3),
        "c": ids(20, 4),
        "c_w": tf.constant(rng.uniform(-1, 2, (batch, 4)), tf.float32),
        # Out-of-range and negative ids: the default_value maps them.
        "d": tf.constant(rng.integers(-3, 14, (batch, 2)), tf.int32),
        "s": ids(15, 5),
    }


def _serving(layer, features):
    """The serving function, for any batch size and width."""
    specs = {
        k: tf.TensorSpec([None] * v.shape.rank, v.dtype)
        for k, v in features.items()
    }
    with layer.serving_lookups():
        return tf.function(
            lambda f: layer(f, training=False)
        ).get_concrete_function(specs)


def _poison_the_per_column_path(monkeypatch):
    """The per-column path returns NaN: equal answers mean it did not run."""
    original = padded_host._device_part

    def poisoned(*args, **kwargs):
        device = original(*args, **kwargs)
        return lambda *a: device(*a) + float("nan")

    monkeypatch.setattr(padded_host, "_device_part", poisoned)


def test_every_dense_column_serves_in_one_program(monkeypatch):
    layer = kte.TPUEmbeddingLayer(_columns())
    features = _features()
    layer(features)
    programs = []
    runs = tf.Variable(0)
    original = fused_host._program

    def recording(plan):
        program = original(plan)
        programs.append(sorted(column.name for _, column, _ in plan))

        def run(inputs):
            # Counted only in the branch that runs (a cond traces both).
            with tf.control_dependencies([runs.assign_add(1)]):
                return program(inputs)

        return run

    monkeypatch.setattr(fused_host, "_program", recording)
    _serving(layer, features)(features)
    assert programs == [sorted(expected_names(layer))]
    assert int(runs.numpy()) == 1


def expected_names(layer):
    return [c.name for t in layer._local.tables for c in t.columns]


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_one_program_answers_as_the_training_lookup(batch, monkeypatch):
    layer = kte.TPUEmbeddingLayer(_columns())
    features = _features(batch, seed=batch)
    expected = layer(features, training=False)

    _poison_the_per_column_path(monkeypatch)
    served = _serving(layer, features)(features)
    assert sorted(served) == sorted(expected)
    for name, want in expected.items():
        np.testing.assert_allclose(
            served[name].numpy(), want.numpy(), atol=1e-6, err_msg=name
        )


def test_ids_out_of_range_raise_naming_their_feature():
    layer = kte.TPUEmbeddingLayer(_columns())
    features = _features()
    layer(features)
    serve = _serving(layer, features)
    bad = dict(features, c=tf.constant([[1, 25, -1, 0]] * 4, tf.int64))
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Feature .{1,2}c.{1,2} \(table .{1,2}c_weighted_by_c_w.{1,2}\)",
    ):
        serve(bad)


def test_non_finite_weights_raise_naming_their_feature():
    layer = kte.TPUEmbeddingLayer(_columns())
    features = _features()
    layer(features)
    serve = _serving(layer, features)
    weights = np.ones((4, 4), np.float32)
    weights[2, 1] = np.inf
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Weight feature .{1,2}c_w.{1,2} holds NaN or inf",
    ):
        serve(dict(features, c_w=tf.constant(weights)))


def test_weights_of_another_shape_raise():
    layer = kte.TPUEmbeddingLayer(_columns())
    features = _features()
    layer(features)
    serve = _serving(layer, features)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"c_w.{1,2} must have exactly"
    ):
        serve(dict(features, c_w=tf.ones([4, 3])))


def test_sparse_ids_or_sequence_lengths_keep_the_per_column_path():
    columns = _columns()
    features = _features()
    tables = kte.TPUEmbeddingLayer(columns)
    tables(features)
    local = tables._local.tables
    sparse = dict(features, b=tf.sparse.from_dense(features["b"]))
    assert not fused_host.applies(local, sparse, False)
    assert not fused_host.applies(local, features, True)


def _recorded_program_inputs(monkeypatch):
    """The shapes of every input the one program is traced with."""
    shapes = []
    original = fused_host._program

    def recording(plan):
        program = original(plan)

        def run(inputs):
            shapes.append([[tuple(x.shape) for x in xs] for xs in inputs])
            return program(inputs)

        return run

    monkeypatch.setattr(fused_host, "_program", recording)
    return shapes


def test_a_declared_width_is_compiled_as_it_is_not_padded(monkeypatch):
    # A static width is one program already; padding 3 to 4 copied the
    # whole batch on the host for nothing.
    column = kte.embedding_column(
        kte.categorical_column_with_identity("b", 9), 2
    )
    layer = kte.TPUEmbeddingLayer([column])
    layer({"b": tf.zeros([2, 3], tf.int64)})
    shapes = _recorded_program_inputs(monkeypatch)
    with layer.serving_lookups():
        tf.function(lambda f: layer(f, training=False)).get_concrete_function(
            {"b": tf.TensorSpec([None, 3], tf.int64)}
        )
    assert [s[0][0][1] for s in shapes] == [3]


def test_a_mostly_padded_batch_of_declared_width_stays_in_the_program(
    monkeypatch,
):
    # One id in 8 cells: the per-column path would compact it, but a
    # declared width of at most ALWAYS_PADDED_WIDTH gathers as sent, as a
    # Keras Embedding does, in the one program.
    column = kte.embedding_column(
        kte.categorical_column_with_identity("b", 9), 2, combiner="sum"
    )
    layer = kte.TPUEmbeddingLayer([column])
    ids = np.full((16, 8), -1, np.int64)
    ids[:, 0] = np.arange(16) % 9
    features = {"b": tf.constant(ids)}
    expected = layer(features, training=False)

    _poison_the_per_column_path(monkeypatch)
    with layer.serving_lookups():
        serve = tf.function(lambda f: layer(f, training=False))
        served = serve.get_concrete_function(
            {"b": tf.TensorSpec([None, 8], tf.int64)}
        )(features)
    np.testing.assert_allclose(
        served[column.name].numpy(), expected[column.name].numpy(), atol=1e-6
    )


def test_a_wide_mostly_padded_batch_is_compacted_not_gathered_whole():
    # Past ALWAYS_PADDED_WIDTH the padding limit still holds: a [4, 4096]
    # batch of 4 ids is not gathered as 16,384 rows.
    width = 4 * fused_host.ALWAYS_PADDED_WIDTH
    column = kte.embedding_column(
        kte.categorical_column_with_identity("b", 9), 2, combiner="sum"
    )
    layer = kte.TPUEmbeddingLayer([column])
    ids = np.full((4, width), -1, np.int64)
    ids[:, 0] = [1, 2, 3, 4]
    layer({"b": tf.constant(ids)})
    served = []
    original = fused_host.padding_fits

    def recording(*args):
        served.append(original(*args))
        return served[-1]

    fused_host.padding_fits = recording
    try:
        _serving(layer, {"b": tf.constant(ids)})
    finally:
        fused_host.padding_fits = original
    assert len(served) == 1
    fits = fused_host.padding_fits(
        column, tf.constant(ids), tf.shape(ids, out_type=tf.int64), 4
    )
    assert not bool(fits.numpy())


def test_columns_of_other_batch_sizes_each_pad_their_own(monkeypatch):
    # Each column is padded to its own batch's bucket and cut back to it:
    # no column needs another's batch size to be served in the program.
    ident = kte.categorical_column_with_identity
    columns = [
        kte.embedding_column(ident("a", 9), 2),
        kte.embedding_column(ident("b", 9), 3),
    ]
    layer = kte.TPUEmbeddingLayer(columns)
    features = {
        "a": tf.constant([[1], [2], [3]], tf.int64),
        "b": tf.constant([[4, -1]] * 5, tf.int64),
    }
    expected = layer(features, training=False)

    _poison_the_per_column_path(monkeypatch)
    served = _serving(layer, features)(features)
    for name, want in expected.items():
        assert served[name].shape == want.shape
        np.testing.assert_allclose(
            served[name].numpy(), want.numpy(), atol=1e-6
        )


def test_a_served_call_checks_with_an_assertion_not_a_branch():
    # A `tf.cond` lowers to Switch/Merge and walked the untaken per-column
    # branch's hundreds of ops on every call; an `If` runs its branch as
    # a function call on every call. An assertion is one op.
    layer = kte.TPUEmbeddingLayer(_columns())
    features = _features()
    layer(features)
    specs = {
        k: tf.TensorSpec([None] + v.shape[1:], v.dtype)
        for k, v in features.items()
    }
    with layer.serving_lookups():
        graph = (
            tf.function(lambda f: layer(f, training=False))
            .get_concrete_function(specs)
            .graph
        )
    types = [op.type for op in graph.get_operations()]
    assert not set(types) & {"If", "StatelessIf", "Switch", "Merge"}
    # One for the checks of the program, one for the weights' shape.
    assert types.count("Assert") == 2
