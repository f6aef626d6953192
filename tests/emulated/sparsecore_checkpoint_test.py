"""SparseCore tables reach a CPU model by table name, and come back.

`engine_checkpoint` unstacks and unshards `TPUEmbeddingV2`'s stacked
tables and slots into the per-table CPU layout when it saves, and writes a
CPU table into its rows of the stack when it restores (before the
engine's first step: when TF creates the tables). Values move bit for bit;
training after a restore on the emulated SparseCore equals training the
CPU model from the same values.
"""

import pathlib
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3_utils

import keras_tpu_embed as kte
from keras_tpu_embed.engines.sparsecore.sparsecore_engine import (
    SparseCoreEngine,
)
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


@pytest.fixture(scope="module")
def on_sparse_core(tmp_path_factory):
    """The model of `sparsecore_training_test` trained once on SparseCore
    (the costly part: tracing a step under TF's `TPUEmbeddingV2`), its
    tables, and the files each test restores from: its engine checkpoint
    (`engine`), Keras weights (`weights`), `tf.train.Checkpoint` of the
    model (`whole`) and of the embedding layer alone (`layer`). Training
    is seeded, so this is what each test trained on its own before."""
    directory = tmp_path_factory.mktemp("sparse_core")
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        model, _, _ = training._fit(strategy, OPTIMIZER)
        weights = str(directory / "sparse_core.weights.h5")
        model.save_weights(weights)
        return types.SimpleNamespace(
            trained=training._tables(model),
            engine=_write(model, directory / "engine"),
            weights=weights,
            whole=tf.train.Checkpoint(model=model).write(str(directory / "m")),
            layer=tf.train.Checkpoint(layer=model.get_layer("embed")).write(
                str(directory / "tpu")
            ),
        )


def test_sparse_core_tables_reach_a_cpu_model_and_come_back(
    tmp_path, on_sparse_core
):
    trained, path = on_sparse_core.trained, on_sparse_core.engine
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


def test_keras_save_paths_carry_sparse_core_tables_both_ways(
    tmp_path, on_sparse_core
):
    trained = on_sparse_core.trained
    weights, whole = on_sparse_core.weights, on_sparse_core.whole
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


# ------------------------------------------------ one SparseCore at a time


def _forbid_whole_tables(monkeypatch):
    """Makes reading a table whole off the SparseCores fail: saving goes
    one SparseCore's slice at a time."""

    def whole(self, keys):
        raise AssertionError(f"read whole off the SparseCores: {keys}")

    monkeypatch.setattr(SparseCoreEngine, "_read_created", whole)


def _two_layers(strategy, seed):
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        return training._two_layers(models.OPTIMIZERS[OPTIMIZER]())


def _predict_once(strategy, model):
    """A step that trains nothing: the engine creates its tables."""
    model.predict(
        kte.distribute_dataset(
            strategy, training.dataset(), models.GLOBAL_BATCH
        ),
        steps=1,
        verbose=0,
    )


