"""What `tpu.replicate` does around a step, as the emulation does it,
checked against TF's own `tpu.replicate` where it can be traced on CPU."""

import tensorflow as tf
from tensorflow.python.distribute import values

from keras_tpu_embed._compat import tf_tpu
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


def _tfs_step_inputs(padded):
    """The marks TF's own `tpu.replicate` gives the same inputs, traced
    (never run) on CPU. With `padded`, it is given the maximum shapes
    `TPUExtended._tpu_function_creator` (`tpu_strategy.py`) passes under a
    dynamic batch size: `[None] * rank` for every input."""
    marks = {}

    @tf.function
    def step(dense, sparse):
        def computation(inputs):
            marks["dense"] = _marked(inputs["dense"])
            marks["sparse"] = [
                _marked(inputs["sparse"].indices),
                _marked(inputs["sparse"].values),
            ]
            return []

        replica = [{"dense": dense, "sparse": sparse}]
        maximum_shapes = None
        if padded:
            maximum_shapes = tf.nest.pack_sequence_as(
                replica,
                [
                    tf.TensorShape([None] * value.shape.rank)
                    for value in tf.nest.flatten(replica)
                ],
            )
        tf_tpu.replicate(
            computation, [replica, replica], maximum_shapes=maximum_shapes
        )

    step.get_concrete_function(
        tf.TensorSpec([None, 3]), tf.SparseTensorSpec([None, 2], tf.int32)
    )
    return marks


def test_every_input_is_a_direct_input_without_padding():
    assert _step_inputs(padded=False) == {"dense": True, "sparse": [True] * 2}
    assert _step_inputs(padded=False) == _tfs_step_inputs(padded=False)


def test_padding_takes_the_mark_of_dense_inputs_only():
    assert _step_inputs(padded=True) == {"dense": False, "sparse": [True] * 2}
    assert _step_inputs(padded=True) == _tfs_step_inputs(padded=True)


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
