"""The models and data of the TPU embedding engine tests.

Two layers sharing one engine (`build_model`: a plain, a weighted, a
shared and a sequence column), a one-table model, and their examples, for
the tests of `engines/v1/v1_engine.py` and of the engine under TF's own
`TPUEmbedding` (`tests/emulated/engine_protocol_test.py`,
`engine_layers_test.py`, `sparsecore_refusals_test.py`).
"""

import keras
import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte

N, BATCH = 32, 8
FEATURES = [
    "hist_shared_embedding",
    "item_shared_embedding",
    "tags_weighted_by_tag_w_embedding",
    "user_embedding",
]


def engine_columns():
    user = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4, combiner="sum"
    )
    tags = kte.embedding_column(
        kte.weighted_categorical_column(
            kte.categorical_column_with_identity("tags", 30), "tag_w"
        ),
        3,
        combiner="sqrtn",
    )
    shared = kte.shared_embedding_columns(
        [
            kte.categorical_column_with_identity("item", 50),
            kte.sequence_categorical_column_with_identity("hist", 50),
        ],
        4,
        max_sequence_lengths=[0, 3],
    )
    return [user, tags], shared


def engine_inputs():
    return {
        "user": keras.Input((1,), dtype="int64", name="user"),
        "tags": keras.Input((None,), dtype="int64", sparse=True, name="tags"),
        "tag_w": keras.Input(
            (None,), dtype="float32", sparse=True, name="tag_w"
        ),
        "item": keras.Input((None,), dtype="int64", sparse=True, name="item"),
        "hist": keras.Input((None,), dtype="int64", sparse=True, name="hist"),
    }


def build_model(config=None, shared_config=None):
    columns, shared = engine_columns()
    config = config or kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.5))
    inputs = engine_inputs()
    a = kte.TPUEmbeddingLayer(columns, config=config, name="embed")(inputs)
    b = kte.SharedTPUEmbedding(
        shared, config=shared_config or config, name="shared"
    )(inputs)
    x = keras.layers.Concatenate()(
        [
            a["user_embedding"],
            a["tags_weighted_by_tag_w_embedding"],
            b["item_shared_embedding"],
            keras.ops.mean(b["hist_shared_embedding"], axis=1),
        ]
    )
    out = keras.layers.Dense(
        1, activation="sigmoid", name="head", kernel_initializer="ones"
    )(x)
    model = keras.Model(inputs, out)
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    return model


def _sparse(rng, vocab, width):
    indices, values = [], []
    for row in range(N):
        for position in range(rng.integers(1, width + 1)):
            indices.append([row, position])
            values.append(rng.integers(0, vocab))
    return tf.SparseTensor(
        np.array(indices, np.int64), np.array(values, np.int64), [N, width]
    )


def examples(seed=0):
    rng = np.random.default_rng(seed)
    tags = _sparse(rng, 30, 4)
    weights = rng.uniform(0.5, 2.0, tags.values.shape[0]).astype(np.float32)
    features = {
        "user": rng.integers(0, 20, (N, 1)).astype(np.int64),
        "tags": tags,
        "tag_w": tf.SparseTensor(tags.indices, weights, tags.dense_shape),
        "item": _sparse(rng, 50, 1),
        "hist": _sparse(rng, 50, 5),
    }
    labels = rng.integers(0, 2, (N, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels))


def single_table_model(column, config):
    inputs = {"user": keras.Input((1,), dtype="int64", name="user")}
    for key in config.feature_to_config_dict or {}:
        inputs[key] = keras.Input((1,), dtype="int64", name=key)
    outputs = kte.TPUEmbeddingLayer([column], config=config, name="embed")(
        inputs
    )
    x = keras.layers.Concatenate()([outputs[k] for k in sorted(outputs)])
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer="sgd", loss="mse")
    return model


def user_examples(extra=()):
    ids = np.arange(16, dtype=np.int64)[:, None] % 20
    features = {"user": ids, **{key: ids % 10 for key in extra}}
    return tf.data.Dataset.from_tensor_slices((features, np.ones((16, 1))))
