"""The exact tf.tpu.experimental.embedding objects the engine is built from.

These are real TF objects, compared field by field; the mid-level API builds
from them on CPU with the same checkpoint names as our layers.
"""

import keras
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.tables import initialization


def _columns(tmp_path):
    vocabulary = tmp_path / "v.txt"
    vocabulary.write_text("a\nb\nc\n")
    identity = kte.categorical_column_with_identity
    own = [
        kte.embedding_column(identity("user", 100), 8),
        kte.embedding_column(
            kte.categorical_column_with_vocabulary_list(
                "country", ["us", "fr"], num_oov_buckets=2
            ),
            4,
            combiner="sum",
        ),
        kte.embedding_column(
            kte.categorical_column_with_vocabulary_file(
                "word", str(vocabulary), num_oov_buckets=1
            ),
            3,
        ),
        kte.embedding_column(
            kte.weighted_categorical_column(
                kte.categorical_column_with_hash_bucket("tags", 50), "tag_w"
            ),
            6,
            combiner="sqrtn",
            learning_rate_fn=schedule,
        ),
    ]
    shared = kte.shared_embedding_columns(
        [
            identity("item", 1000),
            kte.sequence_categorical_column_with_identity("history", 1000),
        ],
        16,
        max_sequence_lengths=[0, 20],
    )
    return own, shared


def schedule(step):
    return 0.5 / (1.0 + tf.cast(step, tf.float32))


def test_field_by_field(tmp_path):
    own, shared = _columns(tmp_path)
    step = tf.Variable(3, dtype=tf.int64)
    config = kte.EmbeddingConfig(
        optimizer=kte.optimizers.Adagrad(0.1, initial_accumulator_value=0.2),
        clipping_limit=2.0,
    )
    configs = kte.to_tpu_feature_configs(own + shared, config, step=step)
    assert sorted(configs) == sorted(c.name for c in own + shared)
    expected = {
        "user_embedding": ("user", 100, 8, "mean", 0),
        "country_embedding": ("country", 4, 4, "sum", 0),
        "word_embedding": ("word", 4, 3, "mean", 0),
        "tags_weighted_by_tag_w_embedding": (
            "tags_weighted_by_tag_w",
            50,
            6,
            "sqrtn",
            0,
        ),
        "item_shared_embedding": (
            "history_item_shared_embedding",
            1000,
            16,
            "mean",
            0,
        ),
        "history_shared_embedding": (
            "history_item_shared_embedding",
            1000,
            16,
            "mean",
            20,
        ),
    }
    for name, (table, vocab, dim, combiner, length) in expected.items():
        feature = configs[name]
        assert isinstance(feature, tf.tpu.experimental.embedding.FeatureConfig)
        assert feature.name == name
        assert feature.max_sequence_length == length
        assert (
            feature.table.name,
            feature.table.vocabulary_size,
            feature.table.dim,
            feature.table.combiner,
        ) == (table, vocab, dim, combiner)
        optimizer = feature.table.optimizer
        assert isinstance(optimizer, tf.tpu.experimental.embedding.Adagrad)
        assert optimizer.initial_accumulator_value == 0.2
        assert (optimizer.clip_gradient_min, optimizer.clip_gradient_max) == (
            -2.0,
            2.0,
        )
    # Shared columns share one TableConfig object.
    assert (
        configs["item_shared_embedding"].table
        is configs["history_shared_embedding"].table
    )
    # learning_rate_fn becomes a dynamic rate reading the step.
    tags_rate = configs["tags_weighted_by_tag_w_embedding"].table.optimizer
    assert callable(tags_rate.learning_rate)
    assert float(tags_rate.learning_rate()) == pytest.approx(0.5 / 4.0)
    assert configs["user_embedding"].table.optimizer.learning_rate == 0.1
    # The default initializer travels wrapped so that a pod's hosts each
    # get their rows of it (initialization_test.py tests the shards).
    initializer = configs["user_embedding"].table.initializer
    assert isinstance(initializer, initialization.EngineInitializer)
    assert isinstance(
        initializer.initializer, keras.initializers.TruncatedNormal
    )


def test_mid_level_object_builds_with_our_checkpoint_names(tmp_path):
    own, shared = _columns(tmp_path)
    configs = kte.to_tpu_feature_configs(own + shared)
    mid = tf.tpu.experimental.embedding.TPUEmbedding(
        configs, optimizer=kte.optimizers.SGD(0.1).to_tpu()
    )
    mid.build()
    layers = [kte.TPUEmbeddingLayer(own), kte.SharedTPUEmbedding(shared)]
    for layer in layers:
        layer.build()
    ours = tf.train.Checkpoint(
        embedding=kte.engine_checkpoint(layers, steps=False)
    )
    theirs = tf.train.Checkpoint(embedding=mid)
    ours_keys = {
        n for n, _ in tf.train.list_variables(ours.save(str(tmp_path / "o")))
    }
    theirs_keys = {
        n for n, _ in tf.train.list_variables(theirs.save(str(tmp_path / "t")))
    }
    assert ours_keys == theirs_keys


def test_mod_partitioning_and_raw_configs():
    item = kte.embedding_column(
        kte.categorical_column_with_identity("item", 10), 2
    )
    with pytest.raises(ValueError, match="partition_strategy='mod'"):
        kte.to_tpu_feature_configs(
            [item], kte.EmbeddingConfig(partition_strategy="mod")
        )
    raw_table = tf.tpu.experimental.embedding.TableConfig(
        vocabulary_size=5, dim=2, name="raw"
    )
    raw = tf.tpu.experimental.embedding.FeatureConfig(table=raw_table)
    configs = kte.to_tpu_feature_configs(
        [item], kte.EmbeddingConfig(feature_to_config_dict={"raw": raw})
    )
    assert configs["raw"] is raw
    with pytest.raises(ValueError, match="already a column name"):
        kte.to_tpu_feature_configs(
            [item],
            kte.EmbeddingConfig(feature_to_config_dict={"item_embedding": raw}),
        )


def test_frozen_table_is_refused_on_the_engine():
    # TF's TableConfig has no trainable flag: the engine would train it.
    frozen = kte.embedding_column(
        kte.categorical_column_with_identity("user", 10), 4, trainable=False
    )
    with pytest.raises(ValueError, match="'user_embedding'.*trainable=False"):
        kte.to_tpu_feature_configs([frozen])


def test_max_norm_is_refused_on_the_engine():
    clipped = tf.feature_column.embedding_column(
        tf.feature_column.categorical_column_with_identity("user", 10),
        4,
        max_norm=0.8,
    )
    with pytest.raises(ValueError, match="'user_embedding'.*max_norm=0.8"):
        kte.to_tpu_feature_configs([clipped])
