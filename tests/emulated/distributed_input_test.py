"""Several ids per example, sparse or ragged, through Keras' `fit`.

Keras builds a model trained under a strategy from the first batch reduced
over the replicas (`keras/src/backend/tensorflow/trainer.py`,
`_maybe_symbolic_build`); under `emulated_tpu` that reduce is TF's own
`TPUExtended._reduce_to`, so these tests meet what a TPU meets. On the
first emulation, whose reduce was `MirroredStrategy`'s, every one of them
failed with "'SparseTensor' object has no attribute 'device'".
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

ROWS = 32


def _build(form):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("tags", 20), 4, combiner="mean"
    )
    inputs = {
        "tags": keras.Input(
            (None,),
            dtype="int64",
            name="tags",
            sparse=form == "sparse",
            ragged=form == "ragged",
        )
    }
    config = kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1))
    embedded = kte.TPUEmbeddingLayer([column], config=config, name="embed")(
        inputs
    )
    output = keras.layers.Dense(1, name="head")(embedded["tags_embedding"])
    model = keras.Model(inputs, output)
    model.compile(optimizer="sgd", loss="mse")
    return model


def _dataset(form):
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 4, ROWS)
    ids = tf.RaggedTensor.from_row_lengths(
        rng.integers(0, 20, lengths.sum()), lengths
    )
    tags = ids.to_sparse() if form == "sparse" else ids
    labels = rng.normal(size=(ROWS, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"tags": tags}, labels))


def _run(strategy, form):
    keras.utils.set_random_seed(models.SEED)
    with strategy.scope():
        model = _build(form)
    batches = kte.distribute_dataset(
        strategy, _dataset(form).repeat(), models.GLOBAL_BATCH
    )
    steps = ROWS // models.GLOBAL_BATCH
    # A distributed dataset has no known length: Keras is told the steps.
    model.fit(
        batches, epochs=2, steps_per_epoch=steps, verbose=0, shuffle=False
    )
    once = kte.distribute_dataset(strategy, _dataset(form), models.GLOBAL_BATCH)
    loss = model.evaluate(once, steps=steps, verbose=0)
    predicted = model.predict(once, steps=steps, verbose=0)
    return model, loss, predicted


@pytest.mark.parametrize("form", ["sparse", "ragged"])
def test_fit_evaluate_predict_on_multivalent_ids_equal_one_device(form):
    with emulated_tpu(2) as strategy:
        model, loss, predicted = _run(strategy, form)
        tables = models.engine_values(model)
        steps = int(model.get_layer("embed").embedding_step.numpy())
    reference, want_loss, want_predicted = _run(
        tf.distribute.get_strategy(), form
    )
    assert steps == 2 * ROWS // models.GLOBAL_BATCH
    models.assert_values_equal(tables, models.local_values(reference))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(predicted, want_predicted, atol=1e-5)
    # The tables trained: equal answers from untouched tables prove nothing.
    keras.utils.set_random_seed(models.SEED)
    untrained = models.local_values(_build(form))
    assert not np.allclose(tables["tags"], untrained["tags"])
