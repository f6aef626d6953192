"""The recording STAND-IN's shapes and checks are TensorFlow's own.

`tests/engine_stand_in.py` replaces `TPUEmbedding` in the engine tests, so
what it returns must be what TF returns on a TPU. Its output shapes come
from TF's shape logic (`TPUEmbedding._get_input_shapes`,
`_get_and_update_output_shapes_from_input`, `_check_output_shapes` in
`tpu_embedding_v2.py`, run on a real `TPUEmbedding` built on CPU); these
tests pin the cases that matter to the layers, as `TPUEmbedding.dequeue`
documents them: `(*output_shape, dim)`, with the output shape read from the
input shape.
"""

import pytest
import tensorflow as tf

from tests.engine_stand_in import RecordingTPUEmbedding
from tests.engine_stand_in import StandInTPU

E = tf.tpu.experimental.embedding
B, DIM, MAXLEN = 4, 3, 5


def _config(max_sequence_length=0):
    table = E.TableConfig(vocabulary_size=10, dim=DIM, name="t")
    return {
        "f": E.FeatureConfig(
            table, max_sequence_length=max_sequence_length, name="f"
        )
    }


def _dequeued(config, spec, weight_spec=None, name="step"):
    """Traces one enqueue + dequeue of the stand-in; the activations."""
    stand_in = RecordingTPUEmbedding(config, E.SGD(0.1))
    signature = [{"f": spec}]
    if weight_spec is not None:
        signature.append({"f": weight_spec})

    @tf.function(input_signature=signature)
    def step(features, weights=None):
        stand_in.enqueue(features, weights, name=name)
        return stand_in.dequeue(name=name)

    return stand_in, step


@pytest.mark.parametrize(
    "spec, max_sequence_length, expected",
    [
        # Dense [batch, 1] ids: one id per example, no middle axis.
        (tf.TensorSpec([B, 1], tf.int64), 0, [B, DIM]),
        (tf.TensorSpec([B], tf.int64), 0, [B, DIM]),
        (tf.SparseTensorSpec([B, None], tf.int64), 0, [B, DIM]),
        (tf.RaggedTensorSpec([B, None], tf.int64), 0, [B, DIM]),
        # Sequence features: the max sequence length is inserted.
        (tf.SparseTensorSpec([B, None], tf.int64), MAXLEN, [B, MAXLEN, DIM]),
        (tf.RaggedTensorSpec([B, None], tf.int64), MAXLEN, [B, MAXLEN, DIM]),
    ],
)
def test_dequeue_shapes_follow_tensorflow(
    monkeypatch, spec, max_sequence_length, expected
):
    tpu = StandInTPU(monkeypatch)
    with tpu.strategy.scope():
        _, step = _dequeued(_config(max_sequence_length), spec)
        activations = step.get_concrete_function().structured_outputs
    assert activations["f"].shape.as_list() == expected


def test_an_output_shape_in_the_feature_config_wins(monkeypatch):
    tpu = StandInTPU(monkeypatch)
    config = _config()
    config["f"].output_shape = tf.TensorShape([B])
    with tpu.strategy.scope():
        _, step = _dequeued(config, tf.TensorSpec([B, 1], tf.int64))
        activations = step.get_concrete_function().structured_outputs
    assert activations["f"].shape.as_list() == [B, DIM]


def test_a_second_batch_size_is_tensorflows_inconsistent_shape(monkeypatch):
    tpu = StandInTPU(monkeypatch)
    with tpu.strategy.scope():
        stand_in, step = _dequeued(_config(), tf.TensorSpec([B, 1], tf.int64))
        step.get_concrete_function()

        @tf.function(input_signature=[{"f": tf.TensorSpec([2, 1], tf.int64)}])
        def other_batch(features):
            stand_in.enqueue(features, name="other")
            return stand_in.dequeue(name="other")

        with pytest.raises(ValueError, match="Inconsistent shape"):
            other_batch.get_concrete_function()


def test_an_unknown_batch_size_cannot_build_the_engine(monkeypatch):
    tpu = StandInTPU(monkeypatch)
    with tpu.strategy.scope():
        _, step = _dequeued(_config(), tf.TensorSpec([None, 1], tf.int64))
        with pytest.raises(ValueError, match="not fully defined"):
            step.get_concrete_function()
