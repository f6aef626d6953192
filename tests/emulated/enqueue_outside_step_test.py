"""TF's own documented V1 training step runs on the emulated chip.

`TPUEmbedding.enqueue`'s docstring (`tensorflow/python/tpu/
tpu_embedding_v2.py`) enqueues outside `strategy.run`, with no device: TF
then builds one enqueue op per core, each on its core's host with the
core's `device_ordinal`, and the step's `dequeue` inside `strategy.run`
reads its core's batch. keras-rs' V1 layer and Keras' symbolic build reach
the same path. A TPU feeds each core from its own op; the emulated chip
must too, and train as numpy says SGD does.
"""

import numpy as np
import tensorflow as tf

from keras_tpu_embed.testing import emulated_tpu

ROWS = 12
DIM = 3
GLOBAL_BATCH = 8
RATE = 0.5


def test_tfs_documented_enqueue_outside_the_step_trains_each_core(tmp_path):
    rng = np.random.default_rng(5)
    initial = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    ids = rng.integers(0, ROWS, (GLOBAL_BATCH,)).astype(np.int32)
    targets = rng.normal(size=(GLOBAL_BATCH, DIM)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensors(({"f": ids}, targets)).repeat()
    with emulated_tpu(2) as strategy:
        table = tf.tpu.experimental.embedding.TableConfig(
            vocabulary_size=ROWS,
            dim=DIM,
            initializer=tf.constant_initializer(initial),
            combiner="sum",
            name="t",
        )
        features = {
            "f": tf.tpu.experimental.embedding.FeatureConfig(table=table)
        }
        optimizer = tf.tpu.experimental.embedding.SGD(RATE)
        # TF 2.20/2.21 copy this bool into an int proto field, which the
        # protobuf runtime refuses; on a TPU too (the package does the same).
        optimizer.low_dimensional_packing_status = 0
        with strategy.scope():
            embedding = tf.tpu.experimental.embedding.TPUEmbedding(
                features, optimizer
            )
        iterator = iter(
            strategy.experimental_distribute_dataset(
                dataset,
                options=tf.distribute.InputOptions(
                    experimental_fetch_to_device=False
                ),
            )
        )

        @tf.function
        def training_step():
            def tpu_step(targets):
                with tf.GradientTape() as tape:
                    activations = embedding.dequeue()
                    tape.watch(activations)
                    loss = (
                        tf.reduce_sum((activations["f"] - targets) ** 2)
                        / GLOBAL_BATCH
                    )
                gradients = tape.gradient(loss, activations)
                embedding.apply_gradients(gradients)
                return activations["f"]

            embedding_features, targets = next(iterator)
            embedding.enqueue(embedding_features, training=True)
            return strategy.run(tpu_step, args=(targets,))

        activations = training_step()
        gathered = np.concatenate(
            [
                a.numpy()
                for a in strategy.experimental_local_results(activations)
            ]
        )
        np.testing.assert_allclose(gathered, initial[ids], atol=1e-6)
        training_step()
        # TF's own way to read a table off a TPU: a checkpoint, whose save
        # retrieves the tables from the chip.
        path = tf.train.Checkpoint(embedding=embedding).write(
            str(tmp_path / "ckpt")
        )
    after = tf.train.load_variable(
        path, "embedding/t/.ATTRIBUTES/VARIABLE_VALUE"
    )
    expected = initial.astype(np.float64)
    for _ in range(2):
        gradient = np.zeros_like(expected)
        np.add.at(gradient, ids, 2 * (expected[ids] - targets) / GLOBAL_BATCH)
        expected -= RATE * gradient
    assert np.abs(after - initial).max() > 1e-2
    np.testing.assert_allclose(after, expected, atol=1e-5)
