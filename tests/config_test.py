"""`EmbeddingConfig`: its checks, defaults and serialization."""

import keras
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing


@keras.saving.register_keras_serializable(package="kte_config_test")
def halving(step):
    return 0.5 ** tf.cast(step, tf.float32)


def test_defaults():
    config = kte.EmbeddingConfig()
    assert config.optimizer == kte.optimizers.SGD(learning_rate=0.01)
    assert config.clipping_limit is None
    assert config.gradient_multiplier_fn is None
    assert config.partition_strategy == "div"
    assert not config.pipeline_execution_with_tensor_core


def test_tf_optimizers_are_converted():
    twin = tf.tpu.experimental.embedding.Adagrad(0.2)
    assert kte.EmbeddingConfig(optimizer=twin).optimizer == (
        kte.optimizers.Adagrad(0.2)
    )


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(clipping_limit=0), ValueError, "`clipping_limit` must be"),
        (dict(clipping_limit=-1.0), ValueError, "`clipping_limit` must be"),
        (dict(clipping_limit=True), ValueError, "`clipping_limit` must be"),
        (dict(clipping_limit="1"), ValueError, "`clipping_limit` must be"),
        (
            dict(gradient_multiplier_fn=2.0),
            ValueError,
            "`gradient_multiplier_fn` must be a function",
        ),
        (
            dict(partition_strategy="row"),
            ValueError,
            r"`partition_strategy`. Expected one of \('div', 'mod'\)",
        ),
        (
            dict(non_finite_updates="skip"),
            ValueError,
            r"`non_finite_updates`. Expected one of \('raise', 'allow'\)",
        ),
        (
            dict(feature_to_config_dict=[]),
            TypeError,
            "`feature_to_config_dict` must be a dict or None",
        ),
        (
            dict(table_to_config_dict="t"),
            TypeError,
            "`table_to_config_dict` must be a dict or None",
        ),
        (
            dict(max_ids_per_example={"tags_embedding": 0}),
            ValueError,
            "`max_ids_per_example` must be a dict of column name to a "
            "positive int",
        ),
        (
            dict(max_ids_per_example={"tags_embedding": 2.5}),
            ValueError,
            "`max_ids_per_example` must be",
        ),
        (
            dict(max_ids_per_example=[("tags_embedding", 3)]),
            ValueError,
            "`max_ids_per_example` must be",
        ),
    ],
)
def test_invalid_arguments(arguments, error, message):
    with pytest.raises(error, match=message):
        kte.EmbeddingConfig(**arguments)


def test_round_trip_keeps_every_field():
    config = kte.EmbeddingConfig(
        optimizer=kte.optimizers.FTRL(0.2, l1_regularization_strength=0.01),
        clipping_limit=2.5,
        pipeline_execution_with_tensor_core=True,
        gradient_multiplier_fn=halving,
        partition_strategy="mod",
        profile_data_directory="/tmp/profiles",
        max_ids_per_example={"tags_embedding": 5},
    )
    rebuilt = testing.assert_config_round_trip(config)
    assert rebuilt == config
    assert rebuilt.gradient_multiplier_fn is halving


def test_raw_tf_configs_cannot_be_serialized():
    config = kte.EmbeddingConfig(table_to_config_dict={"t": object()})
    with pytest.raises(ValueError, match="cannot be serialized"):
        config.get_config()


def test_max_ids_per_example_names_columns_of_the_layer():
    tags = kte.embedding_column(
        kte.categorical_column_with_identity("tags", 10), 4
    )
    config = kte.EmbeddingConfig(max_ids_per_example={"tags": 5})
    with pytest.raises(ValueError) as raised:
        kte.TPUEmbeddingLayer([tags], config=config, name="embed")
    assert str(raised.value) == (
        "TPUEmbeddingLayer 'embed': EmbeddingConfig(max_ids_per_example=...) "
        "names ['tags'], which are not columns of this layer. Its keys are "
        "column names (or raw feature_to_config_dict names): "
        "['tags_embedding']."
    )
    named = kte.EmbeddingConfig(max_ids_per_example={"tags_embedding": 5})
    layer = kte.TPUEmbeddingLayer([tags], config=named)
    assert layer.config.max_ids_per_example == {"tags_embedding": 5}


def test_max_ids_per_example_may_name_a_raw_feature():
    emb = tf.tpu.experimental.embedding
    raw = emb.FeatureConfig(emb.TableConfig(10, 4, name="raw_table"))
    tags = kte.embedding_column(
        kte.categorical_column_with_identity("tags", 10), 4
    )
    config = kte.EmbeddingConfig(
        feature_to_config_dict={"raw": raw},
        max_ids_per_example={"raw": 3},
    )
    layer = kte.TPUEmbeddingLayer([tags], config=config)
    assert layer.config.max_ids_per_example == {"raw": 3}
