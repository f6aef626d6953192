"""What every embedding optimizer has: parameters, their checks, slots."""

import pytest

import keras_tpu_embed as kte
from keras_tpu_embed.optimizers import base
from tests import testing


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: kte.optimizers.SGD(
                clip_weight_min=2.0, clip_weight_max=1.0
            ),
            "clip_weight_min",
        ),
        (
            lambda: kte.optimizers.SGD(
                clipvalue=1.0, use_gradient_accumulation=False
            ),
            "clipvalue",
        ),
        (
            lambda: kte.optimizers.SGD(weight_decay_factor=-0.1),
            "weight_decay_factor",
        ),
    ],
)
def test_invalid_arguments(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_learning_rate_type():
    with pytest.raises(TypeError, match="learning_rate"):
        kte.optimizers.SGD("fast")


@pytest.mark.parametrize("name", sorted(testing.OPTIMIZER_CASES))
def test_serialization_round_trip(name):
    rebuilt = testing.assert_serialization_round_trip(
        testing.OPTIMIZER_CASES[name]
    )
    assert rebuilt == testing.OPTIMIZER_CASES[name]


def test_clipvalue_is_stored_as_tf_expands_it():
    symmetric = kte.optimizers.SGD(clipvalue=0.5)
    assert symmetric.clipvalue == (-0.5, 0.5)
    assert symmetric == kte.optimizers.SGD(clipvalue=(-0.5, 0.5))
    assert kte.optimizers.SGD(clipvalue=[None, 1.0]).clipvalue == (None, 1.0)
    assert kte.optimizers.SGD().gradient_clip_bounds == (None, None)
    with pytest.raises(ValueError, match=r"`clipvalue` of SGD must be in"):
        kte.optimizers.SGD(clipvalue=-1.0)


def test_callable_learning_rate_is_read_when_asked():
    rate = [0.1]
    optimizer = kte.optimizers.SGD(lambda: rate[0])
    assert optimizer.current_learning_rate() == 0.1
    rate[0] = 0.2
    assert optimizer.current_learning_rate() == 0.2
    assert kte.optimizers.SGD(0.3).current_learning_rate() == 0.3


def test_slot_initial_values():
    adagrad = kte.optimizers.Adagrad(initial_accumulator_value=0.3)
    (accumulators,) = adagrad.SLOTS
    assert accumulators == base.SlotSpec(
        "accumulators", "initial_accumulator_value"
    )
    assert adagrad.slot_initial_value(accumulators) == 0.3
    adam = kte.optimizers.Adam()
    assert [adam.slot_initial_value(s) for s in adam.SLOTS] == [0.0, 0.0]


def test_range_checks_name_owner_argument_and_bounds():
    with pytest.raises(ValueError, match=r"`beta` of Owner must be in \[0, 1"):
        base.check_range("Owner", "beta", 1.0, 0, 1)
    base.check_range("Owner", "beta", 1.0, 0, 1, high_inclusive=True)
    with pytest.raises(ValueError, match=r"must be in \(0, inf\)"):
        base.check_positive("Owner", "epsilon", 0)
    base.check_non_negative("Owner", "l1", 0)
    with pytest.raises(TypeError, match="must be a number.*bool"):
        base.check_number("Owner", "momentum", True)


def test_the_base_class_has_no_rule_of_its_own():
    optimizer = base.EmbeddingOptimizer()
    with pytest.raises(NotImplementedError):
        optimizer.update(None, {}, None, None)
    with pytest.raises(NotImplementedError):
        optimizer.to_tpu()
