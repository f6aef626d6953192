"""What `EmbeddingConfig` adds to the optimizer's step: `update_rules`."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.backends import embedding_step as update_rules
from keras_tpu_embed.tables.table_specs import group_into_tables
from tests import testing

DIM = testing.DIM


@pytest.mark.parametrize("optimizer_name", ["sgd", "adagrad"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_updates_match_numpy_engine_rules(optimizer_name, combiner):
    lr_fn = lambda step: 0.2 / (1.0 + tf.cast(step, tf.float32))  # noqa: E731
    optimizer = (
        kte.optimizers.SGD(0.5)
        if optimizer_name == "sgd"
        else kte.optimizers.Adagrad(0.5, initial_accumulator_value=0.2)
    )
    config = kte.EmbeddingConfig(
        optimizer=optimizer,
        clipping_limit=0.6,
        gradient_multiplier_fn=lambda step: (
            1.0 + 0.5 * tf.cast(step, tf.float32)
        ),
    )
    column = testing.identity_column(combiner=combiner, learning_rate_fn=lr_fn)
    layer = kte.TPUEmbeddingLayer([column], config=config)
    layer.build()
    initial = layer.table_variable("ids").numpy()
    upstream = np.random.default_rng(0).normal(size=(3, DIM))
    testing.train_steps(
        layer, testing.BATCHES, tf.constant(upstream, tf.float32)
    )
    # The column's rate, the multiplier, then the clipping limit.
    table, slots = testing.numpy_training(
        optimizer,
        initial,
        testing.BATCHES,
        upstream,
        learning_rate=lambda step: 0.2 / (1.0 + step),
        multiplier=lambda step: 1.0 + 0.5 * step,
        clipping_limit=0.6,
        combiner=combiner,
    )
    np.testing.assert_allclose(
        layer.table_variable("ids").numpy(), table, atol=1e-6
    )
    assert int(layer.embedding_step.numpy()) == len(testing.BATCHES)
    if optimizer_name == "adagrad":
        np.testing.assert_allclose(
            layer.slot_variables("ids")["accumulators"].numpy(),
            slots["accumulators"],
            atol=1e-6,
        )


def _table(learning_rate_fn=None):
    column = testing.identity_column(learning_rate_fn=learning_rate_fn)
    return group_into_tables([column])[0]


def test_column_learning_rate_fn_overrides_the_optimizers():
    config = kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.5))
    assert update_rules.learning_rate(_table(), config, 3) == 0.5
    by_step = _table(lambda step: 0.1 * step)
    assert update_rules.learning_rate(by_step, config, 3) == pytest.approx(0.3)
    dynamic = kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(lambda: 0.25))
    assert update_rules.learning_rate(_table(), dynamic, 3) == 0.25


def test_gradient_multiplier_comes_before_the_clipping_limit():
    config = kte.EmbeddingConfig(
        clipping_limit=1.0, gradient_multiplier_fn=lambda step: 2.0 + step
    )
    gradient = tf.constant([[0.4, -0.3, 1.5, -0.6]])
    # Clipping first would give [0.8, -0.6, 2.0, -1.2].
    np.testing.assert_allclose(
        update_rules.scale_and_clip(gradient, config, 0),
        [[0.8, -0.6, 1.0, -1.0]],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        update_rules.scale_gradient(gradient, config, 1), gradient * 3.0
    )


def test_no_multiplier_and_no_limit_leave_the_gradient():
    config = kte.EmbeddingConfig()
    gradient = tf.constant([[5.0, -7.0]])
    assert update_rules.scale_gradient(gradient, config, 0) is gradient
    np.testing.assert_array_equal(
        update_rules.scale_and_clip(gradient, config, 0), gradient
    )


def test_engine_optimizer_is_the_configs_when_nothing_is_added():
    config = kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.3))
    assert update_rules.engine_optimizer(_table(), config, 0) is (
        config.optimizer
    )


@pytest.mark.parametrize(
    "clipvalue, want",
    [
        (None, (-0.8, 0.8)),
        ((-0.5, 1.0), (-0.5, 0.8)),
        ((None, 0.3), (-0.8, 0.3)),
        ((-2.0, None), (-0.8, 0.8)),
    ],
)
def test_engine_optimizer_intersects_clipvalue_with_the_limit(clipvalue, want):
    optimizer = kte.optimizers.Adagrad(0.3, clipvalue=clipvalue)
    config = kte.EmbeddingConfig(optimizer=optimizer, clipping_limit=0.8)
    engine = update_rules.engine_optimizer(_table(), config, 0)
    assert engine.gradient_clip_bounds == want
    assert dataclasses.replace(engine, clipvalue=clipvalue) == optimizer


def test_engine_optimizer_turns_learning_rate_fn_into_a_dynamic_rate():
    config = kte.EmbeddingConfig(optimizer=kte.optimizers.Adam(0.01))
    step = tf.Variable(3, dtype=tf.int64)
    table = _table(lambda s: 0.1 * tf.cast(s, tf.float32))
    engine = update_rules.engine_optimizer(table, config, step)
    assert callable(engine.learning_rate)
    assert float(engine.current_learning_rate()) == pytest.approx(0.3)
    step.assign(5)
    assert float(engine.current_learning_rate()) == pytest.approx(0.5)
    assert dataclasses.replace(engine, learning_rate=0.01) == config.optimizer
