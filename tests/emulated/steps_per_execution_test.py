"""`model.fit(steps_per_execution > 1)` under `emulated_tpu(2)`.

Keras runs several steps per call in a `tf.while_loop` over
`get_next_as_optional` (`keras/src/backend/tensorflow/trainer.py`,
`multi_step_on_iterator`): the step runs inside `tf.cond` and
`tf.while_loop`, and TF's partial-batch handling hands it inputs with an
unknown batch dimension. With 2 and 3 steps per execution (3 does not
divide the 4 steps of an epoch, so the last execution of each epoch is
short), training equals one device on the same global batches within
1e-5: tables, optimizer slots, `embedding_step` and the dense head; so do
`evaluate` and `predict` (whose multi-step function calls `strategy.run`
once per step in one graph).

The engine's ids are sparse here: with the batch unknown, TPUStrategy's
dynamic padding pads every dense input of the step, and TF's enqueue
refuses padded ids (`enqueue_inputs_test.py`); the components of sparse
ids are never padded. Without an engine ("UNSUPPORTED") they stay dense.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models


def _train(strategy, optimizer, steps_per_execution, sparse):
    model = models.build_emulated(strategy, optimizer, sparse=sparse)
    with strategy.scope():
        model.compile(
            optimizer="sgd",
            loss="mse",
            steps_per_execution=steps_per_execution,
        )
    model.fit(models.batches(strategy, sparse=sparse), epochs=2, verbose=0)
    return model


@pytest.mark.parametrize("steps_per_execution", [2, 3])
@pytest.mark.parametrize("feature", ["V1", "UNSUPPORTED"])
def test_fit_with_steps_per_execution_equals_one_device(
    feature, steps_per_execution
):
    sparse = feature == "V1"
    expected = models.trained_one_device("adagrad", sparse=sparse)
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        model = _train(strategy, "adagrad", steps_per_execution, sparse)
        on_engine = model.get_layer("embed").engine is not None
        assert on_engine == (feature == "V1")
        actual = models.table_values(model)
        models.assert_values_equal(actual, models.local_values(expected))
        assert any(name.endswith("/accumulators") for name in actual)
        step = model.get_layer("embed").embedding_step
        assert int(step.numpy()) == 8
        assert int(expected.get_layer("embed").embedding_step.numpy()) == 8
        for actual_head, wanted in zip(
            model.get_layer("head").get_weights(),
            expected.get_layer("head").get_weights(),
        ):
            np.testing.assert_allclose(actual_head, wanted, atol=1e-5, rtol=0)
        loss = model.evaluate(
            models.batches(strategy, sparse=sparse), verbose=0
        )
        predictions = model.predict(
            models.batches(strategy, sparse=sparse), verbose=0
        )
    expected_loss = expected.evaluate(
        models.batches(tf.distribute.get_strategy(), sparse=sparse), verbose=0
    )
    np.testing.assert_allclose(loss, expected_loss, atol=1e-5, rtol=0)
    np.testing.assert_allclose(
        predictions,
        expected.predict(
            models.batches(tf.distribute.get_strategy(), sparse=sparse),
            verbose=0,
        ),
        atol=1e-5,
        rtol=0,
    )


def test_unknown_batch_names_steps_per_execution():
    """A distributed dataset not made by kte.distribute_dataset gives the
    engine no batch to restore: the error says what to do."""
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, "sgd", sparse=True)
        with strategy.scope():
            model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
        batches = strategy.experimental_distribute_dataset(
            models.dataset(sparse=True).batch(
                models.GLOBAL_BATCH, drop_remainder=True
            ),
            tf.distribute.InputOptions(experimental_fetch_to_device=False),
        )
        with pytest.raises(
            ValueError, match="unknown batch size(.|\n)*steps_per_execution=1"
        ):
            model.fit(batches, epochs=1, verbose=0)
