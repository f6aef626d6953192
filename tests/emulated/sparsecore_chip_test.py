"""TensorFlow's own `TPUEmbeddingV2` under `emulated_tpu("V2")`.

`emulated_tpu(embedding_feature="V2")` is a TPU with SparseCores (v5p,
v6e): TF's `tf.tpu.experimental.embedding.TPUEmbeddingV2` runs unmodified
under it -- its table stacking, its sharded variables, its input
preprocessing and its apply_gradients -- and only the SparseCore ops are
the emulation's CPU kernels. These tests use TF's mid-level object directly,
without any layer of this package, and compare with references computed
here with plain numpy.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_tpu_embed.testing import emulated_tpu

REPLICAS = 2
EMB = tf.tpu.experimental.embedding


def _tables():
    """Two tables of one width and optimizer: TF stacks them."""
    item = EMB.TableConfig(
        vocabulary_size=64, dim=4, name="item", combiner="sum"
    )
    user = EMB.TableConfig(
        vocabulary_size=32, dim=4, name="user", combiner="mean"
    )
    return item, user


def test_v2_reports_a_sparsecore_tpu():
    with emulated_tpu(REPLICAS, embedding_feature="V2") as strategy:
        assert isinstance(strategy, tf.distribute.TPUStrategy)
        hardware = strategy.extended.tpu_hardware_feature
        assert (
            hardware.embedding_feature
            == tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V2
        )
        # What TPUEmbeddingV2 reads for the SparseCores of one chip (v5p).
        assert hardware.num_embedding_devices_per_chip == 4


def test_tpu_embedding_v2_builds_stacked_sharded_tables():
    with emulated_tpu(REPLICAS, embedding_feature="V2") as strategy:
        item, user = _tables()
        with strategy.scope():
            mid_level = EMB.TPUEmbeddingV2(
                {
                    "a": EMB.FeatureConfig(item, output_shape=[8]),
                    "b": EMB.FeatureConfig(user, output_shape=[8]),
                },
                EMB.Adagrad(learning_rate=0.1),
            )
            mid_level.build()
        # TF's stacking: one stacked table for both, 2 chips x 4 SparseCores.
        layouts = mid_level.embedding_layouts
        assert set(layouts) == {"item", "user"}
        assert {lay.stacked_table_name for lay in layouts.values()} == {
            "item_user"
        }
        assert {lay.num_sparse_cores for lay in layouts.values()} == {8}
        variables = mid_level.variables["item_user"]
        assert set(variables) == {"parameters", "accumulators"}
        devices = strategy.extended.worker_devices
        for variable in variables.values():
            # One shard per chip, on that chip's device.
            assert [v.device for v in variable.values] == list(devices)
            assert variable.shape[0] == sum(
                lay.unsharded_padded_shape[0] for lay in layouts.values()
            )
        np.testing.assert_array_equal(
            np.concatenate(
                [v.numpy() for v in variables["accumulators"].values]
            ),
            # Adagrad's initial accumulator, TF's own slot initializer.
            np.float32(0.1),
        )


def test_v2_refuses_an_unknown_feature_name():
    with pytest.raises(ValueError, match="embedding_feature"):
        with emulated_tpu(REPLICAS, embedding_feature="V3"):  # type: ignore
            pass
