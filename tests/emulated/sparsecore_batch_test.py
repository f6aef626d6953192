"""A per-replica batch that does not split over a chip's SparseCores is
refused at the first step, naming the batch and the batch to use.

`TPUEmbeddingV2` gives each SparseCore `sample_count // num_sc_per_chip`
of a feature's samples (`tpu_embedding_v3.py`): the rule is TF's. The step
failed with an error of the emulated SparseCore naming no column, batch
or fix (issue 41, item 11).
"""

import pytest

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models


def test_a_batch_that_does_not_split_over_the_sparsecores_is_named():
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        model = models.build_emulated(strategy, "sgd")
        # 4 examples over 2 replicas: 2 per replica, 4 SparseCores a chip.
        batches = kte.distribute_dataset(strategy, models.dataset(), 4)
        with pytest.raises(
            ValueError,
            match=r"per-replica batch is 2 \(a global batch of 4 over 2 "
            r"replicas\), which does not divide for the features "
            r"\['item_embedding', 'user_embedding'\]\. Use a global batch "
            r"size divisible by 8",
        ):
            model.fit(batches, epochs=1, verbose=0)
