"""Issue 23, finding 8: what the engine's enqueue takes, under Keras.

TF's enqueue (`enqueue_tpu_embedding_arbitrary_tensor_batch`) takes its
sparse ids as sample indices and its ragged ids as row splits, one kind
per call; the layers enqueue every engine feature of a step in one call.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

ROWS = 8


def _mixed_model():
    columns = [
        kte.embedding_column(
            kte.categorical_column_with_identity(key, 20), 4, combiner="sum"
        )
        for key in ("tags", "genres")
    ]
    inputs = {
        "tags": keras.Input((None,), dtype="int64", name="tags", sparse=True),
        "genres": keras.Input(
            (None,), dtype="int64", name="genres", ragged=True
        ),
    }
    embedded = kte.TPUEmbeddingLayer(columns, name="embed")(inputs)
    joined = keras.layers.Concatenate()(
        [embedded["tags_embedding"], embedded["genres_embedding"]]
    )
    model = keras.Model(inputs, keras.layers.Dense(1)(joined))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _mixed_examples():
    ids = tf.RaggedTensor.from_row_lengths(
        np.arange(2 * ROWS, dtype=np.int64) % 20, [2] * ROWS
    )
    features = {"tags": ids.to_sparse(), "genres": ids}
    return tf.data.Dataset.from_tensor_slices(
        (features, np.zeros((ROWS, 1), np.float32))
    )


def test_sparse_and_ragged_ids_in_one_step_are_refused_with_the_fix():
    with emulated_tpu(2) as strategy:
        with strategy.scope():
            model = _mixed_model()
        batches = kte.distribute_dataset(strategy, _mixed_examples(), 4)
        with pytest.raises(ValueError) as error:
            model.fit(batches, verbose=0)
    message = str(error.value)
    assert "sparse ['tags_embedding']" in message
    assert "ragged ['genres_embedding']" in message
    assert "sparse=True" in message


def test_dense_ids_padded_by_dynamic_padding_are_refused_with_the_fix():
    """Under `steps_per_execution > 1` the step's dense inputs have an
    unknown batch (TF's partial-batch handling), so TPUStrategy's dynamic
    padding pads them in `tpu.replicate`, which then marks none of them a
    direct input: TF's enqueue refuses the dense ids. The error names the
    feature and the fix."""
    with emulated_tpu(2) as strategy:
        model = models.build_emulated(strategy, "sgd")
        with strategy.scope():
            model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
        with pytest.raises(ValueError) as error:
            model.fit(models.batches(strategy), verbose=0)
    message = str(error.value)
    assert "['item_embedding', 'user_embedding']" in message
    assert "sparse=True" in message
    assert "steps_per_execution=1" in message
