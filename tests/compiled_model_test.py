"""`export_saved_model(jit_compile=True)`: the model past its lookups as
one XLA program, the lookups' checks kept."""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed._compat import keras
from tests import testing


def _columns():
    ident = kte.categorical_column_with_identity
    return [
        kte.embedding_column(ident("a", 20), 4, tensor_core_shape=[None, 1]),
        kte.embedding_column(
            ident("b", 30), 4, combiner="sum", tensor_core_shape=[None, 3]
        ),
    ]


def _dlrm_like(numeric=True, inputs=None):
    """Two lookups, a numeric input, an MLP and a pairwise dot; on inputs
    of declared widths unless given others."""
    inputs = inputs or {
        "a": keras.Input((1,), dtype="int64", name="a"),
        "b": keras.Input((3,), dtype="int64", name="b"),
    }
    if numeric:
        inputs["x"] = keras.Input((2,), name="x")
    lookups = kte.TPUEmbeddingLayer(_columns())
    vectors = list(lookups({"a": inputs["a"], "b": inputs["b"]}).values())
    if numeric:
        vectors.append(keras.layers.Dense(4, activation="relu")(inputs["x"]))
    stacked = keras.ops.stack(vectors, axis=1)
    count = len(vectors)
    dots = keras.ops.reshape(
        keras.ops.matmul(stacked, keras.ops.transpose(stacked, (0, 2, 1))),
        (-1, count * count),
    )
    top = keras.layers.Concatenate()([vectors[-1], dots])
    score = keras.layers.Dense(1, name="score")(
        keras.layers.Dense(8, activation="relu")(top)
    )
    return keras.Model(inputs, score)


def _features(batch, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "a": tf.constant(rng.integers(0, 20, (batch, 1)), tf.int64),
        "b": tf.constant(rng.integers(-1, 30, (batch, 3)), tf.int64),
        "x": tf.constant(rng.normal(size=(batch, 2)), tf.float32),
    }


def test_the_whole_model_is_one_program_with_the_same_answer(tmp_path):
    model = _dlrm_like()
    kte.export_saved_model(
        model, tmp_path, inputs="ids", verbose=False, jit_compile=True
    )
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    for batch in (1, 5, 64):
        features = _features(batch, seed=batch)
        want = model(features, training=False).numpy()
        got = serve(**features)["score"].numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
    # One program holds every Dense layer and the lookups' gathers.
    dense = [
        ops for ops in testing.xla_programs(serve).values() if "MatMul" in ops
    ]
    assert len(dense) == 1
    assert "ResourceGather" in dense[0]


def _assert_lookups_apart(path, model, features):
    """The export at `path` answers as `model`, with one program holding
    the Dense layers and no gather: the lookups ran apart. Returns it."""
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    np.testing.assert_allclose(
        serve(**features)["score"].numpy(),
        model(features, training=False).numpy(),
        atol=1e-5,
    )
    dense = [
        ops for ops in testing.xla_programs(serve).values() if "MatMul" in ops
    ]
    assert len(dense) == 1
    assert "ResourceGather" not in dense[0]
    return serve


def test_raw_features_of_undeclared_width_keep_the_lookups_apart(tmp_path):
    # Their padding is checked per batch, outside any program: the layers
    # after the lookups are the one program.
    raw = kte.FeaturePreprocessor(_columns()).keras_inputs()
    model = _dlrm_like(numeric=False, inputs=raw)
    kte.export_saved_model(model, tmp_path, verbose=False, jit_compile=True)
    features = _features(5)
    del features["x"]
    _assert_lookups_apart(tmp_path, model, features)


def test_lookups_that_keep_their_checks_run_apart_from_the_program(tmp_path):
    # The tensor-core lookup asserts its ids in range, which XLA would
    # drop: it runs outside the program of the layers after it.
    model = _dlrm_like()
    kte.export_saved_model(
        model,
        tmp_path,
        inputs="ids",
        lookup_device="tpu_tensor_core",
        verbose=False,
        jit_compile=True,
    )
    features = _features(5)
    serve = _assert_lookups_apart(tmp_path, model, features)
    bad = dict(features, b=tf.constant([[1, 31, -1]] * 5, tf.int64))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"Feature .{1,2}b.{1,2} \(table"
    ):
        serve(**bad)


def test_the_lookups_still_check_their_ids(tmp_path):
    kte.export_saved_model(
        _dlrm_like(), tmp_path, inputs="ids", verbose=False, jit_compile=True
    )
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    bad = dict(_features(2), b=tf.constant([[1, 31, -1]] * 2, tf.int64))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"Feature .{1,2}b.{1,2} \(table"
    ):
        serve(**bad)
    # And answer again after a refused call.
    good = _features(2)
    assert np.isfinite(serve(**good)["score"].numpy()).all()


