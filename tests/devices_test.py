"""The lookup-device table of DESIGN §3, rule by rule."""

import pytest

from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.placement.devices import parse_lookup_device
from keras_tpu_embed.placement.devices import resolve_lookup_device

CPU = LookupDevice.CPU
CORE = LookupDevice.TPU_TENSOR_CORE
ENGINE = LookupDevice.TPU_EMBEDDING_CORE


def resolve(device, **kwargs):
    kwargs.setdefault("has_tensor_core_shape", True)
    return resolve_lookup_device(device, column="c", **kwargs)


@pytest.mark.parametrize(
    "device, engine_training, elsewhere, serving",
    [
        (None, ENGINE, CPU, CPU),
        (ENGINE, ENGINE, CPU, "error"),
        (CORE, CORE, CORE, CORE),
        (CPU, "error", CPU, CPU),
    ],
    ids=["default", "tpu_embedding_core", "tpu_tensor_core", "cpu"],
)
def test_design_table(device, engine_training, elsewhere, serving):
    for expected, kwargs in (
        (engine_training, dict(serving=False, engine=True)),
        (elsewhere, dict(serving=False, engine=False)),
        (serving, dict(serving=True, engine=False)),
    ):
        if expected == "error":
            with pytest.raises(ValueError, match="Column 'c'"):
                resolve(device, **kwargs)
        else:
            assert resolve(device, **kwargs) is expected


def test_serving_override_wins_and_needs_a_shape():
    assert (
        resolve(ENGINE, serving=True, engine=False, serving_override=CPU) is CPU
    )
    assert (
        resolve(None, serving=True, engine=False, serving_override=CORE) is CORE
    )
    with pytest.raises(ValueError, match="no tensor_core_shape"):
        resolve(
            None,
            serving=True,
            engine=False,
            serving_override=CORE,
            has_tensor_core_shape=False,
        )


def test_unknown_device_strings():
    with pytest.raises(ValueError, match="Expected one of"):
        parse_lookup_device("gpu")
    assert parse_lookup_device("cpu") is CPU
