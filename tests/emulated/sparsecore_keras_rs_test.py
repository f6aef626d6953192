"""A third-party user of `TPUEmbeddingV2` trains under the emulated V2.

keras-rs' `DistributedEmbedding` runs TF's `TPUEmbeddingV2` from Keras 3
(its CI runs it on v6e): its table config conversion, its gradient trap
(`tf.custom_gradient` around the lookup, `apply_gradients(gradients,
preserved_outputs)` in the backward pass) and its own unsharding of the
tables (`get_embedding_tables`). Under `emulated_tpu(embedding_feature=
"V2")`, `model.fit` on 2 replicas must train its table as plain numpy
says SGD does on the same global batches.
"""

import keras
import keras_rs  # the dev install has it: a missing one fails, never skips
import numpy as np
import pytest
import tensorflow as tf

from keras_tpu_embed.testing import emulated_tpu

GLOBAL_BATCH = 16
RATE = 0.5
STEPS = 3


# 2 steps per execution (Keras' `tf.while_loop` over the iterator; 3 steps,
# so the second execution is short) trains as one step per execution.
@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_keras_rs_fit_trains_as_numpy_says(steps_per_execution):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, (GLOBAL_BATCH * STEPS, 1)).astype(np.int32)
    labels = rng.normal(size=(GLOBAL_BATCH * STEPS, 1)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(({"f": ids}, labels))
    dataset = dataset.batch(GLOBAL_BATCH, drop_remainder=True)
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        with strategy.scope():
            table = keras_rs.layers.TableConfig(
                name="t",
                vocabulary_size=64,
                embedding_dim=4,
                optimizer=keras.optimizers.SGD(RATE),
                combiner="sum",
            )
            feature = keras_rs.layers.FeatureConfig(
                name="f",
                table=table,
                input_shape=(GLOBAL_BATCH, 1),
                output_shape=(GLOBAL_BATCH, 4),
            )
            embedding = keras_rs.layers.DistributedEmbedding({"f": feature})
            inputs = {
                "f": keras.Input(
                    shape=(1,), name="f", dtype="int32", batch_size=16
                )
            }
            outputs = keras.ops.sum(
                embedding(inputs)["f"], axis=1, keepdims=True
            )
            model = keras.Model(inputs, outputs)
            model.compile(
                loss="mse",
                optimizer=keras.optimizers.SGD(RATE),
                steps_per_execution=steps_per_execution,
            )
            before = np.array(embedding.get_embedding_tables()["t"])
        assert embedding._tpu_embedding is not None  # on "SparseCore"
        model.fit(dataset, epochs=1, verbose=0)
        with strategy.scope():
            after = np.array(embedding.get_embedding_tables()["t"])
    expected = before.astype(np.float64)
    for step in range(STEPS):
        batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        rows = ids[batch, 0]
        predictions = expected[rows].sum(axis=1)
        d_predictions = 2 * (predictions - labels[batch, 0]) / GLOBAL_BATCH
        gradient = np.zeros_like(expected)
        np.add.at(gradient, rows, d_predictions[:, None])
        expected -= RATE * gradient
    assert np.abs(after - before).max() > 1e-2
    np.testing.assert_allclose(after, expected, atol=1e-5, rtol=0)
