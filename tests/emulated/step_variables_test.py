"""Variables made inside a step, and steps XLA is asked to compile, under
the emulated TPU behave as TF's `TPUStrategy` makes them.

keras-rs builds `DistributedEmbedding`'s tables in the layer's first call,
inside `strategy.run` inside a `tf.function` (its own tests do), and
TensorFlow lifts the initial value of such a variable out of the function.
On a TPU nothing in the step waits for the step's inputs but what reads
them, and every replica's copy starts from the value the first was given
(`TPUExtended._create_mirrored_tpu_variables`), so the lift succeeds.
"""

import keras_rs  # the dev install has it: a missing one fails, never skips
import numpy as np
import pytest
import tensorflow as tf

from keras_tpu_embed.testing import emulated_tpu


def _first_step_makes_a_variable(strategy, initial_value):
    made = []

    @tf.function
    def step(x):
        def replica(x):
            if not made:
                made.append(tf.Variable(initial_value()))
            return x * made[0]

        return strategy.run(replica, args=(x,))

    return step, made


def test_a_variable_made_in_the_first_step_is_lifted_as_on_a_tpu():
    with emulated_tpu(2) as strategy:
        step, made = _first_step_makes_a_variable(
            strategy, lambda: tf.ones([4]) * 2.0
        )
        # TF lifts the initial value out of the function while tracing;
        # it fails if that value waits for the step's input.
        step.get_concrete_function(tf.TensorSpec([4], tf.float32))
        out = step(tf.constant([1.0, 2.0, 3.0, 4.0]))
        for value in strategy.experimental_local_results(out):
            np.testing.assert_array_equal(value.numpy(), [2.0, 4.0, 6.0, 8.0])
        copies = strategy.experimental_local_results(made[0])
        assert len(copies) == 2
        for copy in copies:
            np.testing.assert_array_equal(copy.numpy(), [2.0] * 4)


def test_every_replica_starts_from_the_first_replicas_random_value():
    with emulated_tpu(2) as strategy:
        with strategy.scope():
            variable = tf.Variable(lambda: tf.random.uniform([64]))
        first, second = strategy.experimental_local_results(variable)
        assert first.device != second.device
        np.testing.assert_array_equal(first.numpy(), second.numpy())


def test_a_counter_does_not_run_when_the_input_is_exhausted():
    """A TPU program starts only once its inputs exist."""
    dataset = tf.data.Dataset.range(2).map(lambda i: tf.cast(i, tf.float32))
    with emulated_tpu(2) as strategy:
        with strategy.scope():
            counter = tf.Variable(0, dtype=tf.int64)
        iterator = iter(
            strategy.experimental_distribute_dataset(dataset.batch(2))
        )

        @tf.function
        def step():
            def replica(x):
                counter.assign_add(1)
                return x

            return strategy.run(replica, args=(next(iterator),))

        step()
        with pytest.raises(tf.errors.OutOfRangeError):
            step()
        assert [
            int(c) for c in strategy.experimental_local_results(counter)
        ] == [1, 1]


def test_jit_compile_around_the_step_is_refused_by_name():
    """XLA on CPU compiles for one device; the step spans two."""
    batch = 32
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        table = keras_rs.layers.TableConfig(
            name="table", vocabulary_size=23, embedding_dim=8
        )
        feature = keras_rs.layers.FeatureConfig(
            name="feature",
            table=table,
            input_shape=(batch, 1),
            output_shape=(batch, 8),
        )
        with strategy.scope():
            layer = keras_rs.layers.DistributedEmbedding(feature)

        @tf.function(jit_compile=True)
        def run(ids):
            return strategy.run(layer.__call__, args=(ids,))

        with pytest.raises(NotImplementedError, match="jit_compile=True"):
            run(tf.zeros([batch, 1], tf.int32))
