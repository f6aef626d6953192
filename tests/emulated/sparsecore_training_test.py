"""`model.fit` on SparseCore (`emulated_tpu(embedding_feature="V2")`).

TF's own `TPUEmbeddingV2` trains the tables (its stacking, sharding, input
preprocessing and `apply_gradients`); only the SparseCore ops are the
emulation's CPU kernels. With the same global batches, the tables, slots,
`embedding_step` and the dense head equal one device within 1e-5, for a
table shared by a plain and a sequence column (`max_sequence_length` 3,
fed longer sequences: truncated on the host), a weighted column and a
multivalent bag, with every optimizer SparseCore has.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.engines.sparsecore.sparsecore_engine import (
    SparseCoreEngine,
)
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

ROWS = 32
STEPS = ROWS // models.GLOBAL_BATCH


def _columns():
    item, hist = kte.shared_embedding_columns(
        [
            kte.categorical_column_with_identity("item", 40),
            kte.sequence_categorical_column_with_identity("hist", 40),
        ],
        4,
        max_sequence_lengths=[0, 3],
    )
    tags = kte.embedding_column(
        kte.weighted_categorical_column(
            kte.categorical_column_with_identity("tags", 30), "tag_w"
        ),
        4,
        combiner="sqrtn",
    )
    genres = kte.embedding_column(
        kte.categorical_column_with_identity("genres", 12), 2, combiner="mean"
    )
    return [item, hist, tags, genres]


def _inputs():
    def sparse(name, dtype="int64"):
        return keras.Input((None,), dtype=dtype, name=name, sparse=True)

    return {
        "item": sparse("item"),
        "hist": sparse("hist"),
        "tags": sparse("tags"),
        "tag_w": sparse("tag_w", "float32"),
        "genres": sparse("genres"),
    }


def build(optimizer):
    return build_around(
        kte.TPUEmbeddingLayer(
            _columns(),
            config=kte.EmbeddingConfig(optimizer=optimizer),
            name="embed",
        )
    )


def build_around(layer):
    """The model around an embedding layer of `_columns()`."""
    inputs = _inputs()
    embedded = layer(inputs)
    joined = keras.layers.Concatenate()(
        [
            embedded["item_shared_embedding"],
            # Each position its own input of the head: a position fed to
            # the wrong sample would show.
            keras.layers.Flatten()(embedded["hist_shared_embedding"]),
            embedded["tags_weighted_by_tag_w_embedding"],
            embedded["genres_embedding"],
        ]
    )
    output = keras.layers.Dense(1, name="head")(joined)
    model = keras.Model(inputs, output)
    model.compile(optimizer="sgd", loss="mse")
    return model


def dataset():
    rng = np.random.default_rng(3)

    def ragged(vocab, low, high, dtype=np.int64):
        lengths = rng.integers(low, high, ROWS)
        values = rng.integers(0, vocab, lengths.sum()).astype(dtype)
        return tf.RaggedTensor.from_row_lengths(values, lengths)

    tags = ragged(30, 1, 4)
    features = {
        "item": ragged(40, 1, 2),
        # Up to 5 positions for a sequence of 3: the engine is fed the
        # truncated sequence.
        "hist": ragged(40, 1, 6),
        "tags": tags,
        "tag_w": tf.RaggedTensor.from_row_lengths(
            rng.uniform(0.5, 2.0, int(tags.values.shape[0])).astype(np.float32),
            tags.row_lengths(),
        ),
        "genres": ragged(12, 1, 4),
    }
    features = {k: v.to_sparse() for k, v in features.items()}
    labels = rng.normal(size=(ROWS, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels))


def _fit(strategy, optimizer_name):
    keras.utils.set_random_seed(models.SEED)
    with strategy.scope():
        model = build(models.OPTIMIZERS[optimizer_name]())
    batches = kte.distribute_dataset(
        strategy, dataset().repeat(), models.GLOBAL_BATCH
    )
    model.fit(
        batches, epochs=2, steps_per_epoch=STEPS, verbose=0, shuffle=False
    )
    once = kte.distribute_dataset(strategy, dataset(), models.GLOBAL_BATCH)
    loss = model.evaluate(once, steps=STEPS, verbose=0)
    predicted = model.predict(once, steps=STEPS, verbose=0)
    return model, loss, predicted


def _tables(model):
    """Every table and slot by its checkpoint name (the engine's are read
    from the SparseCores and unstacked)."""
    return {
        name: np.asarray(
            variable.read() if hasattr(variable, "read") else variable
        )
        for name, variable in kte.engine_checkpoint(model).named_variables()
    }


@pytest.mark.parametrize("optimizer", sorted(models.OPTIMIZERS))
def test_fit_on_sparse_core_equals_one_device(optimizer):
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        model, loss, predicted = _fit(strategy, optimizer)
        layer = model.get_layer("embed")
        assert isinstance(layer.engine, SparseCoreEngine)
        tables = _tables(model)
        step = int(layer.embedding_step.numpy())
        head = model.get_layer("head").get_weights()
    reference, want_loss, want_predicted = _fit(
        tf.distribute.get_strategy(), optimizer
    )
    assert step == 2 * STEPS
    assert int(reference.get_layer("embed").embedding_step.numpy()) == step
    models.assert_values_equal(tables, _tables(reference))
    for actual, wanted in zip(head, reference.get_layer("head").get_weights()):
        np.testing.assert_allclose(actual, wanted, atol=1e-5, rtol=0)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(predicted, want_predicted, atol=1e-5)
    # The tables trained: equal answers from untouched tables prove nothing.
    keras.utils.set_random_seed(models.SEED)
    untrained = _tables(build(models.OPTIMIZERS[optimizer]()))
    assert sorted(n for n in tables if "/" not in n) == [
        "genres",
        "hist_item_shared_embedding",
        "tags_weighted_by_tag_w",
    ]
    for table in sorted(n for n in tables if "/" not in n):
        assert not np.allclose(tables[table], untrained[table]), table


def _two_layers(optimizer):
    """The shared table in a `SharedTPUEmbedding`, the others in a
    `TPUEmbeddingLayer`: both layers on the one SparseCore engine."""
    item, hist, tags, genres = _columns()
    features = _inputs()
    config = kte.EmbeddingConfig(optimizer=optimizer)
    shared = kte.SharedTPUEmbedding([item, hist], config=config, name="s")(
        features
    )
    own = kte.TPUEmbeddingLayer([tags, genres], config=config, name="o")(
        features
    )
    joined = keras.layers.Concatenate()(
        [
            shared["item_shared_embedding"],
            keras.layers.Flatten()(shared["hist_shared_embedding"]),
            own["tags_weighted_by_tag_w_embedding"],
            own["genres_embedding"],
        ]
    )
    two = keras.Model(features, keras.layers.Dense(1, name="head")(joined))
    two.compile(optimizer="sgd", loss="mse")
    return two


def _fit_two_layers(strategy):
    keras.utils.set_random_seed(models.SEED)
    with strategy.scope():
        model = _two_layers(models.OPTIMIZERS["adagrad"]())
    batches = kte.distribute_dataset(
        strategy, dataset().repeat(), models.GLOBAL_BATCH
    )
    model.fit(batches, epochs=2, steps_per_epoch=STEPS, verbose=0)
    values = _tables(model)
    steps = [int(model.get_layer(name).embedding_step.numpy()) for name in "so"]
    return model, values, steps


def test_two_layers_share_the_sparse_core_engine():
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        model, tables, steps = _fit_two_layers(strategy)
        engine = model.get_layer("s").engine
        assert isinstance(engine, SparseCoreEngine)
        assert model.get_layer("o").engine is engine
        assert engine.layer_names == ["s", "o"]
    _, expected, want_steps = _fit_two_layers(tf.distribute.get_strategy())
    assert steps == want_steps == [2 * STEPS, 2 * STEPS]
    models.assert_values_equal(tables, expected)
