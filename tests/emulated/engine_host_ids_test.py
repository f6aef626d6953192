"""The engine answers as one device does for ids the columns' rules drop.

Issue 41's sweep: on the engine, ids past a sequence column's
`max_sequence_length` still reached the optimizer (FTRL, Adam and
AdagradMomentum moved their rows for a zero gradient), weights <= 0 of a
`mean` column were taken as they were (activation 0.0 where every other
path gave 9.0), and an identity column's out-of-range ids failed with an
error of the emulated chip instead of mapping to its `default_value`.
Each case here trains (or predicts) under the emulation and on one device
on the same global batches and compares.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

ROWS = 16
OPTIMIZERS = {
    "ftrl": lambda: kte.optimizers.FTRL(0.2, l1_regularization_strength=0.01),
    "adam": lambda: kte.optimizers.Adam(0.01),
    "adagrad_momentum": lambda: kte.optimizers.AdagradMomentum(
        0.05, momentum=0.9
    ),
}


def _sequence_model(optimizer):
    column = kte.sequence_categorical_column_with_identity("hist", 12)
    hist = kte.embedding_column(column, 3, max_sequence_length=2)
    inputs = {
        "hist": keras.Input((None,), dtype="int64", name="hist", ragged=True)
    }
    embedded = kte.TPUEmbeddingLayer(
        [hist], config=kte.EmbeddingConfig(optimizer=optimizer), name="embed"
    )(inputs)
    pooled = keras.layers.Flatten()(embedded["hist_embedding"])
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(pooled))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _sequences():
    """Rows of 1-4 ids: positions 2 and 3 fall past max_sequence_length.
    Ids 8-11 appear only there; ids 0-7 also within the length, so that
    their slots move and an optimizer with slots would move their rows
    again at steps where they only appear past the length."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 5, ROWS)
    values = []
    for length in lengths:
        values += list(rng.integers(0, 8, min(length, 2)))
        values += list(rng.integers(0, 12, max(length - 2, 0)))
    ids = tf.RaggedTensor.from_row_lengths(np.array(values, np.int64), lengths)
    labels = rng.normal(size=(ROWS, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"hist": ids}, labels))


def _fit(strategy, build, dataset, epochs=3):
    keras.utils.set_random_seed(models.SEED)
    with strategy.scope():
        model = build()
    batches = kte.distribute_dataset(strategy, dataset, models.GLOBAL_BATCH)
    model.fit(batches, epochs=epochs, verbose=0)
    return model


FEATURES = ("V1", "V2")


@functools.cache
def _sequences_on_one_device(optimizer):
    """The one-device reference of `optimizer`'s sequence model: its tables
    after training and before. Cached: V1 and V2 compare with the same
    one, and each fit traces Keras' train step anew."""
    keras.utils.set_random_seed(models.SEED)
    model = _sequence_model(OPTIMIZERS[optimizer]())
    initial = models.local_values(model)
    batches = kte.distribute_dataset(
        tf.distribute.get_strategy(), _sequences(), models.GLOBAL_BATCH
    )
    model.fit(batches, epochs=3, verbose=0)
    return models.local_values(model), initial


@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_ids_past_the_sequence_length_leave_their_rows_alone(
    optimizer, feature
):
    def build():
        return _sequence_model(OPTIMIZERS[optimizer]())

    wanted, initial = _sequences_on_one_device(optimizer)
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        model = _fit(strategy, build, _sequences())
        actual = models.engine_tables(model)
    # Ids 8-11 sit only past the length: no path may move their rows.
    np.testing.assert_array_equal(wanted["hist"][8:], initial["hist"][8:])
    models.assert_values_equal(actual, wanted)


def _weighted_model():
    tags = kte.weighted_categorical_column(
        kte.categorical_column_with_identity("tags", 10), "tags_weight"
    )
    # Row i holds i.
    column = kte.embedding_column(
        tags,
        1,
        combiner="mean",
        initializer=tf.constant_initializer(np.arange(10.0).reshape(10, 1)),
    )
    inputs = {
        "tags": keras.Input((None,), dtype="int64", name="tags", sparse=True),
        "tags_weight": keras.Input(
            (None,), dtype="float32", name="tags_weight", sparse=True
        ),
    }
    embedded = kte.TPUEmbeddingLayer([column], name="embed")(inputs)
    model = keras.Model(
        inputs, embedded["tags_weighted_by_tags_weight_embedding"]
    )
    model.compile(loss="mse")
    return model


@pytest.mark.parametrize("feature", FEATURES)
def test_non_positive_weights_are_pruned_for_mean_as_on_cpu(feature):
    """Ids [1, 2] of weights [9, -1]: the mean over the kept weight,
    9 * 1 / 9 (unpruned it would be (9 - 2) / 8)."""
    indices = [[r, c] for r in range(8) for c in range(2)]
    ids = tf.SparseTensor(indices, tf.constant([1, 2] * 8, tf.int64), [8, 2])
    weights = tf.SparseTensor(indices, [9.0, -1.0] * 8, [8, 2])
    examples = tf.data.Dataset.from_tensors(
        ({"tags": ids, "tags_weight": weights}, tf.zeros([8, 1]))
    ).unbatch()

    def served(strategy):
        with strategy.scope():
            model = _weighted_model()
        batches = kte.distribute_dataset(strategy, examples, 8)
        return model.predict(batches, verbose=0)

    on_cpu = served(tf.distribute.get_strategy())
    np.testing.assert_allclose(on_cpu, np.ones([8, 1]))
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        np.testing.assert_allclose(served(strategy), on_cpu)


def _identity_model(default_value):
    column = kte.embedding_column(
        kte.categorical_column_with_identity(
            "item", 5, default_value=default_value
        ),
        2,
        initializer=keras.initializers.RandomNormal(seed=4),
    )
    inputs = {
        "item": keras.Input((None,), dtype="int64", name="item", sparse=True)
    }
    embedded = kte.TPUEmbeddingLayer([column], name="embed")(inputs)
    model = keras.Model(inputs, embedded["item_embedding"])
    model.compile(loss="mse")
    return model


def _out_of_range_items():
    indices = [[r, 0] for r in range(8)]
    ids = tf.SparseTensor(
        indices, tf.constant([0, 7, 3, 5, 1, 9, 4, 6], tf.int64), [8, 1]
    )
    return tf.data.Dataset.from_tensors(
        ({"item": ids}, tf.zeros([8, 1]))
    ).unbatch()


def _predict(strategy, default_value):
    with strategy.scope():
        model = _identity_model(default_value)
    batches = kte.distribute_dataset(strategy, _out_of_range_items(), 8)
    return model.predict(batches, verbose=0)


@pytest.mark.parametrize("feature", FEATURES)
def test_out_of_range_ids_map_to_the_default_value_as_on_cpu(feature):
    on_cpu = _predict(tf.distribute.get_strategy(), 0)
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        np.testing.assert_allclose(_predict(strategy, 0), on_cpu, atol=1e-6)


@pytest.mark.parametrize("feature", FEATURES)
def test_out_of_range_ids_without_a_default_raise_naming_the_feature(
    feature,
):
    # The same error on both: the feature, its table and the valid range.
    message = (
        r"Feature ..item.. \(table ..item..\) has ids outside the valid "
        r"range \[0, 5\)"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _predict(tf.distribute.get_strategy(), None)
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            _predict(strategy, None)
