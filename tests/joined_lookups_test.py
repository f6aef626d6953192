"""The default export runs every embedding layer's lookups as one program."""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed._compat import keras
from tests import testing


def _layers():
    ident = kte.categorical_column_with_identity
    bag = kte.embedding_column(ident("bag", 50), 8, combiner="mean")
    weighted = kte.embedding_column(
        kte.weighted_categorical_column(ident("tags", 30), "tags_weight"),
        8,
        combiner="sqrtn",
    )
    sequence = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("seq", 40),
        4,
        max_sequence_length=3,
    )
    return (
        kte.TPUEmbeddingLayer([bag, weighted], output="concat", name="pooled"),
        kte.TPUEmbeddingLayer([sequence], name="sequences"),
    )


def _model(numeric=True):
    """Two embedding layers on the model's inputs, a numeric input and a
    head after them."""
    inputs = {
        "bag": keras.Input((4,), dtype="int64", name="bag"),
        "tags": keras.Input((2,), dtype="int64", name="tags"),
        "tags_weight": keras.Input((2,), name="tags_weight"),
        "seq": keras.Input((3,), dtype="int64", name="seq"),
    }
    pooled, sequences = _layers()
    vectors = [
        pooled({k: inputs[k] for k in ("bag", "tags", "tags_weight")}),
        keras.layers.Flatten()(
            sequences({"seq": inputs["seq"]})["seq_embedding"]
        ),
    ]
    if numeric:
        inputs["x"] = keras.Input((2,), name="x")
        vectors.append(inputs["x"])
    top = keras.layers.Concatenate()(vectors)
    return keras.Model(inputs, keras.layers.Dense(1, name="score")(top))


def _features(batch, seed=0, numeric=True):
    rng = np.random.default_rng(seed)
    features = {
        "bag": tf.constant(rng.integers(-1, 50, (batch, 4)), tf.int64),
        "tags": tf.constant(rng.integers(-1, 30, (batch, 2)), tf.int64),
        "tags_weight": tf.constant(rng.uniform(0.5, 2, (batch, 2)), tf.float32),
        "seq": tf.constant(rng.integers(-1, 40, (batch, 3)), tf.int64),
    }
    if numeric:
        features["x"] = tf.constant(rng.normal(size=(batch, 2)), tf.float32)
    return features


def _programs_per_call(serve):
    """How many XLA-compiled functions one call of a loaded signature
    runs when every check passes: calls followed, `If` branches not."""
    graph = serve.graph.as_graph_def()
    library = {f.signature.name: f for f in graph.library.function}

    def count(nodes):
        total = 0
        for node in nodes:
            called = node.attr["f"].func.name if "f" in node.attr else ""
            if called not in library:
                continue
            function = library[called]
            if "_XlaMustCompile" in function.attr and (
                function.attr["_XlaMustCompile"].b
            ):
                total += 1
            else:
                total += count(function.node_def)
        return total

    return count(graph.node)


def _export(model, path, **kwargs):
    kte.export_saved_model(model, path, inputs="ids", verbose=False, **kwargs)
    return tf.saved_model.load(str(path)).signatures["serving_default"]


def _assert_one_program_with_the_models_answer(model, serve):
    assert _programs_per_call(serve) == 1
    for batch in (1, 3, 64):
        features = _features(batch, seed=batch)
        np.testing.assert_allclose(
            serve(**features)["score"].numpy(),
            model(features, training=False).numpy(),
            atol=1e-6,
        )


def test_every_layers_lookups_are_one_program_with_the_same_answer(tmp_path):
    model = _model()
    _assert_one_program_with_the_models_answer(model, _export(model, tmp_path))


BRANCHES_AND_PADDING = {"If", "StatelessIf", "Switch", "Merge", "Pad", "PadV2"}


def test_a_served_call_runs_no_branch_and_no_padding(tmp_path):
    # The checks are one assertion after the program, and XLA compiles
    # per batch size: each branch or pad and cut was a measurable share
    # of a small batch's call (benchmarks/, W1 at batch 64).
    ops = testing.host_op_types(_export(_model(), tmp_path))
    assert "XLA" in ops and "Assert" in ops
    assert not ops & BRANCHES_AND_PADDING


def test_the_program_looks_up_the_batch_as_it_comes(tmp_path):
    # XLA compiles it per batch size: padding inside it to a power of two
    # only gathered padding (a batch of 100 looked up 128).
    (program,) = testing.xla_programs(_export(_model(), tmp_path)).values()
    assert "ResourceGather" in program
    # The power of two a batch rounds up to is one search (padded_host.
    # bucket): no batch is rounded.
    assert "LowerBound" not in program


def test_an_id_out_of_range_still_names_its_feature(tmp_path):
    serve = _export(_model(), tmp_path)
    bad = dict(_features(3), tags=tf.constant([[1, 30]] * 3, tf.int64))
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Feature .{1,2}tags.{1,2} \(table(.|\n)*Largest id:\]? \[30\]",
    ):
        serve(**bad)
    nan = dict(_features(3), tags_weight=tf.constant([[1, np.nan]] * 3))
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"tags_weight.{1,2} holds NaN or inf(.|\n)*\[3\]",
    ):
        serve(**nan)
    # And answers again after a refused call.
    assert np.isfinite(serve(**_features(3))["score"].numpy()).all()


