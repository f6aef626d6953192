"""Finding 3: Keras' save paths carry the TPU engine's tables.

`model.save_weights`, `.keras` and `ModelCheckpoint` of a model whose
tables are on the TPU embedding engine used to write the layer's step and
trigger only: the tables and slots were silently left out. They are now
stored under the names a CPU model uses (`<table>`, `<table>.S<slot>`),
read from the TPU, and loading puts them back onto the TPU, so weights move
between the engine and CPU both ways.
"""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models


def _cpu_model(seed=9):
    keras.utils.set_random_seed(seed)
    return models.build(models.OPTIMIZERS["adam"]())


def _batches_from_step(strategy, step):
    """`models.batches` from its global batch `step` on: a second `fit`
    goes on with the batches the first would have fed next."""
    rows = models.dataset().skip(step * models.GLOBAL_BATCH)
    return kte.distribute_dataset(strategy, rows, models.GLOBAL_BATCH)


@pytest.fixture(scope="module")
def adam_saves(tmp_path_factory):
    """One Adam model on the engine, saved by the three Keras save paths.

    Module-scoped: each test of a save path traced its own `fit` of this
    model (the costly part). Each save is the first read of the chip after
    a training step, as it was alone (the host copies are stale, so a save
    that failed to read the chip would write stale tables): after 2 steps
    `ModelCheckpoint` saves at the end of its epoch, after a third
    `save_weights`, after a fourth `model.save` (`.keras`). The values to
    compare with are the engine's, read after each save.
    """
    directory = tmp_path_factory.mktemp("adam_saves")
    saved = types.SimpleNamespace(
        checkpoint=str(directory / "epoch1.weights.h5"),
        weights=str(directory / "engine.weights.h5"),
        archive=str(directory / "model.keras"),
    )
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, "adam")
        model.fit(
            models.batches(strategy),
            steps_per_epoch=2,
            verbose=0,
            callbacks=[
                keras.callbacks.ModelCheckpoint(
                    str(directory / "epoch{epoch}.weights.h5"),
                    save_weights_only=True,
                )
            ],
        )
        saved.checkpoint_values = models.engine_values(model)

        model.fit(_batches_from_step(strategy, 2), steps_per_epoch=1, verbose=0)
        model.save_weights(saved.weights)
        saved.weights_values = models.engine_values(model)
        saved.weights_step = int(
            model.get_layer("embed").embedding_step.numpy()
        )

        model.fit(_batches_from_step(strategy, 3), steps_per_epoch=1, verbose=0)
        model.save(saved.archive)
        saved.archive_values = models.engine_values(model)
    return saved


def test_save_weights_carries_the_engine_tables_to_cpu(adam_saves):
    cpu = _cpu_model()
    cpu.load_weights(adam_saves.weights)
    models.assert_values_equal(
        models.local_values(cpu), adam_saves.weights_values
    )
    assert int(cpu.get_layer("embed").embedding_step.numpy()) == 3
    assert adam_saves.weights_step == 3


@pytest.fixture(scope="module")
def cpu_adam_weights(tmp_path_factory):
    """The one-device Adam model after one epoch: its weights file, its
    tables and its predictions. Module-scoped: both cases of
    `test_load_weights_puts_cpu_tables_onto_the_engine` load it, and
    training it once is one trace of `fit` and one of `predict` fewer."""
    path = str(tmp_path_factory.mktemp("cpu_adam") / "cpu.weights.h5")
    cpu = models.one_device("adam", epochs=1)
    cpu.save_weights(path)
    return types.SimpleNamespace(
        path=path,
        values=models.local_values(cpu),
        predictions=cpu.predict(
            models.batches(tf.distribute.get_strategy()), verbose=0
        ),
    )


