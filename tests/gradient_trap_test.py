"""The gradient trap: tables trained by the embedding optimizer in Keras'
backward pass, with a zero gradient for the trap variable."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.backends.gradient_trap import trap_gradients
from tests import testing


def test_forward_is_the_identity_and_calls_nothing():
    calls = []
    rows = [tf.constant([[1.0, 2.0]]), tf.constant([[3.0], [4.0]])]
    out = trap_gradients(rows, tf.constant(0.0), calls.append)
    assert len(out) == 2
    for got, want in zip(out, rows):
        np.testing.assert_array_equal(got, want)
    assert calls == []


def test_backward_hands_the_rows_gradients_over_and_returns_zeros():
    received = []

    def apply_gradients(gradients):
        received.append([g.numpy() for g in gradients])
        return tf.constant(7, tf.int64)

    a = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    b = tf.Variable([[5.0]])
    unused = tf.Variable([[6.0, 7.0]])
    trap = tf.Variable(0.0)
    with tf.GradientTape() as tape:
        out = trap_gradients(
            [a.value(), b.value(), unused.value()],
            trap.value(),
            apply_gradients,
        )
        loss = tf.reduce_sum(out[0] * [[1.0, 2.0], [3.0, 4.0]])
        loss += tf.reduce_sum(5.0 * out[1])
    grads = tape.gradient(loss, [a, b, unused, trap])
    assert len(received) == 1
    np.testing.assert_array_equal(received[0][0], [[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(received[0][1], [[5.0]])
    # A row no output depends on gets a zero gradient, not None.
    np.testing.assert_array_equal(received[0][2], [[0.0, 0.0]])
    for grad, variable in zip(grads[:3], [a, b, unused]):
        np.testing.assert_array_equal(grad, np.zeros(variable.shape))
    assert grads[3] is not None
    assert float(grads[3]) == 0.0


@pytest.mark.parametrize("keras_optimizer", ["sgd", "adam", "rmsprop"])
def test_fit_trains_tables_with_any_keras_optimizer(keras_optimizer):
    # Regression: with Adam, Grappler pruned updates that hung on control
    # edges only; the trap now makes them a data dependency.
    layer = kte.TPUEmbeddingLayer(
        [testing.identity_column()],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.1)),
    )
    inputs = {
        "ids": keras.Input((None,), sparse=True, dtype="int64", name="ids")
    }
    model = keras.Model(
        inputs, keras.layers.Dense(1)(layer(inputs)["ids_embedding"])
    )
    model.compile(keras_optimizer, "mse")
    ids = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64) + 1)
    ids = tf.SparseTensor(ids.indices, ids.values - 1, ids.dense_shape)
    dataset = tf.data.Dataset.from_tensors(
        ({"ids": ids}, tf.ones([2, 1]))
    ).repeat(4)
    before = layer.table_variable("ids").numpy().copy()
    model.fit(dataset, epochs=2, verbose=0)
    assert int(layer.embedding_step.numpy()) == 8
    assert int(model.optimizer.iterations.numpy()) == 8
    assert not np.allclose(before[:4], layer.table_variable("ids").numpy()[:4])
    np.testing.assert_array_equal(
        before[4:], layer.table_variable("ids").numpy()[4:]
    )
