"""Each table's devices, decided once from the columns, the serving device
and the hardware, and read by every part of the layer.

A table that falls back to the tensor core on a TPU without an engine is
built under `emulated_tpu("UNSUPPORTED")` in
`tests/emulated/engine_layers_test.py`."""

import pytest

import keras_tpu_embed as kte
from keras_tpu_embed.backends import serving_tables
from keras_tpu_embed.placement.device_plan import plan_devices
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.placement.hardware import EmbeddingHardware
from keras_tpu_embed.tables.table_specs import group_into_tables


def _tables(**column_kwargs):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4, **column_kwargs
    )
    return group_into_tables([column])


def test_the_plan_decides_training_on_the_hardware_and_serving_once():
    tables = _tables(tensor_core_shape=[None, 2])
    on_cpu = plan_devices(tables, EmbeddingHardware.NONE, None)
    on_engine = plan_devices(tables, EmbeddingHardware.V1, None)
    assert on_cpu.training == {"user": LookupDevice.CPU}
    assert on_engine.training == {"user": LookupDevice.TPU_EMBEDDING_CORE}
    assert on_engine.on_engine("user") and not on_cpu.on_engine("user")
    assert on_cpu.serving == on_engine.serving == {"user": LookupDevice.CPU}
    core = on_engine.with_serving_device(tables, LookupDevice.TPU_TENSOR_CORE)
    assert core.serving == {"user": LookupDevice.TPU_TENSOR_CORE}
    assert core.training == on_engine.training
    assert on_engine.serving == {"user": LookupDevice.CPU}  # not changed
    assert on_engine.with_serving_device(tables, None) is on_engine


def test_a_table_without_a_serving_device_says_why_when_asked():
    tables = _tables(embedding_lookup_device="tpu_embedding_core")
    plan = plan_devices(tables, EmbeddingHardware.V1, None)
    assert plan.serving == {}
    with pytest.raises(ValueError, match="not valid for serving"):
        plan.check_serving()
    plan.with_serving_device(tables, LookupDevice.CPU).check_serving()
    unshaped = plan_devices(_tables(), EmbeddingHardware.NONE, None)
    with pytest.raises(ValueError, match="no tensor_core_shape"):
        unshaped.with_serving_device(
            _tables(), LookupDevice.TPU_TENSOR_CORE
        ).check_serving()


def test_an_export_plan_leaves_the_layers_plan_alone():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20),
        4,
        tensor_core_shape=[None, 2],
    )
    layer = kte.TPUEmbeddingLayer([column])
    layer.build()
    with layer.serving_lookups(LookupDevice.TPU_TENSOR_CORE):
        assert serving_tables.served(layer).plan.serving == {
            "user": LookupDevice.TPU_TENSOR_CORE
        }
    assert serving_tables.served(layer) is None
    assert layer._devices.serving == {"user": LookupDevice.CPU}
