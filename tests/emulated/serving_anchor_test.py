"""The emulated V1 engine's lookups against TensorFlow's own CPU code.

`tf.tpu.experimental.embedding.TPUEmbeddingForServing` is TF's lookup for
the same feature configs on CPU (`serving_embedding_lookup`: TF's combiners,
weights and sparse ids). The activations the emulated chip dequeues in a
`predict` under `emulated_tpu` must equal it, on the engine's own tables,
for a weighted `sum`, an `sqrtn` and a `mean` column of several ids per
example: an anchor that is TF's code, not our one-device path.
"""

import keras
import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

ROWS = 16
VOCABULARY = {"tags": 20, "words": 30, "items": 25}


def _columns():
    identity = kte.categorical_column_with_identity
    return [
        kte.embedding_column(
            kte.weighted_categorical_column(
                identity("tags", VOCABULARY["tags"]), "tag_weights"
            ),
            4,
            combiner="sum",
        ),
        kte.embedding_column(
            identity("words", VOCABULARY["words"]), 3, combiner="sqrtn"
        ),
        kte.embedding_column(
            identity("items", VOCABULARY["items"]), 5, combiner="mean"
        ),
    ]


def _features():
    rng = np.random.default_rng(3)
    features = {}
    lengths = rng.integers(1, 4, ROWS)
    for key, size in VOCABULARY.items():
        ids = tf.RaggedTensor.from_row_lengths(
            rng.integers(0, size, lengths.sum()), lengths
        )
        features[key] = ids.to_sparse()
        if key == "tags":
            weights = tf.RaggedTensor.from_row_lengths(
                rng.uniform(0.5, 2.0, lengths.sum()).astype(np.float32),
                lengths,
            )
            features["tag_weights"] = weights.to_sparse()
    return features


def _model(columns):
    inputs = {
        key: keras.Input(
            (None,),
            dtype="float32" if key == "tag_weights" else "int64",
            name=key,
            sparse=True,
        )
        for key in (*VOCABULARY, "tag_weights")
    }
    config = kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.1))
    layer = kte.TPUEmbeddingLayer(columns, config=config, name="embed")
    return keras.Model(inputs, layer(inputs))


def test_v1_lookups_equal_tfs_serving_lookup():
    columns = _columns()
    features = _features()
    with emulated_tpu(2) as strategy:
        keras.utils.set_random_seed(models.SEED)
        with strategy.scope():
            model = _model(columns)
        assert model.get_layer("embed").engine is not None
        dataset = tf.data.Dataset.from_tensor_slices(features)
        activations = model.predict(
            kte.distribute_dataset(strategy, dataset, models.GLOBAL_BATCH),
            verbose=0,
        )
        tables = models.engine_tables(model)
    configs = kte.to_tpu_feature_configs(columns)
    serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
        configs, optimizer=tf.tpu.experimental.embedding.SGD(0.1)
    )
    serving.build()
    for table, variable in serving.embedding_tables.items():
        variable.assign(tables[table.name])
    ids = {
        name: features[config.name.removesuffix("_embedding").split("_")[0]]
        for name, config in configs.items()
    }
    weights = {
        name: features["tag_weights"] if name.startswith("tags") else None
        for name in configs
    }
    want = serving(ids, weights)
    assert sorted(activations) == sorted(want)
    for name, value in want.items():
        # Not all zero: the tables are random and every example has an id.
        assert np.abs(value.numpy()).min(axis=1).max() > 0
        np.testing.assert_allclose(
            activations[name], value.numpy(), atol=1e-6, rtol=0, err_msg=name
        )
