"""One model, trained, saved and restored every way users save models.

Imported by `tests/save_paths_test.py` and by the fresh process it starts,
so that both sides build exactly the same model from code.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_tpu_embed as kte  # noqa: E402

USERS = ["ann", "bob", "cid", "dee", "eve"]
BATCH = 4


def columns(vocabulary_file):
    """Three tables: a vocabulary file, an identity, a shared sequence."""
    user = kte.categorical_column_with_vocabulary_file(
        "user", vocabulary_file, num_oov_buckets=1
    )
    tags = kte.weighted_categorical_column(
        kte.categorical_column_with_identity("tags", 9), "tag_w"
    )
    own = [
        kte.embedding_column(user, 4),
        kte.embedding_column(tags, 3, combiner="sqrtn"),
    ]
    shared = kte.shared_embedding_columns(
        [
            kte.categorical_column_with_identity("item", 12),
            kte.sequence_categorical_column_with_identity("hist", 12),
        ],
        5,
        max_sequence_lengths=[0, 3],
    )
    return own, shared


def build(vocabulary_file, optimizer="adagrad"):
    """A functional model on the preprocessor's outputs, compiled."""
    own, shared = columns(vocabulary_file)
    embedding_optimizer = {
        "adagrad": kte.optimizers.Adagrad(0.2),
        "ftrl": kte.optimizers.FTRL(0.2, l1_regularization_strength=0.01),
        "adam": kte.optimizers.Adam(0.05),
    }[optimizer]
    config = kte.EmbeddingConfig(optimizer=embedding_optimizer)
    pre = kte.FeaturePreprocessor(own + shared)
    inputs = pre.keras_inputs()
    own_out = kte.TPUEmbeddingLayer(
        own, config=config, output="concat", name="own"
    )(inputs)
    shared_out = kte.SharedTPUEmbedding(shared, config=config, name="shared")(
        inputs
    )
    flat = keras.layers.Concatenate()(
        [
            own_out,
            shared_out["item_shared_embedding"],
            keras.layers.Flatten()(shared_out["hist_shared_embedding"]),
        ]
    )
    out = keras.layers.Dense(1, name="head")(flat)
    model = keras.Model(inputs, out)
    # Keras SGD keeps no slots of its own, so every save path (with or
    # without the Keras optimizer's state) resumes identically.
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model, pre


def batch_raw(seed):
    """One batch of raw features (numpy) and labels."""
    rng = np.random.default_rng(seed)
    raw = {
        "user": rng.choice(USERS + ["zed"], size=(BATCH, 1)).astype(object),
        "tags": rng.integers(0, 9, size=(BATCH, 2)),
        "tag_w": rng.uniform(0.5, 2.0, size=(BATCH, 2)).astype("float32"),
        "item": rng.integers(0, 12, size=(BATCH, 1)),
        "hist": rng.integers(-1, 12, size=(BATCH, 4)),
    }
    labels = rng.normal(size=(BATCH, 1)).astype("float32")
    return raw, labels


def batch(pre, seed):
    """One batch of preprocessed features and labels."""
    raw, labels = batch_raw(seed)
    return pre({k: tf.constant(v) for k, v in raw.items()}), labels


def dataset(pre, steps, seed=0):
    """`steps` batches as a `tf.data.Dataset` mapped by the preprocessor."""
    batches = [batch_raw(seed + step) for step in range(steps)]
    raw = {
        key: np.concatenate([b[0][key] for b in batches])
        for key in batches[0][0]
    }
    labels = np.concatenate([b[1] for b in batches])
    return (
        tf.data.Dataset.from_tensor_slices((raw, labels))
        .batch(BATCH)
        .map(lambda x, y: (pre(x), y))
    )


def train(model, pre, steps, seed=0):
    for step in range(steps):
        features, labels = batch(pre, seed + step)
        model.train_on_batch(features, labels)


def state(model):
    """Every table, slot and step of the embedding layers, by name."""
    values = {}
    for layer in model.layers:
        if not isinstance(layer, kte.TPUEmbeddingLayer):
            continue
        values[f"{layer.name}/embedding_step"] = np.asarray(
            layer.embedding_step.numpy()
        )
        for table in layer.local_table_specs:
            values[f"{layer.name}/{table.name}"] = np.asarray(
                layer.table_variable(table.name).numpy()
            )
            for slot, variable in layer.slot_variables(table.name).items():
                values[f"{layer.name}/{table.name}/{slot}"] = np.asarray(
                    variable.numpy()
                )
    values["head/kernel"] = np.asarray(model.get_layer("head").kernel.numpy())
    return values


def predictions(model, pre):
    features, _ = batch(pre, seed=99)
    return np.asarray(model.predict_on_batch(features))
