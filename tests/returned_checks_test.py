"""Checks computed inside an XLA program and asserted outside it."""

import threading

import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.lookups import returned_checks
from keras_tpu_embed.lookups.returned_checks import Checks
from keras_tpu_embed.lookups.returned_checks import returned_checks as collect


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
    graph = handed.worst.graph
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


def _three_checks(passed, built=None):
    """Three checks; `built` counts the calls of their details."""

    def details():
        if built is not None:
            built.append(1)
        return tf.constant(passed), tf.constant([4, 7, 9], tf.int64)

    worst = 0 if not all(passed) else -1
    return Checks(
        worst=tf.constant(worst, tf.int64),
        details=details,
        messages=("first in range:", "second in range:", "third finite:"),
    )


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_the_assertion_names_the_first_failed_check_and_its_value(traced):
    def check(passed):
        every = _three_checks(passed)
        verdict = returned_checks.verdict([every])
        returned_checks.assert_clear(verdict, every.messages)
        return verdict.clear

    run = tf.function(check) if traced else check
    assert bool(run([True, True, True]))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"second in range:(.|\n)*7"
    ) as raised:
        run([True, False, False])
    assert "third" not in str(raised.value)


def _batch_sizes(sizes):
    """One check that shows several values: `sizes`, all equal."""
    stacked = tf.constant(sizes, tf.int64)
    same = tf.reduce_all(tf.equal(stacked, stacked[0]))
    return Checks(
        worst=tf.cast(tf.logical_not(same), tf.int64) - 1,
        details=lambda: (
            tf.reshape(same, [1]),
            tf.reshape(stacked, [1, len(sizes)]),
        ),
        messages=("batch sizes:",),
        shows=len(sizes),
    )


@pytest.mark.parametrize("where", ["eager", "function", "xla"], ids=lambda w: w)
def test_a_check_shows_its_own_values_beside_checks_of_one(where):
    def program(sizes, passed):
        checks = [_batch_sizes(sizes), _three_checks(passed)]
        folded = returned_checks.verdict(checks)
        return folded, returned_checks.messages_of(checks)

    def check(sizes, passed):
        if where == "xla":
            messages = returned_checks.messages_of(
                [_batch_sizes(sizes), _three_checks(passed)]
            )
            compiled = tf.function(
                lambda: tuple(vars(program(sizes, passed)[0]).values()),
                jit_compile=True,
            )
            folded = returned_checks.Verdict(*compiled())
        else:
            folded, messages = program(sizes, passed)
        returned_checks.assert_clear(folded, messages)
        return folded.clear

    run = tf.function(check) if where == "function" else check
    assert bool(run([2, 2, 2], [True] * 3))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"\[batch sizes:\] \[2 5 2\]"
    ):
        run([2, 5, 2], [True, False, True])
    # The other checks still show one value each, not the widest's count.
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"\[second in range:\] \[7\](\s|$)",
    ):
        run([2, 2, 2], [True, False, True])


def test_checks_of_several_lookups_are_counted_in_order():
    both = [_three_checks([True] * 3), _three_checks([True, True, False])]
    assert len(returned_checks.messages_of(both)) == 6
    verdict = returned_checks.verdict(both)
    assert not bool(verdict.clear)
    assert int(verdict.first) == 5 and int(verdict.evidence) == 9


def test_details_are_built_only_when_a_check_failed():
    built = []
    verdict = returned_checks.verdict([_three_checks([True] * 3, built)])
    assert bool(verdict.clear) and not built


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "xla"])
def test_the_worst_of_checks_per_example(compiled):
    worst = returned_checks.worst_of
    if compiled:
        worst = tf.function(worst, jit_compile=True)
    one = tf.constant([-3, -1], tf.int64)
    assert int(worst([one, tf.constant([-2, 4], tf.int64)])) == 4
    # Checks of other batch sizes (a longer one failing at its end).
    assert int(worst([one, tf.constant([-2, -5, 6], tf.int64)])) == 6
    assert int(worst([one, tf.constant([-2, -5, -6], tf.int64)])) == -1


def test_a_collector_belongs_to_the_trace_that_opened_it():
    """Two exports traced at once on two threads: each lookup hands its
    checks to its own export's collector, never to the other's (a
    module-level stack handed thread B's checks to thread A's export)."""
    opened = threading.Event()
    seen = {}

    def other_export():
        opened.wait()
        seen["other"] = returned_checks.active()
        with collect() as own:
            seen["own"] = returned_checks.active() is own

    thread = threading.Thread(target=other_export)
    thread.start()
    with collect() as first:
        opened.set()
        thread.join()
        assert returned_checks.active() is first
    assert seen == {"other": None, "own": True}
    assert returned_checks.active() is None
