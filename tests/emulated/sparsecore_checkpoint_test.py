"""SparseCore tables reach a CPU model by table name, and come back.

`engine_checkpoint` unstacks and unshards `TPUEmbeddingV2`'s stacked
tables and slots into the per-table CPU layout when it saves, and writes a
CPU table into its rows of the stack when it restores (before the
engine's first step: when TF creates the tables). Values move bit for bit;
training after a restore on the emulated SparseCore equals training the
CPU model from the same values.
"""

import keras
import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models
from tests.emulated import sparsecore_training_test as training

OPTIMIZER = "adagrad"


def _assert_bit_equal(actual, expected):
    assert sorted(actual) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], name)


def _write(model, path):
    return tf.train.Checkpoint(embedding=kte.engine_checkpoint(model)).write(
        str(path)
    )


def _fit_one_epoch(strategy, model):
    batches = kte.distribute_dataset(
        strategy, training.dataset(), models.GLOBAL_BATCH
    )
    model.fit(batches, steps_per_epoch=training.STEPS, verbose=0)


def _build(strategy, seed):
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        return training.build(models.OPTIMIZERS[OPTIMIZER]())


def test_sparse_core_tables_reach_a_cpu_model_and_come_back(tmp_path):
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        model, _, _ = training._fit(strategy, OPTIMIZER)
        trained = training._tables(model)
        path = _write(model, tmp_path / "sparse_core")

    # On CPU, from other initial values: every table and slot arrives.
    cpu = _build(tf.distribute.get_strategy(), seed=5)
    assert not np.allclose(training._tables(cpu)["genres"], trained["genres"])
    kte.restore_tables(cpu, path)
    _assert_bit_equal(training._tables(cpu), trained)
    assert kte.validate_tables(cpu) == {}

    # The CPU model trains on; its checkpoint goes back to SparseCore.
    _fit_one_epoch(tf.distribute.get_strategy(), cpu)
    on_cpu = training._tables(cpu)
    assert not np.allclose(on_cpu["genres"], trained["genres"])
    back = _write(cpu, tmp_path / "cpu")

    with emulated_tpu(2, embedding_feature="V2") as strategy:
        # Restored before the first step: TF creates the tables then.
        early = _build(strategy, seed=6)
        kte.restore_tables(early, back)
        # The dense head is not an embedding table: copied by hand.
        early.get_layer("head").set_weights(cpu.get_layer("head").get_weights())
        _fit_one_epoch(strategy, early)
        early_trained = training._tables(early)
        assert kte.validate_tables(early) == {}
    # One engine per TPU system: the second model on a second one.
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        # Restored after a step: written into the stacked, sharded tables.
        late = _build(strategy, seed=7)
        _fit_one_epoch(strategy, late)
        kte.restore_tables(late, back)
        restored = training._tables(late)
    _assert_bit_equal(restored, on_cpu)
    # Training from the restored values equals training on CPU: the rows
    # landed where the SparseCore looks them up.
    _fit_one_epoch(tf.distribute.get_strategy(), cpu)
    models.assert_values_equal(early_trained, training._tables(cpu))


def test_keras_save_paths_carry_sparse_core_tables_both_ways(tmp_path):
    weights = str(tmp_path / "sparse_core.weights.h5")
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        model, _, _ = training._fit(strategy, OPTIMIZER)
        trained = training._tables(model)
        model.save_weights(weights)
        whole = tf.train.Checkpoint(model=model).write(str(tmp_path / "m"))
    for load in ("save_weights", "checkpoint"):
        cpu = _build(tf.distribute.get_strategy(), seed=5)
        if load == "save_weights":
            cpu.load_weights(weights)
        else:
            tf.train.Checkpoint(model=cpu).read(
                whole
            ).assert_existing_objects_matched()
        _assert_bit_equal(training._tables(cpu), trained)

    # CPU weights onto SparseCore, loaded before the first step.
    _fit_one_epoch(tf.distribute.get_strategy(), cpu)
    cpu_weights = str(tmp_path / "cpu.weights.h5")
    cpu.save_weights(cpu_weights)
    once = training.dataset()
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        tpu = _build(strategy, seed=6)
        tpu.load_weights(cpu_weights)
        predicted = tpu.predict(
            kte.distribute_dataset(strategy, once, models.GLOBAL_BATCH),
            steps=training.STEPS,
            verbose=0,
        )
        _assert_bit_equal(training._tables(tpu), training._tables(cpu))
    # And through tf.train.Checkpoint(model=...), before the first step.
    cpu_whole = tf.train.Checkpoint(model=cpu).write(str(tmp_path / "c"))
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        tpu = _build(strategy, seed=7)
        tf.train.Checkpoint(model=tpu).read(
            cpu_whole
        ).assert_existing_objects_matched()
        tpu.predict(
            kte.distribute_dataset(strategy, once, models.GLOBAL_BATCH),
            steps=1,
            verbose=0,
        )
        _assert_bit_equal(training._tables(tpu), training._tables(cpu))
    np.testing.assert_allclose(
        predicted,
        cpu.predict(
            kte.distribute_dataset(
                tf.distribute.get_strategy(), once, models.GLOBAL_BATCH
            ),
            steps=training.STEPS,
            verbose=0,
        ),
        atol=1e-5,
    )
