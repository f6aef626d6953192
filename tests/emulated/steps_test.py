"""Keras counts the steps of a `kte.distribute_dataset` right.

Without `steps_per_epoch` / `steps`, Keras takes an epoch's length from
the distributed dataset's `cardinality`. TF's answer for
`distribute_datasets_from_function` is the first host's count of
per-replica batches, `replicas per host` times the steps, so Keras
expected twice the steps on 2 replicas and warned that the input ran out.
"""

import warnings

import keras

from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

STEPS = models.ROWS // models.GLOBAL_BATCH


class _Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.train, self.test, self.predict = [], 0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.train.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.train[-1] += 1

    def on_test_batch_end(self, batch, logs=None):
        self.test += 1

    def on_predict_batch_end(self, batch, logs=None):
        self.predict += 1


def test_fit_without_steps_per_epoch_runs_each_global_batch_once():
    with emulated_tpu(2) as strategy:
        model = models.build_emulated(strategy, "sgd")
        batches = models.batches(strategy)
        assert batches.cardinality == STEPS
        steps = _Steps()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(batches, epochs=2, verbose=0, callbacks=[steps])
            model.evaluate(batches, verbose=0, callbacks=[steps])
            predictions = model.predict(batches, verbose=0, callbacks=[steps])
        ran_out = [w for w in caught if "ran out of data" in str(w.message)]
        assert not ran_out, ran_out[0].message
        assert steps.train == [STEPS, STEPS]
        assert (steps.test, steps.predict) == (STEPS, STEPS)
        assert len(predictions) == models.ROWS
        assert int(model.get_layer("embed").embedding_step.numpy()) == 8
