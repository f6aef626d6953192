"""`model.fit` under `emulated_tpu(2)` equals one device.

Two replicas, the same global batches: tables, optimizer slots,
`embedding_step` and the dense head agree within 1e-5 with the model
trained on one device, for every engine optimizer, on the TPU embedding
engine (`"V1"`) and on a TPU without one (`"UNSUPPORTED"`, v5e: the tables
fall back to the tensor core).
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models


@pytest.mark.parametrize("feature", ["V1", "UNSUPPORTED"])
@pytest.mark.parametrize("optimizer", sorted(models.OPTIMIZERS))
def test_fit_equals_one_device(optimizer, feature):
    expected = models.trained_one_device(optimizer)
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        model = models.build_emulated(strategy, optimizer)
        on_engine = model.get_layer("embed").engine is not None
        assert on_engine == (feature == "V1")
        model.fit(models.batches(strategy), epochs=2, verbose=0)
        models.assert_values_equal(
            models.table_values(model), models.local_values(expected)
        )
        step = model.get_layer("embed").embedding_step
        assert int(step.numpy()) == 8
        assert int(expected.get_layer("embed").embedding_step.numpy()) == 8
        for actual, wanted in zip(
            model.get_layer("head").get_weights(),
            expected.get_layer("head").get_weights(),
        ):
            np.testing.assert_allclose(actual, wanted, atol=1e-5, rtol=0)
        predictions = model.predict(models.batches(strategy), verbose=0)
    np.testing.assert_allclose(
        predictions,
        expected.predict(
            models.batches(tf.distribute.get_strategy()), verbose=0
        ),
        atol=1e-5,
        rtol=0,
    )
