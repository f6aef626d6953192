"""SparseCore buffers sized from the batch (`sparsecore_buffers.py`).

TF's `TPUEmbeddingV2` gives every stacked table 256 ids per SparseCore
unless told otherwise; with `allow_id_dropping=False` a step over that
fails. These tests feed a per-replica batch whose ids all land on one
SparseCore (more than 256 of them) and check that `model.fit` trains as
one device does; and that ragged ids, whose width no shape says, are
named at the first step with the argument that bounds them.
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

GLOBAL_BATCH = 1024
STEPS = 2
WIDTH = 4
VOCAB = 32


def _build(ragged=False, **config):
    bag = kte.embedding_column(
        kte.categorical_column_with_identity("bag", VOCAB), 4, combiner="sum"
    )
    inputs = {
        "bag": keras.Input(
            (None,), dtype="int64", name="bag", ragged=ragged, sparse=not ragged
        )
    }
    config = kte.EmbeddingConfig(
        optimizer=kte.optimizers.Adagrad(0.1), **config
    )
    embedded = kte.TPUEmbeddingLayer([bag], config=config, name="embed")(inputs)
    output = keras.layers.Dense(1, name="head")(embedded["bag_embedding"])
    model = keras.Model(inputs, output)
    model.compile(optimizer="sgd", loss="mse")
    return model


def _dataset(ragged=False):
    """Every example holds ids 0, 8, 16 and 24: with 2 chips of 4
    SparseCores (8 in all), TF sends row r to SparseCore r mod 8 (after a
    per-table rotation), so all four go to one SparseCore: 128 samples
    per SparseCore times 4 ids is 512, twice TF's 256."""
    rows = GLOBAL_BATCH * STEPS
    rng = np.random.default_rng(0)
    ids = np.tile(np.arange(0, VOCAB, VOCAB // WIDTH), (rows, 1))
    # A few examples with fewer ids, so the ids per example vary.
    lengths = np.where(rng.random(rows) < 0.1, 2, WIDTH)
    values = np.concatenate([row[:n] for row, n in zip(ids, lengths)])
    bags = tf.RaggedTensor.from_row_lengths(values.astype(np.int64), lengths)
    labels = rng.normal(size=(rows, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(
        ({"bag": bags if ragged else bags.to_sparse()}, labels)
    )


def _fit(strategy, ragged=False, **config):
    keras.utils.set_random_seed(models.SEED)
    with strategy.scope():
        model = _build(ragged, **config)
    batches = kte.distribute_dataset(strategy, _dataset(ragged), GLOBAL_BATCH)
    model.fit(batches, epochs=1, verbose=0, shuffle=False)
    return model


def _tables(model):
    return {
        name: np.asarray(
            variable.read() if hasattr(variable, "read") else variable
        )
        for name, variable in kte.engine_checkpoint(model).named_variables()
    }


@pytest.fixture(scope="module")
def one_device_ragged():
    """The ragged model trained on one device: the reference of both
    ragged tests, trained once (a trace of `fit` fewer); module-scoped."""
    return _tables(_fit(tf.distribute.get_strategy(), True))


def test_a_batch_over_tfs_default_buffers_trains_as_one_device():
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        model = _fit(strategy)
        tables = _tables(model)
        step = int(model.get_layer("embed").embedding_step.numpy())
    reference = _fit(tf.distribute.get_strategy())
    assert step == STEPS
    models.assert_values_equal(tables, _tables(reference))
    keras.utils.set_random_seed(models.SEED)
    untrained = _tables(_build())
    assert not np.allclose(tables["bag"], untrained["bag"])


def test_ragged_ids_are_named_at_the_first_step_then_bounded_as_declared(
    one_device_ragged,
):
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        with pytest.raises(ValueError) as raised:
            _fit(strategy, ragged=True)
        message = str(raised.value)
        assert "['bag_embedding']" in message
        assert "max_ids_per_example={'bag_embedding': ...}" in message
        # The fixed model cannot join this strategy's engine, and the error
        # says why and what to do, though no step ran.
        with pytest.raises(RuntimeError) as rebuilt:
            with strategy.scope():
                _build(True, max_ids_per_example={"bag_embedding": WIDTH})
        assert "a first step that raised counts too" in str(rebuilt.value)
        assert "under a new TPUStrategy" in str(rebuilt.value)
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        model = _fit(
            strategy, True, max_ids_per_example={"bag_embedding": WIDTH}
        )
        tables = _tables(model)
    models.assert_values_equal(tables, one_device_ragged)


def test_ragged_ids_are_bounded_by_their_lookup_profile(
    tmp_path, one_device_ragged
):
    """TPUEstimator's `profile_data_directory`, kept: `kte.profile_lookups`
    writes each column's most ids per example there, and the SparseCore
    buffers are sized from it."""
    profiles = str(tmp_path)
    stats = kte.profile_lookups(
        _dataset(ragged=True).map(lambda f, y: f).ragged_batch(GLOBAL_BATCH),
        _build(ragged=True).get_layer("embed").columns,
        profiles,
    )
    assert stats["bag"]["features"]["bag"]["max_ids_per_example"] == WIDTH
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        model = _fit(strategy, True, profile_data_directory=profiles)
        tables = _tables(model)
    models.assert_values_equal(tables, one_device_ragged)


def test_a_declared_bound_below_the_data_fails_with_tfs_error():
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            # 128 samples times 2 ids is 256: TF's floor, under the 512
            # the data sends.
            _fit(strategy, True, max_ids_per_example={"bag_embedding": 2})
    # TF's kernel words it so (`SortListOfSparseCoreCooTensorsOp`,
    # tensorflow/core/tpu/kernels/sparse_core_preprocess_ops.cc, whose CPU
    # kernel the tensorflow-cpu wheel does not ship): the emulated kernel
    # must give TF's message, nothing of its own.
    tfs_message = re.compile(
        r"Sparse core \d+ gets \d+ ids while the max ids per sparse core "
        r"is set to be 256 for table (\w+)$",
        re.MULTILINE,
    )
    match = tfs_message.search(str(raised.value))
    assert match is not None, str(raised.value)[-2000:]
    assert "bag" in match.group(1)


def _wide_fit(strategy, rows=128, width=80, vocab=256):
    """Examples of 80 distinct ids: over TF's 64 ids per sample on a chip."""
    keras.utils.set_random_seed(models.SEED)
    rng = np.random.default_rng(1)
    ids = np.stack([rng.permutation(vocab)[:width] for _ in range(rows)])
    wide = kte.embedding_column(
        kte.categorical_column_with_identity("wide", vocab), 4
    )
    with strategy.scope():
        inputs = {"wide": keras.Input((None,), dtype="int64", sparse=True)}
        embedded = kte.TPUEmbeddingLayer(
            [wide],
            config=kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.1)),
            name="embed",
        )(inputs)
        model = keras.Model(
            inputs, keras.layers.Dense(1)(embedded["wide_embedding"])
        )
        model.compile(optimizer="sgd", loss="mse")
    indices = np.stack(np.nonzero(np.ones_like(ids)), axis=1)
    features = {"wide": tf.SparseTensor(indices, ids.reshape(-1), ids.shape)}
    labels = rng.normal(size=(rows, 1)).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((features, labels))
    model.fit(kte.distribute_dataset(strategy, data, 64), epochs=1, verbose=0)
    return _tables(model)


def test_examples_of_more_ids_than_tfs_per_sample_default_train():
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        tables = _wide_fit(strategy)
    models.assert_values_equal(tables, _wide_fit(tf.distribute.get_strategy()))
