"""Checks computed inside an XLA program and asserted outside it."""

import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.lookup import returned_checks
from keras_tpu_embed.lookup.returned_checks import Checks
from keras_tpu_embed.lookup.returned_checks import returned_checks as collect


def _layer(**column_args):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("a", 5), 2, **column_args
    )
    layer = kte.TPUEmbeddingLayer([column])
    layer({"a": tf.zeros([1, 2], tf.int64)})
    return layer


def _traced(layer, spec):
    with layer.serving_lookups(), collect() as checks:
        tf.function(lambda f: layer(f, training=False)).get_concrete_function(
            {"a": spec}
        )
    return checks


def test_the_fused_lookup_hands_its_checks_and_branches_on_nothing():
    checks = _traced(_layer(), tf.TensorSpec([None, 2], tf.int64))
    assert checks.complete and len(checks.handed) == 1
    (handed,) = checks.handed
    assert len(handed.messages) == 1 and "Feature 'a'" in handed.messages[0]
    # Handed over, not acted on: no branch and no assertion in the graph.
    graph = handed.passed.graph
    types = {op.type for op in graph.get_operations()}
    assert not types & {"If", "StatelessIf", "Assert"}


def test_a_lookup_that_keeps_its_checks_leaves_the_collector_incomplete():
    layer = _layer(tensor_core_shape=[None, 2])
    with layer.serving_lookups(lookup_device="tpu_tensor_core"):
        with collect() as checks:
            tf.function(
                lambda f: layer(f, training=False)
            ).get_concrete_function({"a": tf.TensorSpec([None, 2], tf.int64)})
    assert checks.lookups == 1 and not checks.handed
    assert not checks.complete


def test_a_width_checked_per_batch_refuses():
    checks = _traced(_layer(), tf.TensorSpec([None, None], tf.int64))
    assert checks.refused and not checks.complete


def _three_checks(passed):
    return Checks(
        passed=tf.constant(passed),
        evidence=tf.constant([4, 7, 9], tf.int64),
        messages=("first in range:", "second in range:", "third finite:"),
    )


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_the_assertion_names_the_first_failed_check_and_its_value(traced):
    def check(passed):
        every = _three_checks(passed)
        verdict = returned_checks.verdict(every)
        returned_checks.assert_clear(verdict, every.messages)
        return verdict.clear

    run = tf.function(check) if traced else check
    assert bool(run([True, True, True]))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"second in range:(.|\n)*7"
    ) as raised:
        run([True, False, False])
    assert "third" not in str(raised.value)


def test_checks_of_several_lookups_are_gathered_in_order():
    both = returned_checks.gathered(
        [_three_checks([True, True, True]), _three_checks([True, True, False])]
    )
    assert len(both.messages) == 6
    verdict = returned_checks.verdict(both)
    assert not bool(verdict.clear)
    assert int(verdict.first) == 5 and int(verdict.evidence) == 9
