"""Optimizers the engines had never trained, on every feature kind.

Issue 40's reading of the suite: V1 non-lazy Adam, V1 AdagradMomentum
beyond building, V2 AdagradMomentum with Nesterov and `beta2` below 1,
and V1 training on weighted, `sqrtn` and sequence features had never been
compared with one device. Each case here trains a model with a weighted
`sum` column, an `sqrtn` column and a sequence column under the emulation
(V1: the engine; V2: SparseCore) and on one device, on the same global
batches, and compares every table and slot.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

ROWS = 32
GLOBAL_BATCH = 8
OPTIMIZERS = {
    # Non-lazy: every row's slots decay at every step, touched or not.
    "adam_dense": lambda: kte.optimizers.Adam(0.02, lazy_adam=False),
    "adagrad_momentum_nesterov": lambda: kte.optimizers.AdagradMomentum(
        0.05, momentum=0.8, use_nesterov=True, beta2=0.9
    ),
    "adagrad_momentum": lambda: kte.optimizers.AdagradMomentum(
        0.05, momentum=0.9
    ),
}


def _build(optimizer):
    identity = kte.categorical_column_with_identity
    columns = [
        kte.embedding_column(
            kte.weighted_categorical_column(identity("tags", 12), "tag_w"),
            3,
            combiner="sum",
        ),
        kte.embedding_column(identity("words", 10), 2, combiner="sqrtn"),
        kte.embedding_column(
            kte.sequence_categorical_column_with_identity("hist", 9),
            2,
            max_sequence_length=3,
        ),
    ]
    inputs = {
        key: keras.Input(
            (None,),
            dtype="float32" if key == "tag_w" else "int64",
            name=key,
            sparse=True,
        )
        for key in ("tags", "tag_w", "words", "hist")
    }
    config = kte.EmbeddingConfig(
        optimizer=optimizer,
        # SparseCore sizes its buffers from these.
        max_ids_per_example={
            "tags_weighted_by_tag_w_embedding": 3,
            "words_embedding": 3,
        },
    )
    embedded = kte.TPUEmbeddingLayer(columns, config=config, name="embed")(
        inputs
    )
    joined = keras.layers.Concatenate()(
        [
            embedded["tags_weighted_by_tag_w_embedding"],
            embedded["words_embedding"],
            keras.layers.Flatten()(embedded["hist_embedding"]),
        ]
    )
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(joined))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _examples():
    rng = np.random.default_rng(11)

    def sparse(vocabulary, width, values=None):
        lengths = rng.integers(1, width + 1, ROWS)
        ids = rng.integers(0, vocabulary, lengths.sum())
        ragged = tf.RaggedTensor.from_row_lengths(
            ids if values is None else values(lengths.sum()), lengths
        )
        return ragged.to_sparse(), lengths

    tags, lengths = sparse(12, 3)
    weights = tf.RaggedTensor.from_row_lengths(
        rng.uniform(0.5, 2.0, lengths.sum()).astype(np.float32), lengths
    ).to_sparse()
    features = {
        "tags": tags,
        "tag_w": weights,
        "words": sparse(10, 3)[0],
        "hist": sparse(9, 3)[0],
    }
    labels = rng.normal(size=(ROWS, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels))


def _fit(strategy, optimizer):
    keras.utils.set_random_seed(models.SEED)
    with strategy.scope():
        model = _build(OPTIMIZERS[optimizer]())
    batches = kte.distribute_dataset(strategy, _examples(), GLOBAL_BATCH)
    model.fit(batches, epochs=2, verbose=0)
    return model


CASES = [
    ("V1", "adam_dense"),
    ("V1", "adagrad_momentum"),
    ("V1", "adagrad_momentum_nesterov"),
    ("V2", "adagrad_momentum_nesterov"),
]


@pytest.mark.parametrize(("feature", "optimizer"), CASES)
def test_trains_every_feature_kind_as_one_device(feature, optimizer):
    expected = _fit(tf.distribute.get_strategy(), optimizer)
    wanted = models.local_values(expected)
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        actual = models.engine_tables(_fit(strategy, optimizer))
    # The tables moved: a comparison of untrained tables proves nothing.
    keras.utils.set_random_seed(models.SEED)
    initial = models.local_values(_build(OPTIMIZERS[optimizer]()))
    for name in ("tags_weighted_by_tag_w", "words", "hist"):
        assert np.abs(wanted[name] - initial[name]).max() > 1e-3, name
    models.assert_values_equal(actual, wanted)
