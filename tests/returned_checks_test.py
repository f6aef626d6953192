"""Lookups hand their checks to a caller that compiles them with XLA."""

import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.lookup.returned_checks import returned_checks


def _layer(**column_args):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("a", 5), 2, **column_args
    )
    layer = kte.TPUEmbeddingLayer([column])
    layer({"a": tf.zeros([1, 2], tf.int64)})
    return layer


def _traced(layer, spec):
    with layer.serving_lookups(), returned_checks() as checks:
        tf.function(lambda f: layer(f, training=False)).get_concrete_function(
            {"a": spec}
        )
    return checks


def test_the_fused_lookup_hands_its_flag_and_branches_on_nothing():
    checks = _traced(_layer(), tf.TensorSpec([None, 2], tf.int64))
    assert checks.complete and len(checks.flags) == 1
    # The flag is handed over, not acted on: no If in the layer's graph.
    graph = checks.flags[0].graph
    assert not [op for op in graph.get_operations() if op.type == "If"]


def test_a_lookup_that_keeps_its_checks_leaves_the_collector_incomplete():
    layer = _layer(tensor_core_shape=[None, 2])
    with layer.serving_lookups(lookup_device="tpu_tensor_core"):
        with returned_checks() as checks:
            tf.function(
                lambda f: layer(f, training=False)
            ).get_concrete_function({"a": tf.TensorSpec([None, 2], tf.int64)})
    assert checks.lookups == 1 and not checks.flags
    assert not checks.complete


def test_a_width_checked_per_batch_refuses():
    checks = _traced(_layer(), tf.TensorSpec([None, None], tf.int64))
    assert checks.refused and not checks.complete
