"""Damaged `.keras` files and SavedModels fail loudly, naming the file."""

import collections
import copy
import glob
import os
import re
import shutil
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.tables import quantization
from tests import testing


def _model():
    inputs = {"item": keras.Input((None,), dtype="int64", name="item")}
    layer = kte.TPUEmbeddingLayer(
        [
            kte.embedding_column(
                kte.categorical_column_with_identity("item", 50), 8
            )
        ],
        output="concat",
    )
    return keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))


def test_saving_tables_warns_nothing(tmp_path):
    """The tables went to the file as tf.Variables, whose `__array__`
    lacks numpy 2's `copy`: one DeprecationWarning per table and slot on
    every save (135 in save_paths_test alone). Keras' own Dense still
    warns so on TF 2.21 (pyproject filters that one), hence no Dense here."""
    inputs = {"item": keras.Input((None,), dtype="int64", name="item")}
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 50), 8
    )
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    model = keras.Model(inputs, layer(inputs))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.save(str(tmp_path / "m.keras"))
        model.save_weights(str(tmp_path / "m.weights.h5"))


def test_damaged_keras_file(tmp_path):
    path = str(tmp_path / "m.keras")
    _model().save(path)
    assert isinstance(kte.load_model(path), keras.Model)
    flipped = str(tmp_path / "flipped.keras")
    with open(path, "rb") as source:
        data = bytearray(source.read())
    # Flip a byte in the middle of the archive (member data, not headers).
    data[len(data) // 2] ^= 0xFF
    with open(flipped, "wb") as target:
        target.write(data)
    with pytest.raises(
        ValueError, match="flipped.keras is truncated or corrupt"
    ):
        kte.load_model(flipped)
    truncated = str(tmp_path / "short.keras")
    with open(truncated, "wb") as target:
        target.write(data[: len(data) // 3])
    with pytest.raises(ValueError, match="short.keras is truncated or corrupt"):
        kte.load_model(truncated)


def test_damaged_saved_model(tmp_path):
    path = kte.export_saved_model(_model(), str(tmp_path / "sm"), inputs="ids")
    assert kte.load_saved_model(path) is not None
    data = glob.glob(os.path.join(path, "variables", "variables.data-*"))[0]
    testing.flip_byte(data, 16)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        kte.load_saved_model(path)
    other = kte.export_saved_model(
        _model(), str(tmp_path / "sm2"), inputs="ids"
    )
    graph = os.path.join(other, "saved_model.pb")
    with open(graph, "r+b") as handle:
        handle.truncate(os.path.getsize(graph) // 2)
    with pytest.raises(
        ValueError, match="sm2.*saved_model.pb is truncated or corrupt"
    ):
        kte.load_saved_model(other)


def _weighted_export(tmp_path):
    item = kte.categorical_column_with_identity("item", 10)
    weighted = kte.weighted_categorical_column(
        kte.categorical_column_with_identity("x", 10), "xw"
    )
    columns = [kte.embedding_column(item, 4), kte.embedding_column(weighted, 4)]
    pre = kte.FeaturePreprocessor(columns)
    inputs = pre.keras_inputs()
    layer = kte.TPUEmbeddingLayer(columns, output="concat")
    model = keras.Model(
        inputs, keras.layers.Dense(1, name="score")(layer(inputs))
    )
    return kte.export_saved_model(model, str(tmp_path / "sm"), pre)


def _good_feeds():
    return {
        "item": tf.constant([[2]], tf.int64),
        "x": tf.constant([[1]], tf.int64),
        "xw": tf.constant([[1.0]]),
    }


def test_signatures_refuse_ids_that_would_change(tmp_path):
    """TF converts numpy float64 [[2.7]] to id 2 and wraps uint64 ids of
    2**63 or more negative when a signature is called with them."""
    signature = kte.load_saved_model(_weighted_export(tmp_path)).signatures[
        "serving_default"
    ]
    with pytest.raises(TypeError, match="Feature 'item'.*float64"):
        signature(**dict(_good_feeds(), item=np.array([[2.7]])))
    with pytest.raises(ValueError, match="Feature 'item'.*2\\*\\*63"):
        signature(
            **dict(_good_feeds(), item=np.array([[2**63 + 2]], np.uint64))
        )


def test_rank_3_ids_are_refused_inside_the_export(tmp_path):
    """Checked in the graph, so a plain tf.saved_model.load refuses too."""
    path = _weighted_export(tmp_path)
    for signature in (
        tf.saved_model.load(path).signatures["serving_default"],
        kte.load_saved_model(path).signatures["serving_default"],
    ):
        with pytest.raises(
            (ValueError, tf.errors.InvalidArgumentError),
            # Assert escapes the quotes in its message.
            match=r"Feature \\?'item\\?' must be \[batch\]",
        ):
            signature(
                **dict(_good_feeds(), item=tf.constant([[[2]]], tf.int64))
            )


def test_integer_weights_are_cast_by_the_loaded_signature(tmp_path):
    signature = kte.load_saved_model(_weighted_export(tmp_path)).signatures[
        "serving_default"
    ]
    want = signature(**_good_feeds())
    got = signature(**dict(_good_feeds(), xw=tf.constant([[1]])))
    np.testing.assert_array_equal(got["score"], want["score"])


def _vocabulary_export(tmp_path):
    vocabulary = tmp_path / "users.txt"
    vocabulary.write_text("u1\nu2\nu3\n")
    user = kte.categorical_column_with_vocabulary_file("user", str(vocabulary))
    columns = [kte.embedding_column(user, 4)]
    pre = kte.FeaturePreprocessor(columns)
    inputs = pre.keras_inputs()
    layer = kte.TPUEmbeddingLayer(columns, output="concat")
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
    return kte.export_saved_model(model, str(tmp_path / "vsm"), pre)


def test_edited_vocabulary_asset_is_named(tmp_path):
    """An edited asset loads fine in TensorFlow and swaps users."""
    path = _vocabulary_export(tmp_path)
    assert kte.load_saved_model(path) is not None
    (asset,) = glob.glob(os.path.join(path, "assets", "*"))
    with open(asset, "w") as handle:
        handle.write("u2\nu1\nu3\n")
    tf.saved_model.load(path)  # TensorFlow alone sees nothing wrong.
    with pytest.raises(ValueError, match="users.txt.*edited since export"):
        kte.load_saved_model(path)


def test_truncated_variables_are_named(tmp_path):
    """TensorFlow raised IndexError: Read less bytes than requested."""
    path = _weighted_export(tmp_path)
    (data,) = glob.glob(os.path.join(path, "variables", "variables.data-*"))
    with open(data, "r+b") as handle:
        handle.truncate(os.path.getsize(data) // 2)
    with pytest.raises(ValueError, match="variables.data.*truncated or"):
        kte.load_saved_model(path)
    # Unverified, TensorFlow's own error is still turned into one naming it.
    with pytest.raises(ValueError, match="sm is truncated or corrupt"):
        kte.load_saved_model(path, verify=False)


def test_truncated_checkpoint_data_is_named(tmp_path):
    layer = kte.TPUEmbeddingLayer(
        [kte.embedding_column(kte.categorical_column_with_identity("i", 9), 4)]
    )
    layer.build()
    checkpoint = tf.train.Checkpoint(embedding=kte.engine_checkpoint(layer))
    path = checkpoint.write(str(tmp_path / "ck"))
    (data,) = glob.glob(path + ".data-*")
    with open(data, "r+b") as handle:
        handle.truncate(os.path.getsize(data) // 2)
    with pytest.raises(ValueError, match="ck.*truncated or corrupt"):
        kte.restore_tables(layer, path)


def _sweep_model():
    inputs = {"item": keras.Input((None,), dtype="int64", name="item")}
    layer = kte.TPUEmbeddingLayer(
        [
            kte.embedding_column(
                kte.categorical_column_with_identity("item", 50), 8
            )
        ],
        output="concat",
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
        name="emb",
    )
    return keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))


FLIPS_PER_ARTEFACT = 20
SWEEP_DOC = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "docs", "bad-input.md"
)


def _readme_sweep_figures():
    """The damage sweep table of docs/bad-input.md as
    {(kind, outcome): count}, and the (TensorFlow, Keras) versions its
    figures were taken on."""
    text = open(SWEEP_DOC).read()
    versions = re.search(
        r"Figures on TensorFlow ([0-9.]+) / Keras ([0-9.]+):", text
    )
    assert versions, "docs/bad-input.md lost the damage sweep's versions"
    kinds = {
        "SavedModel": "savedmodel",
        "`.keras`": "keras",
        "`.weights.h5`": "weights.h5",
        "checkpoint by `save`": "checkpoint save",
        "checkpoint by `write`": "checkpoint write",
    }
    outcomes = ("refused, naming the file", "same values", "CHANGED")
    table = text[versions.end() :].split("\n\n")[1]
    stated = {}
    for line in table.splitlines()[2:]:
        artefact, *counts = [c.strip() for c in line.strip("|").split("|")]
        kind = kinds[artefact.split(" (")[0]]
        for outcome, count in zip(outcomes, counts, strict=True):
            if int(count):
                stated[kind, outcome] = int(count)
    assert {kind for kind, _ in stated} == set(kinds.values()), table
    return stated, versions.groups()


def test_damage_sweep(tmp_path):
    """Random single-byte flips (fixed seed) in each artefact, loaded by our
    loaders. Every flip must load the same values or be refused naming the
    file; only `.weights.h5` (HDF5, no checksums over values) may load
    different values, and docs/bad-input.md states how often that happened."""
    rng = np.random.default_rng(16)
    model = _sweep_model()
    want = [w.numpy() for w in model.weights]
    view = tf.train.Checkpoint(embedding=kte.engine_checkpoint(model))
    originals = {
        "savedmodel": kte.export_saved_model(
            model, str(tmp_path / "sm"), inputs="ids"
        ),
        "keras": str(tmp_path / "m.keras"),
        "weights.h5": str(tmp_path / "m.weights.h5"),
        "checkpoint save": view.save(str(tmp_path / "save" / "ck")),
        "checkpoint write": view.write(str(tmp_path / "write" / "ck")),
    }
    model.save(originals["keras"])
    model.save_weights(originals["weights.h5"])

    def flip(path):
        data = bytearray(open(path, "rb").read())
        data[int(rng.integers(len(data)))] ^= int(rng.integers(1, 256))
        with open(path, "wb") as handle:
            handle.write(data)

    def same(loaded):
        # A load that drops weights is not the same (a bare zip stopped at
        # the shorter list and called it equal).
        weights = list(loaded.weights)
        return len(weights) == len(want) and all(
            np.array_equal(a, b.numpy())
            for a, b in zip(want, weights, strict=True)
        )

    def copy(kind, index):
        target = str(tmp_path / f"flip{index}" / kind.replace(" ", "_"))
        source = originals[kind]
        if kind == "savedmodel":
            shutil.copytree(source, target)
            files = sorted(glob.glob(target + "/**/*.*", recursive=True))
            files += [os.path.join(target, "saved_model.pb")]
            return target, sorted(f for f in set(files) if os.path.isfile(f))
        if kind.startswith("checkpoint"):
            os.makedirs(target)
            for part in glob.glob(source + ".*"):
                shutil.copy(part, target)
            target = os.path.join(target, os.path.basename(source))
            return target, sorted(glob.glob(target + ".*"))
        os.makedirs(target)
        target = os.path.join(target, os.path.basename(source))
        shutil.copy(source, target)
        return target, [target]

    serving = {
        tuple(w.shape): w.numpy() for w in testing.serving_weights(model)
    }
    every_id = np.arange(50, dtype=np.int64)[:, np.newaxis]
    served = model.predict_on_batch({"item": every_id})

    def same_served(loaded):
        # The export keeps the serving weights only (no slots), each once.
        held = [v.numpy() for v in loaded.variables_read]
        return (
            sorted(serving) == sorted(v.shape for v in held)
            and all(np.array_equal(serving[v.shape], v) for v in held)
            and np.array_equal(
                next(iter(loaded.serve(item=every_id).values())), served
            )
        )

    def load(kind, path):
        if kind == "savedmodel":
            return same_served(kte.load_saved_model(path))
        if kind == "keras":
            return same(kte.load_model(path))
        fresh = _sweep_model()
        if kind == "weights.h5":
            kte.load_weights(fresh, path)
        else:
            kte.restore_tables(fresh, path)
            return np.array_equal(
                fresh.get_layer("emb").table_variable("item").numpy(),
                model.get_layer("emb").table_variable("item").numpy(),
            )
        return same(fresh)

    outcomes = collections.Counter()
    for kind in originals:
        for index in range(FLIPS_PER_ARTEFACT):
            path, files = copy(kind, index)
            flip(files[int(rng.integers(len(files)))])
            try:
                outcome = "same values" if load(kind, path) else "CHANGED"
            except ValueError as error:
                assert os.path.dirname(path) in str(error), error
                outcome = "refused, naming the file"
            outcomes[kind, outcome] += 1
    print(dict(outcomes))
    changed = {k: v for k, v in outcomes.items() if k[1] == "CHANGED"}
    assert set(kind for kind, _ in changed) <= {"weights.h5"}, outcomes
    # The docs' figures are this sweep's, on the versions it names (other
    # versions write files of other sizes, so other bytes are flipped).
    stated, versions = _readme_sweep_figures()
    if all(
        v.startswith(want)
        for v, want in zip((tf.__version__, keras.__version__), versions)
    ):
        assert {k: v for k, v in outcomes.items() if v} == stated, (
            f"docs/bad-input.md damage sweep table: {stated}, "
            f"this run: {outcomes}"
        )


def test_checked_signatures_keep_the_signature_attributes(tmp_path):
    signature = kte.load_saved_model(_weighted_export(tmp_path)).signatures[
        "serving_default"
    ]
    assert set(signature.structured_outputs) == {"score"}
    assert copy.copy(signature).specs == signature.specs


@pytest.mark.parametrize("table_dtype", ["float32", "bfloat16", "int8"])
def test_loaded_export_says_how_its_tables_are_stored(tmp_path, table_dtype):
    model = _model()
    path = kte.export_saved_model(
        model, str(tmp_path / "e"), table_dtype=table_dtype, inputs="ids"
    )
    loaded = kte.load_saved_model(path)
    assert loaded.table_dtype == table_dtype
    out = loaded.serve(item=np.array([[1, 2]], np.int64))
    # The served value is the model's on its tables stored as said.
    table = model.layers[1].table_variable("item").numpy()
    stored = quantization.dequantize_rows(
        *quantization.quantize_rows(table, table_dtype, "item")
    ).numpy()
    kernel, bias = (w.numpy() for w in model.layers[-1].weights)
    want = stored[[1, 2]].mean(axis=0, keepdims=True) @ kernel + bias
    np.testing.assert_allclose(next(iter(out.values())), want, rtol=1e-5)
    if table_dtype != "float32":  # and not the float32 tables
        exact = table[[1, 2]].mean(axis=0, keepdims=True) @ kernel + bias
        assert not np.allclose(want, exact, rtol=1e-6, atol=0)


def test_an_export_without_the_record_has_float32_tables(tmp_path):
    path = kte.export_saved_model(_model(), str(tmp_path / "e"), inputs="ids")
    os.remove(os.path.join(path, "assets.extra", "keras_tpu_embed_export.json"))
    assert kte.load_saved_model(path, verify=False).table_dtype == "float32"


def test_serve_names_inputs_it_cannot_take(tmp_path):
    serve = kte.load_saved_model(_weighted_export(tmp_path)).serve
    ragged = {"item": [[1, 2], [3]], "x": [[1], [2]], "xw": [[1.0], [1.0]]}
    with pytest.raises(ValueError, match=r"Feature 'item'.*ragged.*pad"):
        serve(**ragged)
    for value in (
        tf.ragged.constant([[1, 2], [3]], tf.int64),
        tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64)),
    ):
        with pytest.raises(TypeError, match=r"Feature 'item'.*Tensor.*pad"):
            serve(**dict(_good_feeds(), item=value))
    with pytest.raises(ValueError, match=r"batch.*'item': 2.*'x': 1"):
        serve(**dict(_good_feeds(), item=tf.constant([[1], [2]], tf.int64)))
    with pytest.raises(ValueError, match=r"Feature 'item'.*int64 range"):
        serve(**dict(_good_feeds(), item=[[2**63, -1]]))


def test_serve_takes_an_empty_list_as_an_empty_batch(tmp_path):
    serve = kte.load_saved_model(_weighted_export(tmp_path)).serve
    out = serve(item=[], x=[], xw=[])
    assert out["score"].shape[0] == 0
