"""What `tpu.replicate` does around a step, as the emulation does it."""

import tensorflow as tf
from tensorflow.python.distribute import values

from keras_tpu_embed._compat import tf_tpu_util
from keras_tpu_embed.testing import emulated_replication as replication


def _marked(value):
    try:
        return value.op.get_attr("_tpu_input_identity")
    except ValueError:
        return False


def _step_inputs(padded):
    marks = {}

    @tf.function
    def step(dense, sparse):
        inputs = replication.as_step_inputs(
            {"dense": dense, "sparse": sparse}, padded
        )
        marks["dense"] = _marked(inputs["dense"])
        marks["sparse"] = [
            _marked(inputs["sparse"].indices),
            _marked(inputs["sparse"].values),
        ]

    step(tf.ones([2, 3]), tf.sparse.from_dense([[1, 0], [0, 2]]))
    return marks


def test_every_input_is_a_direct_input_without_padding():
    assert _step_inputs(padded=False) == {"dense": True, "sparse": [True] * 2}


def test_padding_takes_the_mark_of_dense_inputs_only():
    assert _step_inputs(padded=True) == {"dense": False, "sparse": [True] * 2}


def test_replicate_context_is_the_tpu_context_of_the_graph():
    seen = {}

    @tf.function
    def step():
        with replication.replicate_context(2):
            seen["inside"] = tf_tpu_util.enclosing_tpu_context()
        seen["after"] = tf_tpu_util.enclosing_tpu_context()

    step()
    assert isinstance(seen["inside"], replication.ReplicateContext)
    assert seen["after"] is None


def _pads(first, second, options):
    decided = {}

    @tf.function
    def step():
        inputs = (values.PerReplica((first, second)),)
        decided["padded"] = replication.pads_inputs(2, inputs, {}, options)

    step()
    return decided["padded"]


def test_dynamic_padding_pads_replicas_of_different_batch_sizes():
    options = tf.distribute.RunOptions()
    assert _pads(tf.ones([2, 3]), tf.ones([2, 3]), options) is False
    assert _pads(tf.ones([1, 3]), tf.ones([2, 3]), options) is True


def test_no_padding_without_a_dynamic_batch_size():
    options = tf.distribute.RunOptions(
        experimental_enable_dynamic_batch_size=False
    )
    assert _pads(tf.ones([1, 3]), tf.ones([2, 3]), options) is False
