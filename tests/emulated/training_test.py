"""`model.fit` under `emulated_tpu(2)` equals one device.

Two replicas on the TPU embedding engine (`embedding_feature="V1"`), the
same global batches: tables, optimizer slots, `embedding_step` and the
dense head agree within 1e-5 with the model trained on one device, for
every engine optimizer. evaluate and predict agree too.
"""

import numpy as np
import pytest

from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models


@pytest.mark.parametrize("optimizer", sorted(models.OPTIMIZERS))
def test_fit_equals_one_device(optimizer):
    expected = models.one_device(optimizer)
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, optimizer)
        assert model.get_layer("embed").engine is not None
        model.fit(models.batches(strategy), epochs=2, verbose=0)
        models.assert_values_equal(
            models.engine_values(model), models.local_values(expected)
        )
        step = model.get_layer("embed").embedding_step
        assert int(step.numpy()) == 8
        assert int(expected.get_layer("embed").embedding_step.numpy()) == 8
        for actual, wanted in zip(
            model.get_layer("head").get_weights(),
            expected.get_layer("head").get_weights(),
        ):
            np.testing.assert_allclose(actual, wanted, atol=1e-5, rtol=0)
