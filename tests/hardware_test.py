"""The one place that asks the TPU what it offers for embeddings."""

import pytest
import tensorflow as tf

from keras_tpu_embed.placement import hardware as tpu_hardware
from keras_tpu_embed.placement.hardware import EmbeddingHardware


def test_strategies_without_a_tpu_have_no_embedding_hardware():
    assert tpu_hardware.embedding_hardware(tf.distribute.get_strategy()) is (
        EmbeddingHardware.NONE
    )
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert tpu_hardware.embedding_hardware(one) is EmbeddingHardware.NONE
    with one.scope():
        assert tpu_hardware.current_hardware() is EmbeddingHardware.NONE


def test_only_v1_and_v2_have_an_engine():
    assert [h for h in EmbeddingHardware if h.has_engine] == [
        EmbeddingHardware.V1,
        EmbeddingHardware.V2,
    ]


def test_mid_level_class_per_hardware():
    assert (
        tpu_hardware.mid_level_class(EmbeddingHardware.V1)
        is tf.tpu.experimental.embedding.TPUEmbedding
    )
    assert (
        tpu_hardware.mid_level_class(EmbeddingHardware.V2)
        is tf.tpu.experimental.embedding.TPUEmbeddingV2
    )
    for hardware in (EmbeddingHardware.NONE, EmbeddingHardware.NO_ENGINE):
        with pytest.raises(ValueError, match=hardware.value):
            tpu_hardware.mid_level_class(hardware)


def test_called_where_built():
    layer = "TPUEmbeddingLayer 'embed'"
    # Built and called off-TPU: fine.
    tpu_hardware.check_called_where_built(layer, EmbeddingHardware.NONE, False)
    with pytest.raises(RuntimeError, match="was built under TPUStrategy"):
        tpu_hardware.check_called_where_built(layer, EmbeddingHardware.V1, True)
