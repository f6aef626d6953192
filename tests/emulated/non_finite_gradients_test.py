"""A NaN embedding gradient on the engine fails the step, naming the table.

On CPU a non-finite embedding gradient skips the update and raises,
naming the table and the step (`EmbeddingConfig(non_finite_updates=
"raise")`, the default). Under the emulation `fit` used to return with a
NaN loss and every row of the table and its accumulator NaN, which only
`kte.validate_tables` showed afterwards.
"""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models


def _nan_labels():
    features, labels = next(iter(models.dataset().batch(models.ROWS)))
    labels = np.array(labels)
    labels[3] = np.nan
    return tf.data.Dataset.from_tensor_slices((features, labels))


@pytest.mark.parametrize("feature", ["V1", "V2"])
def test_a_nan_gradient_fails_the_step_and_leaves_the_tables(feature):
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.fit(models.batches(strategy), steps_per_epoch=1, verbose=0)
        before = models.engine_tables(model)
        batches = kte.distribute_dataset(
            strategy, _nan_labels(), models.GLOBAL_BATCH
        )
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            # TF quotes the message's own quotes.
            match=r"Embedding table .{1,3}(user|item).{1,3} received a NaN "
            r"or inf gradient at embedding step\] \[1\]",
        ):
            model.fit(batches, verbose=0)
        assert kte.validate_tables(model) == {}
        models.assert_values_equal(models.engine_tables(model), before, atol=0)
