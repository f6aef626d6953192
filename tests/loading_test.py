"""Damaged `.keras` files and SavedModels fail loudly, naming the file."""

import glob
import os

import keras
import pytest

import keras_tpu_embed as kte
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
    path = kte.export_saved_model(_model(), str(tmp_path / "sm"))
    assert kte.load_saved_model(path) is not None
    data = glob.glob(os.path.join(path, "variables", "variables.data-*"))[0]
    testing.flip_byte(data, 16)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        kte.load_saved_model(path)
    other = kte.export_saved_model(_model(), str(tmp_path / "sm2"))
    graph = os.path.join(other, "saved_model.pb")
    with open(graph, "r+b") as handle:
        handle.truncate(os.path.getsize(graph) // 2)
    with pytest.raises(ValueError, match="sm2 is truncated or corrupt"):
        kte.load_saved_model(other)
