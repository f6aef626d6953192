"""The emulated chip's update rules against the numpy reference.

`engine_rules.step` reads TF's `OptimizationParameters` proto, filled in by
TF's own `_set_optimization_parameters` from the optimizer's
`tf.tpu.experimental.embedding` twin; `testing.numpy_step` is written from
the engine's documented formulas and is itself checked against TF's
`ResourceApply*` kernels (`testing_test.py`). Each optimizer is taken with
non-default arguments so that a field the proto drops, or the rule
misreads, changes the answer.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2

import keras_tpu_embed as kte
from keras_tpu_embed.testing import engine_rules
from tests.testing import numpy_step

OPTIMIZERS = [
    kte.optimizers.SGD(0.3),
    kte.optimizers.SGD(
        0.3,
        clipvalue=0.5,
        weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True,
        clip_weight_min=-0.8,
        clip_weight_max=0.9,
    ),
    kte.optimizers.Adagrad(0.2, initial_accumulator_value=0.3),
    kte.optimizers.Adagrad(
        0.2, clipvalue=(-0.2, 0.4), weight_decay_factor=0.05
    ),
    kte.optimizers.AdagradMomentum(0.1, momentum=0.8, use_nesterov=True),
    kte.optimizers.AdagradMomentum(
        0.1, momentum=0.5, beta2=0.9, exponent=3, epsilon=1e-3
    ),
    kte.optimizers.Adam(0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-3),
    kte.optimizers.Adam(0.05, sum_inside_sqrt=False, epsilon=1e-2),
    kte.optimizers.FTRL(
        0.1,
        learning_rate_power=-0.7,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.2,
        beta=0.3,
    ),
    kte.optimizers.FTRL(
        0.1,
        l1_regularization_strength=0.02,
        multiply_linear_by_learning_rate=True,
    ),
]


def _parameters(optimizer):
    """The table's `OptimizationParameters` a real TPU receives for
    `optimizer`, filled in by TF's own `TableConfig._set_table_descriptor`
    (the learning rate, then the optimizer's fields)."""
    twin = optimizer.to_tpu()
    table = tf.tpu.experimental.embedding.TableConfig(
        vocabulary_size=8, dim=4, optimizer=twin, name="t"
    )
    descriptor = (
        tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration()
    ).table_descriptor.add()
    rates = {twin.learning_rate: 0} if callable(twin.learning_rate) else {}
    table._set_table_descriptor(descriptor, 1, rates)
    return descriptor.optimization_parameters


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=repr)
def test_step_read_from_the_proto_equals_the_engine_formulas(optimizer):
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(5, 4)).astype(np.float32)
    gradient = rng.normal(size=rows.shape).astype(np.float32)
    slots = {
        slot.name: (
            optimizer.slot_initial_value(slot)
            + rng.uniform(0.1, 1.0, rows.shape)
        ).astype(np.float32)
        for slot in optimizer.SLOTS
    }
    parameters = _parameters(optimizer)
    assert sorted(
        engine_rules.SLOT_NAMES[engine_rules.optimizer_kind(parameters)]
    ) == sorted(slots)
    rate = engine_rules.learning_rate(parameters, [])
    got_rows, got_slots = engine_rules.step(
        parameters,
        tf.constant(rows),
        {name: tf.constant(value) for name, value in slots.items()},
        tf.constant(gradient),
        rate,
    )
    want_slots = {k: v.astype(np.float64) for k, v in slots.items()}
    want_rows = numpy_step(
        optimizer,
        rows.astype(np.float64),
        want_slots,
        gradient.astype(np.float64),
        float(rate),
    )
    # float32 arithmetic against float64 reference.
    np.testing.assert_allclose(got_rows, want_rows, rtol=2e-5, atol=2e-6)
    assert not np.allclose(got_rows, rows), "the step moved no row"
    for name, value in want_slots.items():
        np.testing.assert_allclose(got_slots[name], value, rtol=2e-5, atol=2e-6)


def test_a_schedule_reaches_the_rule_as_a_dynamic_rate():
    optimizer = kte.optimizers.SGD(lambda: 0.25)
    parameters = _parameters(optimizer)
    assert parameters.learning_rate.WhichOneof("learning_rate") == "dynamic"
    rate = engine_rules.learning_rate(parameters, [tf.constant(0.25)])
    rows, _ = engine_rules.step(
        parameters, tf.ones([1, 2]), {}, tf.ones([1, 2]), rate
    )
    np.testing.assert_allclose(rows, [[0.75, 0.75]])


def test_an_optimizer_the_chip_has_no_rule_for_is_refused_by_name():
    parameters = optimization_parameters_pb2.OptimizationParameters()
    parameters.centered_rms_prop.SetInParent()
    with pytest.raises(NotImplementedError, match="centered_rms_prop"):
        engine_rules.optimizer_kind(parameters)
