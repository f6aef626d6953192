"""The parts of `engines/engine_step.py` that run without an engine.

The engine step itself (one named enqueue of every feature per step, its
dequeue, one `apply_gradients` with each table's learning rate and each
layer's gradient multiplier, the step counted once) runs under TF's own
`TPUEmbedding` in `tests/emulated/engine_protocol_test.py`.
"""

import pytest
import tensorflow as tf

from keras_tpu_embed.engines import engine_step
from keras_tpu_embed.engines.v1.v1_engine import V1Engine
from keras_tpu_embed.placement.hardware import EmbeddingHardware


def test_a_host_assertion_outside_a_tpu_step_checks_in_place():
    step = tf.constant(3, tf.int64)

    def message(step):
        return ["bad ids at step", step]

    passed = engine_step._assert_on_host(tf.constant(True), message, step)
    assert bool(passed.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="bad ids at step"):
        engine_step._assert_on_host(tf.constant(False), message, step)


def test_the_dataset_batch_is_known_only_when_there_is_one():
    batches = set()
    # EngineStep is the engines' shared part: an engine holds it.
    engine = V1Engine(EmbeddingHardware.V1, dataset_batches=batches)
    assert engine.dataset_batch() is None
    batches.add(4)  # the set grows as the strategy's datasets are made
    assert engine.dataset_batch() == 4
    batches.add(2)
    assert engine.dataset_batch() is None
