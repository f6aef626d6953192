"""Initializers on the emulated TPU (2 replicas on one host), every kind of
its hardware: V1, V2 and a TPU without an engine.

The engine makes its tables with TensorFlow's own code: V1's
`TPUEmbedding` calls the table's initializer per host shard inside
Keras' first step, SparseCore (`TPUEmbeddingV2`) per device shard inside a
`tf.function` of its own. The cases cross the generated initializer kinds
(`tests/initializer_cases.py`) with both engines.
"""

import functools
import typing

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.tables import initialization
from keras_tpu_embed.testing import emulated_tpu
from keras_tpu_embed.testing.emulated_tpu import EmbeddingFeature
from tests import initializer_cases as cases
from tests.emulated import models

# Every hardware kind of the emulation, generated: V1, V2 (SparseCore) and
# a TPU without an engine (tensor-core lookups, tables the layer's own).
FEATURES = typing.get_args(EmbeddingFeature)
STEPS = 3
# Shapes SparseCore's stacking does not pad (rows a multiple of 8 x its 8
# SparseCores, a dimension a multiple of 8): a padded table asks its
# initializer for the padded shape, issue 41 item 8, SparseCore's own.
SHAPE = (64, 8)
LARGE_SHAPE = (8256, 128)  # larger than one block of the fill


def build(initializer, shape):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", shape[0]),
        shape[1],
        initializer=initializer,
        # Where the TPU has no engine: one id per example on the tensor core.
        tensor_core_shape=[None, 1],
    )
    inputs = {
        "item": keras.Input((None,), dtype="int64", sparse=True, name="item")
    }
    embedded = kte.TPUEmbeddingLayer(
        [column],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
        name="embed",
    )(inputs)
    output = keras.layers.Dense(1, name="head")(embedded["item_embedding"])
    model = keras.Model(inputs, output)
    model.compile(optimizer="sgd", loss="mse")
    return model


def dataset(vocabulary):
    rng = np.random.default_rng(5)
    rows = STEPS * models.GLOBAL_BATCH
    ids = rng.integers(0, vocabulary, rows).astype(np.int64)
    # One id per example, 0 too (tf.sparse.from_dense would drop it).
    indices = np.stack([np.arange(rows), np.zeros(rows, int)], axis=1)
    features = {"item": tf.SparseTensor(indices, ids, [rows, 1])}
    labels = rng.normal(size=(rows, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels))


def tables(model):
    """Every table and slot by its checkpoint name: read through the
    engine as a save reads them (SparseCore's unstacked), or the layer's."""
    if model.get_layer("embed").engine is not None:
        return models.engine_tables(model)
    return models.local_values(model)


def fit(strategy, make_initializer, shape):
    keras.utils.set_random_seed(models.SEED)
    with strategy.scope():
        model = build(make_initializer(shape), shape)
    return train(strategy, model, shape)


def train(strategy, model, shape):
    batches = kte.distribute_dataset(
        strategy,
        dataset(shape[0]),
        models.GLOBAL_BATCH,
        columns=model.get_layer("embed").columns,
    )
    model.fit(batches, epochs=1, verbose=0)
    return model


def assert_engine_as_the_hardware_has(model, feature):
    has_engine = model.get_layer("embed").engine is not None
    assert has_engine == (feature != "UNSUPPORTED"), feature


CONSTANTS = {
    "Zeros": cases.DETERMINISTIC["Zeros"],
    "Ones": cases.DETERMINISTIC["Ones"],
    **cases.CONSTANTS,
}


@functools.cache
def constant_tables_on_one_device(name):
    """The tables of `name`'s model trained on one device, and untrained.
    Cached: every hardware kind compares with the same reference, and each
    fit traces Keras' train step anew."""
    keras.utils.set_random_seed(models.SEED)
    model = build(CONSTANTS[name](SHAPE), SHAPE)
    untrained = tables(model)
    train(tf.distribute.get_strategy(), model, SHAPE)
    return tables(model), untrained


@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("name", sorted(CONSTANTS))
def test_constant_tables_train_like_one_device(name, feature):
    """Issue 39: on V2, `Constant(0.1)` crashed at the first `fit` step
    (`tf.rank(value) == 0` read as a Python bool inside SparseCore's
    initializer trace)."""
    shape = SHAPE
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        model = fit(strategy, CONSTANTS[name], shape)
        assert_engine_as_the_hardware_has(model, feature)
        trained = tables(model)
    reference, untrained = constant_tables_on_one_device(name)
    models.assert_values_equal(trained, reference)
    assert not np.allclose(trained["item"], untrained["item"])


@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("name", sorted(cases.PRETRAINED))
def test_pretrained_tables_start_from_their_matrix(name, feature):
    """Issue 41, item 7, on both engines, for a table larger than one
    block of the fill."""
    shape = LARGE_SHAPE
    assert shape[0] * shape[1] * 4 > initialization.BLOCK_BYTES
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        with strategy.scope():
            model = build(cases.PRETRAINED[name](shape), shape)
        once = kte.distribute_dataset(
            strategy,
            dataset(shape[0]).take(8),
            models.GLOBAL_BATCH,
            columns=model.get_layer("embed").columns,
        )
        model.predict(once, verbose=0)
        assert_engine_as_the_hardware_has(model, feature)
        table = tables(model)["item"]
    np.testing.assert_array_equal(table, cases.pretrained_values(name, shape))
