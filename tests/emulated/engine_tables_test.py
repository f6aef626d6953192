"""Finding 2: `kte.validate_tables` and `kte.restore_tables` on a model
whose tables are all on the TPU embedding engine.

`engine_checkpoint` returns the engine's own mid-level object there, which
has no `named_variables()`: both crashed with an AttributeError. They must
read the engine's tables as they are on the chip, and restore into it.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models


def _poison_row(model, table, row):
    """Writes NaN into `row` of `table` on the (emulated) chip."""
    mid_level = model.get_layer("embed").engine.mid_level
    mid_level._retrieve_variables()
    shard = mid_level._variables[table]["parameters"].variables[0]
    shard[row, 1].assign(float("nan"))
    mid_level._load_variables()


def test_validate_tables_reads_the_engine():
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.fit(models.batches(strategy), steps_per_epoch=2, verbose=0)
        assert kte.validate_tables(model) == {}
        _poison_row(model, "item", 3)
        assert kte.validate_tables(model) == {"item": [3]}


def test_validate_tables_before_the_first_step_says_so():
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, "adagrad")
        with pytest.raises(ValueError, match="first step"):
            kte.validate_tables(model)


def _cpu_checkpoint(tmp_path):
    """A checkpoint of a CPU model trained on one device, and its values."""
    cpu = models.trained_one_device("adagrad", epochs=1)
    path = tf.train.Checkpoint(embedding=kte.engine_checkpoint(cpu)).write(
        str(tmp_path / "cpu")
    )
    return path, models.local_values(cpu)


@pytest.mark.parametrize("steps_first", [0, 1])
def test_restore_tables_from_cpu_into_the_engine(tmp_path, steps_first):
    path, expected = _cpu_checkpoint(tmp_path)
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        keras.utils.set_random_seed(5)
        with strategy.scope():
            model = models.build(models.OPTIMIZERS["adagrad"]())
        if steps_first:
            model.fit(models.batches(strategy), steps_per_epoch=1, verbose=0)
        kte.restore_tables(model, path)
        if not steps_first:
            # TF creates the engine's tables at the first step, from the
            # checkpoint read before; predict changes no table.
            model.predict(models.batches(strategy), verbose=0)
        models.assert_values_equal(models.engine_values(model), expected)


def test_restore_tables_refuses_a_mismatched_checkpoint(tmp_path):
    other = kte.TPUEmbeddingLayer(
        [
            kte.embedding_column(
                kte.categorical_column_with_identity("user", 9), 4
            )
        ],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
    )
    other.build()
    path = tf.train.Checkpoint(embedding=kte.engine_checkpoint(other)).write(
        str(tmp_path / "other")
    )
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, "adagrad")
        with pytest.raises(ValueError) as error:
            kte.restore_tables(model, path)
    message = str(error.value)
    assert "table 'user' has shape [9, 4] in the checkpoint but [20, 4]" in (
        message
    )
    assert "table 'item' is missing" in message


def test_restore_tables_round_trip_between_engines(tmp_path):
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        trained = models.build_emulated(strategy, "ftrl")
        trained.fit(models.batches(strategy), steps_per_epoch=3, verbose=0)
        expected = models.engine_values(trained)
        path = tf.train.Checkpoint(
            embedding=kte.engine_checkpoint(trained)
        ).write(str(tmp_path / "engine"))
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        keras.utils.set_random_seed(5)
        with strategy.scope():
            model = models.build(models.OPTIMIZERS["ftrl"]())
        model.fit(models.batches(strategy), steps_per_epoch=1, verbose=0)
        assert not np.allclose(
            models.engine_values(model)["user"], expected["user"]
        )
        kte.restore_tables(model, path)
        models.assert_values_equal(models.engine_values(model), expected)
