"""Damaged or mismatched saved state fails loudly, naming what is wrong."""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte


def _layer(key="item", dimension=4):
    column = kte.embedding_column(
        kte.categorical_column_with_identity(key, 10), dimension
    )
    layer = kte.TPUEmbeddingLayer(
        [column],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
    )
    layer.build()
    return layer


def _save(layer, path):
    checkpoint = tf.train.Checkpoint(embedding=kte.engine_checkpoint(layer))
    return checkpoint.save(str(path))


def _flip_byte(path, offset_from_end=8):
    with open(path, "r+b") as handle:
        handle.seek(-offset_from_end, os.SEEK_END)
        byte = handle.read(1)
        handle.seek(-offset_from_end, os.SEEK_END)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_restore_tables_round_trip(tmp_path):
    source, target = _layer(), _layer()
    path = _save(source, tmp_path / "ck")
    kte.restore_tables(target, path)
    np.testing.assert_array_equal(
        target.table_variable("item").numpy(),
        source.table_variable("item").numpy(),
    )


@pytest.mark.parametrize("how", ["write", "save"])
def test_restore_tables_reads_write_and_save_checkpoints(tmp_path, how):
    """`write` keeps no save counter; that is no reason to call it corrupt."""
    source, target = _layer(), _layer()
    source.table_variable("item").assign(
        np.arange(40, dtype="float32").reshape(10, 4)
    )
    source.slot_variables("item")["accumulators"].assign(
        np.full((10, 4), 0.5, "float32")
    )
    checkpoint = tf.train.Checkpoint(embedding=kte.engine_checkpoint(source))
    path = getattr(checkpoint, how)(str(tmp_path / "ck"))
    kte.restore_tables(target, path)
    np.testing.assert_array_equal(
        target.table_variable("item").numpy(),
        source.table_variable("item").numpy(),
    )
    np.testing.assert_array_equal(
        target.slot_variables("item")["accumulators"].numpy(),
        np.full((10, 4), 0.5, "float32"),
    )
    # Real damage is still named as such, for both kinds of checkpoint.
    data = glob.glob(path + ".data-*")[0]
    _flip_byte(data, 16)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        kte.restore_tables(_layer(), path)


def test_renamed_table_is_named(tmp_path):
    path = _save(_layer("product"), tmp_path / "ck")
    with pytest.raises(ValueError, match=r"table 'item' is missing.*'product'"):
        kte.restore_tables(_layer("item"), path)


def test_reshaped_table_names_both_shapes(tmp_path):
    path = _save(_layer(dimension=4), tmp_path / "ck")
    with pytest.raises(
        ValueError,
        match=r"shape \[10, 4\] in the checkpoint "
        r"but \[10, 8\] in the model",
    ):
        kte.restore_tables(_layer(dimension=8), path)


def test_corrupt_checkpoint_names_the_file(tmp_path):
    path = _save(_layer(), tmp_path / "ck")
    data = glob.glob(path + ".data-*")[0]
    _flip_byte(data, 16)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        kte.restore_tables(_layer(), path)


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
    _flip_byte(data, 16)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        kte.load_saved_model(path)
    other = kte.export_saved_model(_model(), str(tmp_path / "sm2"))
    graph = os.path.join(other, "saved_model.pb")
    with open(graph, "r+b") as handle:
        handle.truncate(os.path.getsize(graph) // 2)
    with pytest.raises(ValueError, match="sm2 is truncated or corrupt"):
        kte.load_saved_model(other)


def test_validate_tables_reports_non_finite_rows():
    layer = _layer()
    assert kte.validate_tables(layer) == {}
    layer.table_variable("item")[7, 1].assign(float("inf"))
    assert kte.validate_tables(layer) == {"item": [7]}
