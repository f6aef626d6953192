"""Issue 23's engine findings, each on the path a user takes first.

Finding 1: the first `fit` step crashed under `TPUStrategy` (and
`MirroredStrategy`): `embedding_step` is only-first-replica, and its
`assign_add` in a replica returns a plain tensor with no `read_value`.

protobuf: TF 2.21 writes the bool `low_dimensional_packing_status` into an
enum field of the engine's proto, which protobuf refuses, so the engine
(`TPUEmbedding.build`, at the first enqueue) could not be built with any
optimizer.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

ENGINE_OPTIMIZERS = {
    "sgd": kte.optimizers.SGD(0.1),
    "adagrad": kte.optimizers.Adagrad(0.1),
    "adagrad_momentum": kte.optimizers.AdagradMomentum(0.1, momentum=0.5),
    "adam": kte.optimizers.Adam(0.01),
    "ftrl": kte.optimizers.FTRL(0.1),
}
PROTO_RULES = {
    "sgd": "stochastic_gradient_descent",
    "adagrad": "adagrad",
    "adagrad_momentum": "adagrad_momentum",
    "adam": "adam",
    "ftrl": "ftrl",
}


def _one_step(model, strategy):
    model.fit(models.batches(strategy), steps_per_epoch=1, verbose=0)


def test_first_fit_step_on_two_replicas_counts_the_step_once():
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, "sgd")
        _one_step(model, strategy)
        assert int(model.get_layer("embed").embedding_step.numpy()) == 1
        assert int(model.optimizer.iterations.numpy()) == 1


@pytest.mark.parametrize("name", sorted(ENGINE_OPTIMIZERS))
def test_engine_builds_with_every_optimizer(name):
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        keras.utils.set_random_seed(models.SEED)
        with strategy.scope():
            model = models.build(ENGINE_OPTIMIZERS[name])
        _one_step(model, strategy)
        mid_level = model.get_layer("embed").engine.mid_level
        assert mid_level._built
        table = mid_level._config_proto.table_descriptor[0]
        rule = table.optimization_parameters.WhichOneof("parameters")
        assert rule == PROTO_RULES[name]
        assert int(model.get_layer("embed").embedding_step.numpy()) == 1


def test_engine_builds_with_a_users_raw_tf_optimizer():
    """A raw `FeatureConfig` whose table has its own TF optimizer, and
    the config's `pipeline_execution_with_tensor_core`, pass through to
    TF's engine unchanged."""
    raw = tf.tpu.experimental.embedding.FeatureConfig(
        table=tf.tpu.experimental.embedding.TableConfig(
            vocabulary_size=10,
            dim=2,
            name="their_table",
            optimizer=tf.tpu.experimental.embedding.Adagrad(0.1),
        ),
        name="their_feature",
    )
    config = kte.EmbeddingConfig(
        feature_to_config_dict={"their_feature": raw},
        pipeline_execution_with_tensor_core=True,
    )
    ids = np.arange(16, dtype=np.int64)[:, None]
    data = tf.data.Dataset.from_tensor_slices(
        ({"user": ids % 20, "their_feature": ids % 10}, np.ones((16, 1)))
    )
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
            inputs = {
                key: keras.Input((1,), dtype="int64", name=key)
                for key in ("user", "their_feature")
            }
            user = kte.embedding_column(
                kte.categorical_column_with_identity("user", 20), 4
            )
            outputs = kte.TPUEmbeddingLayer(
                [user], config=config, name="embed"
            )(inputs)
            joined = keras.layers.Concatenate()(
                [outputs[key] for key in sorted(outputs)]
            )
            model = keras.Model(inputs, keras.layers.Dense(1)(joined))
            model.compile(optimizer="sgd", loss="mse")
        layer = model.get_layer("embed")
        assert layer.compute_output_spec({})["their_feature"].shape == (None, 2)
        model.fit(kte.distribute_dataset(strategy, data, 8), verbose=0)
        mid_level = layer.engine.mid_level
        # TF's enqueue takes exactly its config's features: the step fed
        # the user's feature next to the column's.
        assert sorted(mid_level._feature_config) == [
            "their_feature",
            "user_embedding",
        ]
        assert mid_level._feature_config["their_feature"] is raw
        assert mid_level._pipeline_execution_with_tensor_core is True
        assert mid_level._config_proto.pipeline_execution_with_tensor_core
        assert int(layer.embedding_step.numpy()) == 2
        rules = {
            table.name: table.optimization_parameters.WhichOneof("parameters")
            for table in mid_level._config_proto.table_descriptor
        }
        assert rules == {
            "their_table": "adagrad",
            "user": "stochastic_gradient_descent",
        }


def test_dense_ids_wider_than_one_are_refused_with_the_fix():
    """TF's enqueue takes dense ids as one id per example only."""
    user = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4
    )
    ids = np.arange(16, dtype=np.int64).reshape(8, 2) % 20
    data = tf.data.Dataset.from_tensor_slices(({"user": ids}, np.ones((8, 1))))
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
            inputs = {"user": keras.Input((2,), dtype="int64", name="user")}
            outputs = kte.TPUEmbeddingLayer([user], name="embed")(inputs)
            model = keras.Model(
                inputs, keras.layers.Dense(1)(outputs["user_embedding"])
            )
            model.compile(optimizer="sgd", loss="mse")
        with pytest.raises(ValueError) as error:
            model.fit(kte.distribute_dataset(strategy, data, 4), verbose=0)
    message = str(error.value)
    assert "Feature 'user_embedding' reaches the TPU embedding engine" in (
        message
    )
    assert "(2, 2)" in message
    assert "kte.FeaturePreprocessor" in message
