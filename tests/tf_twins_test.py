"""Our optimizers and their `tf.tpu.experimental.embedding` twins."""

import dataclasses

import keras
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed import optimizers
from tests import testing


@pytest.mark.parametrize("name", sorted(testing.OPTIMIZER_CASES))
def test_to_tpu_carries_every_parameter(name):
    opt = testing.OPTIMIZER_CASES[name]
    twin = opt.to_tpu()
    for field in dataclasses.fields(opt):
        if field.name == "clipvalue":
            assert (twin.clip_gradient_min, twin.clip_gradient_max) == (
                opt.gradient_clip_bounds
            )
        else:
            assert getattr(twin, field.name) == getattr(opt, field.name), (
                field.name
            )
    assert twin._slot_names() == [s.name for s in opt.SLOTS]
    assert optimizers.from_tpu(twin) == opt
    assert kte.EmbeddingConfig(optimizer=twin).optimizer == opt


def test_defaults_equal_tf_defaults():
    tpu = tf.tpu.experimental.embedding
    for ours, theirs in [
        (kte.optimizers.SGD, tpu.SGD),
        (kte.optimizers.Adagrad, tpu.Adagrad),
        (kte.optimizers.AdagradMomentum, tpu.AdagradMomentum),
        (kte.optimizers.Adam, tpu.Adam),
        (kte.optimizers.FTRL, tpu.FTRL),
    ]:
        assert optimizers.from_tpu(theirs()) == ours(), ours.__name__


def test_unknown_optimizer():
    with pytest.raises(TypeError, match="SGD, Adagrad, AdagradMomentum"):
        kte.EmbeddingConfig(optimizer=keras.optimizers.Adam())


def test_from_tpu_keeps_one_sided_gradient_clips():
    twin = tf.tpu.experimental.embedding.SGD(0.1, clipvalue=(None, 2.0))
    assert optimizers.from_tpu(twin).clipvalue == (None, 2.0)
    assert optimizers.from_tpu(twin.__class__(0.1)).clipvalue is None


def test_get_passes_ours_through_and_refuses_others():
    ours = kte.optimizers.Adam(0.1)
    assert optimizers.get(ours) is ours
    assert optimizers.get(ours.to_tpu()) == ours
    with pytest.raises(TypeError, match="No keras_tpu_embed twin.*Adam"):
        optimizers.from_tpu(keras.optimizers.Adam())
    with pytest.raises(TypeError, match=r"Received: 'sgd' \(of type str\)"):
        optimizers.get("sgd")
    assert [c.__name__ for c in optimizers.SUPPORTED_OPTIMIZERS] == [
        "SGD",
        "Adagrad",
        "AdagradMomentum",
        "Adam",
        "FTRL",
    ]