@pytest.mark.parametrize("steps_first", [0, 1])
def test_load_weights_puts_cpu_tables_onto_the_engine(
    cpu_adam_weights, steps_first
):
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, "adam")
        if steps_first:
            model.fit(models.batches(strategy), steps_per_epoch=1, verbose=0)
        model.load_weights(cpu_adam_weights.path)
        # Before the first step the tables do not exist yet: they are
        # loaded when the engine creates them; predict changes none.
        predictions = model.predict(models.batches(strategy), verbose=0)
        models.assert_values_equal(
            models.engine_values(model), cpu_adam_weights.values
        )
        assert int(model.get_layer("embed").embedding_step.numpy()) == 4
    np.testing.assert_allclose(
        predictions, cpu_adam_weights.predictions, atol=1e-5
    )


def test_keras_archive_carries_the_engine_tables(adam_saves):
    loaded = keras.saving.load_model(adam_saves.archive)
    models.assert_values_equal(
        models.local_values(loaded), adam_saves.archive_values
    )


def test_model_checkpoint_carries_the_engine_tables(adam_saves):
    cpu = _cpu_model()
    cpu.load_weights(adam_saves.checkpoint)
    models.assert_values_equal(
        models.local_values(cpu), adam_saves.checkpoint_values
    )


def test_save_weights_before_the_first_step_refuses(tmp_path):
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, "adam")
        with pytest.raises(RuntimeError, match="first step"):
            model.save_weights(str(tmp_path / "early.weights.h5"))


def test_backup_and_restore_resumes_with_the_engine_tables(tmp_path):
    expected = models.one_device("adam", epochs=2)

    def backup():
        return keras.callbacks.BackupAndRestore(
            str(tmp_path / "backup"), delete_checkpoint=False
        )

    with emulated_tpu(2, embedding_feature="V1") as strategy:
        first = models.build_emulated(strategy, "adam")
        first.fit(
            models.batches(strategy), epochs=1, verbose=0, callbacks=[backup()]
        )
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        # Other initial values: everything must come from the backup.
        keras.utils.set_random_seed(9)
        with strategy.scope():
            model = models.build(models.OPTIMIZERS["adam"]())
        model.fit(
            models.batches(strategy), epochs=2, verbose=0, callbacks=[backup()]
        )
        models.assert_values_equal(
            models.engine_values(model), models.local_values(expected)
        )
        assert int(model.get_layer("embed").embedding_step.numpy()) == 8


def _mixed_model(optimizer):
    """'user' on the engine, 'item' on the tensor core: one layer, both."""
    return models.build(optimizer, item_on_tensor_core=True)


def test_save_weights_of_a_mixed_layer_carries_both_kinds(tmp_path):
    path = str(tmp_path / "mixed.weights.h5")
    keras.utils.set_random_seed(models.SEED)
    expected = _mixed_model(kte.optimizers.Adagrad(0.1))
    expected.fit(
        models.batches(tf.distribute.get_strategy()), epochs=1, verbose=0
    )
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        keras.utils.set_random_seed(models.SEED)
        with strategy.scope():
            model = _mixed_model(kte.optimizers.Adagrad(0.1))
        layer = model.get_layer("embed")
        assert [t.name for t in layer.local_table_specs] == ["item"]
        assert layer.engine is not None
        model.fit(models.batches(strategy), epochs=1, verbose=0)
        model.save_weights(path)
        engine = models.engine_values(model)
        assert sorted(engine) == ["user", "user/accumulators"]
    cpu = _mixed_model(kte.optimizers.Adagrad(0.1))
    cpu.load_weights(path)
    values = models.local_values(cpu)
    models.assert_values_equal(values, models.local_values(expected))
    models.assert_values_equal({name: values[name] for name in engine}, engine)


def test_checkpoint_of_the_model_moves_engine_tables_to_cpu(tmp_path):
    """`tf.train.Checkpoint(model=model)` names the engine's tables as a CPU
    layer names its own: they were under the mid-level object's node, so a
    CPU model's `read` matched nothing and kept its initial tables."""
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.fit(models.batches(strategy), epochs=1, verbose=0)
        path = tf.train.Checkpoint(model=model).write(str(tmp_path / "m"))
        engine = models.engine_values(model)
    cpu = models.build(models.OPTIMIZERS["adagrad"]())
    tf.train.Checkpoint(model=cpu).read(path).assert_existing_objects_matched()
    models.assert_values_equal(models.local_values(cpu), engine)
