"""Every optimizer on every emulated engine, trained as one device.

The matrix is generated: every class of `kte.optimizers.
SUPPORTED_OPTIMIZERS` (with the variants below: a new class joins with its
defaults) times every `embedding_feature` of the emulation that has an
engine (V1; V2, SparseCore; a TPU without one trains with the one-device
code on the tensor core). Each case trains one model of every column kind
the engines take as ids (a shared table read by an id column and a
sequence column, weighted `sum` and `sqrtn` columns, `mean`, `sqrtn`)
under the emulation and on one device, on the same global batches, and
compares every table and slot. Issue 40 found V1 non-lazy Adam, V1
AdagradMomentum, V2 AdagradMomentum with Nesterov and `beta2` < 1 and V1
on weighted, `sqrtn` and sequence features never compared; issue 41's
sweep found the shared and sequence tables furthest from one device."""

import functools
import typing

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from keras_tpu_embed.testing.emulated_tpu import EmbeddingFeature
from tests.emulated import models

ROWS = 32
GLOBAL_BATCH = 8
HARDWARE = typing.get_args(EmbeddingFeature)
# The kinds with an embedding engine; a TPU without one ("UNSUPPORTED")
# trains on the tensor core with the one-device optimizer code.
ENGINES = tuple(kind for kind in HARDWARE if kind != "UNSUPPORTED")
# What an engine refuses by design, and the refusal's fix.
REFUSED = {("V2", "Adam_dense"): "use lazy_adam=True"}
VARIANTS = {
    kte.optimizers.SGD: {"": lambda: kte.optimizers.SGD(0.2)},
    kte.optimizers.Adagrad: {"": lambda: kte.optimizers.Adagrad(0.2)},
    kte.optimizers.AdagradMomentum: {
        "": lambda: kte.optimizers.AdagradMomentum(0.05, momentum=0.9),
        "_nesterov_beta2": lambda: kte.optimizers.AdagradMomentum(
            0.05, momentum=0.8, use_nesterov=True, beta2=0.9
        ),
    },
    kte.optimizers.Adam: {
        "": lambda: kte.optimizers.Adam(0.02),
        # Non-lazy: every row's slots decay at every step, touched or not.
        "_dense": lambda: kte.optimizers.Adam(0.02, lazy_adam=False),
    },
    kte.optimizers.FTRL: {
        "": lambda: kte.optimizers.FTRL(0.2, l1_regularization_strength=0.01)
    },
}


def _optimizers():
    made = {}
    for cls in kte.optimizers.SUPPORTED_OPTIMIZERS:
        variants = VARIANTS.get(cls, {"": lambda cls=cls: cls(0.1)})
        for suffix, make in variants.items():
            made[cls.__name__ + suffix] = make
    return made


OPTIMIZERS = _optimizers()
CASES = [(e, o) for e in ENGINES for o in sorted(OPTIMIZERS)]


def _columns():
    identity = kte.categorical_column_with_identity
    item, hist = kte.shared_embedding_columns(
        [
            identity("item", 16),
            kte.sequence_categorical_column_with_identity("hist", 16),
        ],
        2,
        max_sequence_lengths=[0, 3],
    )
    return [
        item,
        hist,
        kte.embedding_column(
            kte.weighted_categorical_column(identity("tags", 12), "tag_w"),
            3,
            combiner="sum",
        ),
        kte.embedding_column(
            kte.weighted_categorical_column(identity("cats", 8), "cat_w"),
            2,
            combiner="sqrtn",
        ),
        kte.embedding_column(identity("words", 10), 2, combiner="sqrtn"),
        kte.embedding_column(identity("genres", 9), 2, combiner="mean"),
    ]


WEIGHTS = {"tag_w", "cat_w"}
FEATURES = ("item", "hist", "tags", "tag_w", "cats", "cat_w", "words", "genres")


def _build(optimizer):
    inputs = {
        key: keras.Input(
            (None,),
            dtype="float32" if key in WEIGHTS else "int64",
            name=key,
            sparse=True,
        )
        for key in FEATURES
    }
    config = kte.EmbeddingConfig(
        optimizer=optimizer,
        # SparseCore sizes its buffers from these.
        max_ids_per_example={
            name: 3
            for name in (
                "tags_weighted_by_tag_w_embedding",
                "cats_weighted_by_cat_w_embedding",
                "words_embedding",
                "genres_embedding",
            )
        },
    )
    embedded = kte.TPUEmbeddingLayer(_columns(), config=config, name="embed")(
        inputs
    )
    joined = keras.layers.Concatenate()(
        [keras.layers.Flatten()(value) for _, value in sorted(embedded.items())]
    )
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(joined))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _examples():
    rng = np.random.default_rng(11)

    def lengths(low=1):
        return rng.integers(low, 4, ROWS)

    def sparse(values, counts):
        return tf.RaggedTensor.from_row_lengths(values, counts).to_sparse()

    features = {}
    for key, vocabulary in (
        ("item", 16),
        ("hist", 16),
        ("tags", 12),
        ("cats", 8),
        ("words", 10),
        ("genres", 9),
    ):
        counts = np.ones(ROWS, int) if key == "item" else lengths()
        features[key] = sparse(
            rng.integers(0, vocabulary, counts.sum()), counts
        )
        weight = {"tags": "tag_w", "cats": "cat_w"}.get(key)
        if weight:
            features[weight] = sparse(
                rng.uniform(0.5, 2.0, counts.sum()).astype(np.float32), counts
            )
    labels = rng.normal(size=(ROWS, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels))


@functools.cache
def one_device(optimizer):
    return models.local_values(fit(tf.distribute.get_strategy(), optimizer))


def fit(strategy, optimizer):
    keras.utils.set_random_seed(models.SEED)
    with strategy.scope():
        model = _build(OPTIMIZERS[optimizer]())
    batches = kte.distribute_dataset(strategy, _examples(), GLOBAL_BATCH)
    model.fit(batches, epochs=2, verbose=0)
    return model


def test_the_matrix_covers_every_optimizer_and_hardware_kind():
    assert set(ENGINES) >= {"V1", "V2"}
    named = {name.split("_")[0] for _, name in CASES}
    assert named == {c.__name__ for c in kte.optimizers.SUPPORTED_OPTIMIZERS}


@pytest.mark.parametrize(("feature", "optimizer"), CASES)
def test_trains_every_column_kind_as_one_device(feature, optimizer):
    refusal = REFUSED.get((feature, optimizer))
    if refusal is not None:
        with emulated_tpu(2, embedding_feature=feature) as strategy:
            with pytest.raises(ValueError, match=refusal):
                fit(strategy, optimizer)
        return
    wanted = one_device(optimizer)
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        actual = models.engine_tables(fit(strategy, optimizer))
    # Every table moved: a comparison of untrained tables proves nothing.
    keras.utils.set_random_seed(models.SEED)
    initial = models.local_values(_build(OPTIMIZERS[optimizer]()))
    for name in initial:
        if "/" not in name:
            assert np.abs(wanted[name] - initial[name]).max() > 1e-3, name
    models.assert_values_equal(actual, wanted)