def test_the_checks_are_one_assertion_not_a_branch(tmp_path):
    # An `If` ran its branch as a function call on every served call.
    kte.export_saved_model(
        _dlrm_like(), tmp_path, inputs="ids", verbose=False, jit_compile=True
    )
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    ops = testing.host_op_types(serve)
    assert "XLA" in ops and "Assert" in ops
    assert not ops & {"If", "StatelessIf", "Switch", "Merge"}
    bad = dict(_features(2), a=tf.constant([[25]] * 2, tf.int64))
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Feature .{1,2}a.{1,2} \(table(.|\n)*Largest id:\]? \[25\]",
    ):
        serve(**bad)


@pytest.mark.parametrize("lookup_device", ["cpu", "tpu_tensor_core"])
def test_inputs_of_other_batch_sizes_are_refused_naming_each(
    tmp_path, lookup_device
):
    # XLA failed to compile the model for them, naming no input (the whole
    # model as one program, "cpu"), or the layers after the lookups failed
    # on them (the lookups apart, "tpu_tensor_core").
    model = _dlrm_like()
    kte.export_saved_model(
        model,
        tmp_path,
        inputs="ids",
        lookup_device=lookup_device,
        verbose=False,
        jit_compile=True,
    )
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    for sizes, shown in (((2, 3, 2), "2 3 2"), ((1, 1, 4), "1 1 4")):
        features = {
            key: _features(size)[key] for key, size in zip("abx", sizes)
        }
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"Features .{1,2}a.{1,2}, .{1,2}b.{1,2}, .{1,2}x.{1,2} must "
            rf"each hold one row per example(.|\n)*order:\] \[{shown}\]",
        ):
            serve(**features)
    good = _features(4)
    np.testing.assert_allclose(
        serve(**good)["score"].numpy(),
        model(good, training=False).numpy(),
        atol=1e-5,
    )


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.lookups = kte.TPUEmbeddingLayer(_columns())
        self.score = keras.layers.Dense(1)

    def call(self, features):
        vectors = self.lookups(features)
        return self.score(keras.ops.concatenate(list(vectors.values()), 1))


def test_a_subclassed_model_that_cannot_be_one_program_is_refused(tmp_path):
    # Raw features are of undeclared width: the lookups stay apart, and a
    # subclassed model cannot be cut at them.
    model = Subclassed()
    features = _features(2)
    del features["x"]
    model(features)
    with pytest.raises(ValueError, match="subclassed Subclassed"):
        kte.export_saved_model(model, tmp_path, verbose=False, jit_compile=True)


def _called_twice():
    inputs = {
        "a": keras.Input((1,), dtype="int64", name="a"),
        "b": keras.Input((3,), dtype="int64", name="b"),
    }
    lookups = kte.TPUEmbeddingLayer(_columns(), output="concat", name="twice")
    again = {"a": inputs["a"], "b": keras.ops.flip(inputs["b"], 1)}
    merged = keras.layers.Add()([lookups(inputs), lookups(again)])
    return keras.Model(
        inputs, keras.layers.Dense(1)(merged), name="model_with_twice"
    )


def test_a_lookup_called_twice_is_one_program(tmp_path):
    model = _called_twice()
    features = _features(4)
    del features["x"]
    want = model(features, training=False).numpy()
    kte.export_saved_model(
        model, tmp_path, inputs="ids", verbose=False, jit_compile=True
    )
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    np.testing.assert_allclose(
        list(serve(**features).values())[0].numpy(), want, atol=1e-5
    )


def test_a_lookup_called_twice_apart_from_the_program_is_refused(tmp_path):
    with pytest.raises(ValueError, match="model_with_twice.*more than once"):
        kte.export_saved_model(
            _called_twice(),
            tmp_path,
            inputs="ids",
            lookup_device="tpu_tensor_core",
            verbose=False,
            jit_compile=True,
        )


def test_layers_xla_cannot_compile_fail_the_export_not_a_call(tmp_path):
    inputs = {"a": keras.Input((1,), dtype="int64", name="a")}
    column = kte.embedding_column(
        kte.categorical_column_with_identity("a", 9), 2
    )
    vector = kte.TPUEmbeddingLayer([column], output="concat")(inputs)
    # String ops have no XLA kernel.
    text = keras.layers.Lambda(
        lambda x: tf.strings.to_number(tf.strings.as_string(x)),
        output_shape=(2,),
    )(vector)
    model = keras.Model(inputs, text)
    with pytest.raises(ValueError, match="failed at export"):
        kte.export_saved_model(
            model, tmp_path, inputs="ids", verbose=False, jit_compile=True
        )
