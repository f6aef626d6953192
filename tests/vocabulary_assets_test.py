"""Vocabulary files travel inside `.keras` archives."""

import json
import pathlib
import shutil
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing

ROOT = pathlib.Path(__file__).resolve().parents[1]

PREDICT_SCRIPT = r"""
import json, sys
import numpy as np, keras, tensorflow as tf
import keras_tpu_embed as kte
model = keras.models.load_model(sys.argv[1])
raw = {"country": tf.constant(json.loads(sys.argv[2]))}
print("PREDICTIONS " + json.dumps(
    np.asarray(model(raw)).astype(np.float64).tolist()))
"""


def _raw_model(vocabulary):
    """A model on raw strings: the preprocessor is one of its layers."""
    country = kte.categorical_column_with_vocabulary_file(
        "country", str(vocabulary), num_oov_buckets=1
    )
    columns = [kte.embedding_column(country, 3)]
    pre = kte.FeaturePreprocessor(columns)
    raw = {"country": keras.Input((None,), dtype="string", name="country")}
    embedded = kte.TPUEmbeddingLayer(columns, output="concat")(pre(raw))
    return keras.Model(raw, keras.layers.Dense(1)(embedded))


@pytest.mark.slow
def test_keras_file_predicts_in_a_fresh_process_with_the_file_gone(tmp_path):
    vocabulary = tmp_path / "vocab" / "countries.txt"
    vocabulary.parent.mkdir()
    vocabulary.write_text("us\nfr\nde\njp\n")
    model = _raw_model(vocabulary)
    rows = [["jp", "fr"], ["xx", ""], ["us", "de"]]
    want = np.asarray(model({"country": tf.constant(rows)}))
    model.save(tmp_path / "model.keras")
    shutil.rmtree(vocabulary.parent)

    result = testing.run_python(
        "-c",
        PREDICT_SCRIPT,
        str(tmp_path / "model.keras"),
        json.dumps(rows),
        KERAS_BACKEND="tensorflow",
    )
    lines = [x for x in result.stdout.splitlines() if "PREDICTIONS " in x]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    got = np.array(json.loads(lines[-1].split("PREDICTIONS ", 1)[1]))
    np.testing.assert_array_equal(got.astype(np.float32), want)


def test_loaded_columns_read_the_archive_copy(tmp_path):
    vocabulary = tmp_path / "countries.txt"
    vocabulary.write_text("us\nfr\nde\n")
    model = _raw_model(vocabulary)
    model.save(tmp_path / "model.keras")
    # The file on disk changes after saving: the archive's copy wins.
    vocabulary.write_text("de\nfr\nus\n")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    layer = next(
        x for x in loaded.layers if isinstance(x, kte.TPUEmbeddingLayer)
    )
    path = layer.columns[0].categorical_column.vocabulary_file
    assert path != str(vocabulary)
    assert pathlib.Path(path).read_text() == "us\nfr\nde\n"
    rows = tf.constant([["us"], ["de"], ["zz"]])
    np.testing.assert_array_equal(
        loaded({"country": rows}), model({"country": rows})
    )


def test_edited_vocabulary_in_the_archive_is_refused(tmp_path):
    vocabulary = tmp_path / "countries.txt"
    vocabulary.write_text("us\nfr\nde\n")
    _raw_model(vocabulary).save(tmp_path / "model.keras")
    edited = tmp_path / "edited.keras"
    with zipfile.ZipFile(tmp_path / "model.keras") as source:
        with zipfile.ZipFile(edited, "w") as target:
            for item in source.infolist():
                data = source.read(item.filename)
                if item.filename.endswith("vocabulary_0.txt"):
                    data = b"fr\nus\nde\n"
                target.writestr(item, data)
    with pytest.raises(ValueError, match="does not match its recorded SHA"):
        keras.models.load_model(edited)


def test_missing_vocabulary_without_an_archive_names_the_file(tmp_path):
    vocabulary = tmp_path / "countries.txt"
    vocabulary.write_text("us\nfr\n")
    country = kte.categorical_column_with_vocabulary_file(
        "country", str(vocabulary)
    )
    config = keras.saving.serialize_keras_object(
        kte.FeaturePreprocessor([kte.embedding_column(country, 2)])
    )
    vocabulary.unlink()
    pre = keras.saving.deserialize_keras_object(config)
    with pytest.raises(ValueError, match="countries.txt"):
        pre({"country": tf.constant([["us"]])})


@pytest.mark.parametrize(
    "damage", ["shorter", "duplicate", "blank", "empty", "directory"]
)
def test_archive_copy_wins_over_an_invalid_original(tmp_path, damage):
    vocabulary = tmp_path / "countries.txt"
    vocabulary.write_text("us\nfr\nde\n")
    model = _raw_model(vocabulary)
    rows = tf.constant([["us"], ["de"], ["zz"]])
    want = np.asarray(model({"country": rows}))
    model.save(tmp_path / "model.keras")
    if damage == "directory":
        vocabulary.unlink()
        vocabulary.mkdir()
    else:
        vocabulary.write_text(
            {
                "shorter": "us\n",
                "duplicate": "us\nus\nde\n",
                "blank": "us\n\nde\n",
                "empty": "",
            }[damage]
        )
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(loaded({"country": rows}), want)


def test_archive_copy_wins_over_a_relative_path_resolving_elsewhere(
    tmp_path, monkeypatch
):
    first = tmp_path / "first"
    first.mkdir()
    (first / "countries.txt").write_text("us\nfr\nde\n")
    monkeypatch.chdir(first)
    model = _raw_model("countries.txt")
    rows = tf.constant([["us"], ["de"], ["zz"]])
    want = np.asarray(model({"country": rows}))
    model.save(tmp_path / "model.keras")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "countries.txt").write_text("jp\n")
    monkeypatch.chdir(elsewhere)
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(loaded({"country": rows}), want)