def test_a_lookup_not_on_the_models_inputs_keeps_its_own_program(tmp_path):
    inputs = {"bag": keras.Input((4,), dtype="int64", name="bag")}
    pooled = kte.TPUEmbeddingLayer(
        [
            kte.embedding_column(
                kte.categorical_column_with_identity("bag", 50), 8
            )
        ],
        output="concat",
    )
    flipped = keras.ops.flip(inputs["bag"], 1)
    model = keras.Model(inputs, pooled({"bag": flipped}))
    serve = _export(model, tmp_path)
    features = {"bag": _features(5)["bag"]}
    np.testing.assert_allclose(
        next(iter(serve(**features).values())).numpy(),
        model(features, training=False).numpy(),
        atol=1e-6,
    )


def test_the_tensor_core_lookup_is_not_joined_and_still_checks(tmp_path):
    # It asserts its ids in range itself, which XLA would drop.
    ident = kte.categorical_column_with_identity
    column = kte.embedding_column(
        ident("bag", 50), 8, tensor_core_shape=[None, 4]
    )
    inputs = {"bag": keras.Input((4,), dtype="int64", name="bag")}
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    model = keras.Model(inputs, layer(inputs))
    serve = _export(model, tmp_path, lookup_device="tpu_tensor_core")
    with pytest.raises(tf.errors.InvalidArgumentError, match="bag"):
        serve(bag=tf.constant([[1, 50, -1, -1]], tf.int64))


def _lookups_alone():
    """A model whose outputs are its two layers' own, and the layers."""
    inputs = {
        "bag": keras.Input((4,), dtype="int64", name="bag"),
        "seq": keras.Input((3,), dtype="int64", name="seq"),
    }
    pooled, sequences = _layers()
    bag_only = kte.TPUEmbeddingLayer(pooled.columns[:1], name="bag_only")
    outputs = {
        "bag": bag_only({"bag": inputs["bag"]})["bag_embedding"],
        "seq": sequences({"seq": inputs["seq"]})["seq_embedding"],
    }
    return keras.Model(inputs, outputs), bag_only, sequences


def test_a_model_of_lookups_alone_is_one_program(tmp_path):
    # Nothing runs after the program.
    model, _, _ = _lookups_alone()
    serve = _export(model, tmp_path)
    assert _programs_per_call(serve) == 1
    features = {k: _features(3)[k] for k in ("bag", "seq")}
    want = model(features, training=False)
    got = serve(**features)
    for key in ("bag", "seq"):
        np.testing.assert_allclose(
            got[key].numpy(), want[key].numpy(), atol=1e-6
        )


@pytest.mark.parametrize(
    "pad_batches", [False, True], ids=["as_sent", "padded"]
)
def test_inputs_of_other_batch_sizes_are_refused_naming_each(
    tmp_path, pad_batches
):
    # Served as they came, each output had its own feature's rows; padded,
    # the call was refused naming `pad_batches` and a count, not the
    # inputs. A model whose outputs mix them broadcasts or fails.
    model, _, _ = _lookups_alone()
    serve = _export(model, tmp_path, pad_batches=pad_batches)
    features = {"bag": _features(3)["bag"], "seq": _features(5)["seq"]}
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Features .{1,2}bag.{1,2}, .{1,2}seq.{1,2} must each hold one "
        r"row per example(.|\n)*in that order:\] \[3 5\]",
    ):
        serve(**features)
    # One assertion for every check, the batch sizes' first.
    assert "Assert" in testing.host_op_types(serve)
    features = {k: _features(5)[k] for k in ("bag", "seq")}
    got = serve(**features)
    want = model(features, training=False)
    for key in ("bag", "seq"):
        np.testing.assert_allclose(
            got[key].numpy(), want[key].numpy(), atol=1e-6
        )


# Each reached a layer or a program that failed naming no input: `x`, read
# by the layers after the lookups only, a Concatenate (those layers now
# wait for the check); `tags_weight`, whose ids and weights met in the
# program, XLA's compile.
@pytest.mark.parametrize(
    ("feature", "rows", "named"),
    [
        (
            "x",
            2,
            r", .{1,2}x.{1,2} must each hold one row per example(.|\n)*"
            r"in that order:\] \[3 3 3 3 2\]",
        ),
        ("tags_weight", 4, r"tags_weight(.|\n)*in that order:\] \[3 3 3 4 3\]"),
    ],
)
def test_an_input_of_another_batch_size_is_refused(
    tmp_path, feature, rows, named
):
    serve = _export(_model(), tmp_path)
    features = dict(_features(3), **{feature: _features(rows)[feature]})
    with pytest.raises(tf.errors.InvalidArgumentError, match=named):
        serve(**features)


def test_pad_batches_names_an_input_of_another_rank(tmp_path):
    # It failed in the padding, naming no input: "The first dimension of
    # paddings must be the rank of inputs[2,2] [5,4,1]".
    serve = _export(_model(), tmp_path, pad_batches=True)
    features = dict(_features(5), bag=_features(5)["bag"][:, :, tf.newaxis])
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Shape of tensor bag \[5,4,1\] is not compatible with "
        r"expected shape \[\?,4\]",
    ):
        serve(**features)


def test_pad_batches_pads_to_powers_of_two_with_the_same_answer(tmp_path):
    model = _model()
    serve = _export(model, tmp_path, pad_batches=True)
    assert {"PadV2", "StridedSlice"} <= testing.host_op_types(serve)
    _assert_one_program_with_the_models_answer(model, serve)
    bad = dict(_features(3), tags=tf.constant([[1, 30]] * 3, tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Largest id"):
        serve(**bad)


def test_pad_batches_with_jit_compile_is_refused(tmp_path):
    with pytest.raises(ValueError, match="pad_batches=True, jit_compile=True"):
        _export(_model(), tmp_path, pad_batches=True, jit_compile=True)