def _internal_layout(table, cores):
    """A table as TF lays it out on `cores` SparseCores (`tpu_embedding_
    v3_utils.shard_table`), padded as TF pads it: the layout a SparseCore
    checkpoint saves it in, `[cores, rows per core, padded width]`."""
    rows = -(-table.shape[0] // (8 * cores)) * 8 * cores
    padded = np.zeros([rows, -(-table.shape[1] // 8) * 8], np.float32)
    padded[: table.shape[0], : table.shape[1]] = table
    internal = _shard_table(cores, padded)
    return internal.reshape(cores, rows // cores, padded.shape[1])


def _shard_table(cores, padded):
    """TF's `shard_table` where TF has it (2.21). TF 2.20 has only its
    inverse, `unshuffle_from_sc_to_cpu`: there the layout is row `i` on
    SparseCore `i % cores`, checked to be what TF's inverse takes back to
    the table."""
    if hasattr(tpu_embedding_v3_utils, "shard_table"):
        return tpu_embedding_v3_utils.shard_table(cores, padded).numpy()
    width = padded.shape[1]
    internal = (
        padded.reshape(-1, cores, width).transpose(1, 0, 2).reshape(-1, width)
    )
    back = tpu_embedding_v3_utils.unshuffle_from_sc_to_cpu(
        tf.constant(internal), cores, 0, padded.shape[0] // cores
    )
    np.testing.assert_array_equal(back.numpy(), padded)
    return internal


def test_sparse_core_checkpoints_move_tables_by_name_both_ways(
    tmp_path, monkeypatch
):
    """Two layers whose tables TF stacks together (`hist_item...` of `s`
    and `tags...` of `o`), saved one SparseCore's slice at a time; CPU
    models restore them by table name, and SparseCore models restore CPU
    checkpoints, before and after their first step, bit for bit."""
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        model = _two_layers(strategy, models.SEED)
        _fit_one_epoch(strategy, model)
        trained = training._tables(model)
        with monkeypatch.context() as saving:
            _forbid_whole_tables(saving)
            whole = tf.train.Checkpoint(model=model).write(str(tmp_path / "m"))
            engine = _write(model, tmp_path / "e")
    layouts = {
        name: tuple(int(d) for d in shape)
        for name, shape in tf.train.list_variables(engine)
    }
    key = "embedding/_sparse_core/{}/.ATTRIBUTES/VARIABLE_VALUE".format
    assert "embedding/genres/.ATTRIBUTES/VARIABLE_VALUE" not in layouts
    assert layouts[key("genres")] == (8, 8, 8)
    assert layouts[key("genres.Saccumulators")] == (8, 8, 8)
    reader = tf.train.load_checkpoint(engine)
    np.testing.assert_array_equal(
        reader.get_tensor(key("tags_weighted_by_tag_w")),
        _internal_layout(trained["tags_weighted_by_tag_w"], 8),
    )

    # On CPU, by table name, from other initial values.
    cpu = _two_layers(tf.distribute.get_strategy(), seed=5)
    assert not np.allclose(training._tables(cpu)["genres"], trained["genres"])
    tf.train.Checkpoint(model=cpu).read(whole).assert_existing_objects_matched()
    _assert_bit_equal(training._tables(cpu), trained)
    again = _two_layers(tf.distribute.get_strategy(), seed=6)
    kte.restore_tables(again, engine)
    _assert_bit_equal(training._tables(again), trained)

    # The CPU model trains on; its checkpoints go back to SparseCore.
    _fit_one_epoch(tf.distribute.get_strategy(), cpu)
    on_cpu = training._tables(cpu)
    cpu_whole = tf.train.Checkpoint(model=cpu).write(str(tmp_path / "cm"))
    cpu_engine = _write(cpu, tmp_path / "ce")
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        tpu = _two_layers(strategy, seed=7)
        # Before the first step: TF creates the tables from it.
        tf.train.Checkpoint(model=tpu).read(
            cpu_whole
        ).assert_existing_objects_matched()
        _predict_once(strategy, tpu)
        from_cpu_before = training._tables(tpu)
        # After it: SparseCore's own checkpoint, then CPU's again.
        kte.restore_tables(tpu, engine)
        from_sparse_core_after = training._tables(tpu)
        tf.train.Checkpoint(model=tpu).read(
            cpu_whole
        ).assert_existing_objects_matched()
        from_cpu_after = training._tables(tpu)
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        tpu = _two_layers(strategy, seed=8)
        # SparseCore's own checkpoint before the first step, and CPU's
        # engine checkpoint after it.
        tf.train.Checkpoint(model=tpu).read(
            whole
        ).assert_existing_objects_matched()
        _predict_once(strategy, tpu)
        from_sparse_core_before = training._tables(tpu)
        kte.restore_tables(tpu, cpu_engine)
        from_cpu_engine_after = training._tables(tpu)
    _assert_bit_equal(from_cpu_before, on_cpu)
    _assert_bit_equal(from_sparse_core_after, trained)
    _assert_bit_equal(from_cpu_after, on_cpu)
    _assert_bit_equal(from_sparse_core_before, trained)
    _assert_bit_equal(from_cpu_engine_after, on_cpu)


def test_a_checkpoint_of_other_sparse_cores_restores(on_sparse_core):
    """Saved on 8 SparseCores, restored on 4 (2 per chip), before and
    after the first step."""
    trained, path = on_sparse_core.trained, on_sparse_core.engine
    restored = []
    for when in ("before", "after"):
        with emulated_tpu(2, embedding_feature="V2") as strategy:
            hardware = strategy.extended.tpu_hardware_feature
            hardware.num_embedding_devices_per_chip = 2
            model = _build(strategy, seed=6)
            if when == "after":
                _predict_once(strategy, model)
            kte.restore_tables(model, path)
            _predict_once(strategy, model)
            layouts = model.get_layer(
                "embed"
            ).engine.mid_level.embedding_layouts
            assert layouts["genres"].num_sparse_cores == 4
            restored.append(training._tables(model))
    for tables in restored:
        _assert_bit_equal(tables, trained)


FIXTURES = pathlib.Path(__file__).parent / "data" / "sparsecore_whole_tables"


def test_checkpoints_of_whole_tables_still_restore():
    """Checkpoints written before SparseCore tables were saved by
    SparseCore (each table whole, by name: `data/sparsecore_whole_tables`)
    restore into SparseCore models, before and after their first step, and
    into CPU models."""
    saved = np.load(FIXTURES / "tables.npz")
    expected = {name.replace(".", "/"): saved[name] for name in saved.files}
    restored = []
    for when in ("before", "after"):
        for kind in ("model", "engine"):
            with emulated_tpu(2, embedding_feature="V2") as strategy:
                model = _build(strategy, seed=6)
                if when == "after":
                    _predict_once(strategy, model)
                if kind == "model":
                    tf.train.Checkpoint(model=model).read(
                        str(FIXTURES / "model")
                    ).assert_existing_objects_matched()
                else:
                    kte.restore_tables(model, str(FIXTURES / "engine"))
                _predict_once(strategy, model)
                restored.append(training._tables(model))
    cpu = _build(tf.distribute.get_strategy(), seed=6)
    tf.train.Checkpoint(model=cpu).read(
        str(FIXTURES / "model")
    ).assert_existing_objects_matched()
    restored.append(training._tables(cpu))
    for tables in restored:
        _assert_bit_equal(tables, expected)


def test_a_layer_restored_before_it_is_built(tmp_path, on_sparse_core):
    """`tf.train.Checkpoint(layer=...).read` before the layer is built:
    TF defers it until the tables exist, by name, from CPU and from
    SparseCore checkpoints alike."""
    cpu = _build(tf.distribute.get_strategy(), seed=5)
    on_cpu = training._tables(cpu)
    cpu_path = tf.train.Checkpoint(layer=cpu.get_layer("embed")).write(
        str(tmp_path / "cpu")
    )
    trained, tpu_path = on_sparse_core.trained, on_sparse_core.layer
    restored = []
    for path in (cpu_path, tpu_path):
        with emulated_tpu(2, embedding_feature="V2") as strategy:
            keras.utils.set_random_seed(7)
            with strategy.scope():
                layer = kte.TPUEmbeddingLayer(
                    training._columns(),
                    config=kte.EmbeddingConfig(
                        optimizer=models.OPTIMIZERS[OPTIMIZER]()
                    ),
                    name="embed",
                )
                status = tf.train.Checkpoint(layer=layer).read(path)
                model = training.build_around(layer)
            _predict_once(strategy, model)
            status.assert_existing_objects_matched()
            restored.append(training._tables(model))
    _assert_bit_equal(restored[0], on_cpu)
    _assert_bit_equal(restored[1], trained)
