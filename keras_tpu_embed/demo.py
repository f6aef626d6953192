"""The main job: train, evaluate, export and serve on a synthetic click log.

Run `python -m keras_tpu_embed.demo`. It builds a deterministic click log
with Zipf-distributed users and items (a string user vocabulary file, item
ids, a country vocabulary list, weighted multi-hot tags and a history
sequence sharing the item table), trains a small ranking model with
`TPUEmbeddingLayer` and `SharedTPUEmbedding` on CPU, prints the held-out
AUC, exports a SavedModel and scores raw examples with it after reloading.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

import numpy as np

import keras_tpu_embed as kte
from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf

NUM_USERS = 2_000
NUM_ITEMS = 5_000
NUM_TAGS = 300
COUNTRIES = ("us", "fr", "de", "jp", "br", "in", "ng", "mx")
MAX_TAGS = 5
MAX_HISTORY = 20
HISTORY_LENGTH = 10
LATENT_DIM = 8


def _zipf(rng: np.random.Generator, size: int, n: int, s: float) -> Any:
    """Ids in [0, n) with P(rank k) proportional to 1 / (k + 1)**s."""
    weights = 1.0 / np.arange(1, n + 1) ** s
    return rng.choice(n, size=size, p=weights / weights.sum())


def make_click_log(
    num_examples: int, seed: int = 0
) -> tuple[dict[str, Any], Any]:
    """A deterministic click log: raw features and 0/1 labels.

    A click is drawn with probability sigmoid(user·item affinity + history
    affinity + tag and country effects), so the log carries signal that the
    embeddings can learn.
    """
    rng = np.random.default_rng(seed)
    world = np.random.default_rng(1234)  # the latent world is fixed
    user_vec = world.normal(size=(NUM_USERS, LATENT_DIM))
    item_vec = world.normal(size=(NUM_ITEMS, LATENT_DIM))
    tag_effect = world.normal(scale=0.7, size=NUM_TAGS)
    country_effect = world.normal(scale=0.5, size=len(COUNTRIES))

    users = _zipf(rng, num_examples, NUM_USERS, 1.05)
    items = _zipf(rng, num_examples, NUM_ITEMS, 1.1)
    countries = rng.integers(0, len(COUNTRIES), num_examples)
    tag_counts = rng.integers(1, MAX_TAGS + 1, num_examples)
    tags = np.full((num_examples, MAX_TAGS), "", dtype=object)
    tag_weights = np.zeros((num_examples, MAX_TAGS), np.float32)
    tag_score = np.zeros(num_examples)
    history = np.full((num_examples, MAX_HISTORY), -1, np.int64)
    history_score = np.zeros(num_examples)
    for row in range(num_examples):
        chosen = _zipf(rng, tag_counts[row], NUM_TAGS, 1.0)
        weights = rng.uniform(0.5, 2.0, tag_counts[row])
        tags[row, : tag_counts[row]] = [f"tag{t}" for t in chosen]
        tag_weights[row, : tag_counts[row]] = weights
        tag_score[row] = np.average(tag_effect[chosen], weights=weights)
        length = rng.integers(1, MAX_HISTORY + 1)
        past = _zipf(rng, int(length), NUM_ITEMS, 1.1)
        history[row, :length] = past
        recent = past[:HISTORY_LENGTH]
        history_score[row] = item_vec[recent].mean(0) @ item_vec[items[row]]
    affinity = np.einsum("ij,ij->i", user_vec[users], item_vec[items])
    logits = (
        0.9 * affinity
        + 0.3 * history_score
        + tag_score
        + country_effect[countries]
        - 0.5
    )
    labels = rng.random(num_examples) < 1.0 / (1.0 + np.exp(-logits))
    features = {
        "user_id": np.array([f"user{u}" for u in users], dtype=object),
        "item_id": items.astype(np.int64),
        "country": np.array([COUNTRIES[c] for c in countries], dtype=object),
        "tags": tags.astype(bytes),
        "tag_weights": tag_weights,
        "history": history,
    }
    return features, labels.astype(np.float32)[:, None]


def write_user_vocabulary(directory: str) -> str:
    path = os.path.join(directory, "users.txt")
    with open(path, "w") as handle:
        handle.write("\n".join(f"user{u}" for u in range(NUM_USERS)) + "\n")
    return path


def build_columns(vocabulary_file: str) -> tuple[list[Any], list[Any]]:
    """The feature columns of the demo: own tables and one shared table."""
    user = kte.categorical_column_with_vocabulary_file(
        "user_id", vocabulary_file, num_oov_buckets=1
    )
    country = kte.categorical_column_with_vocabulary_list(
        "country", list(COUNTRIES), num_oov_buckets=1
    )
    tags = kte.weighted_categorical_column(
        kte.categorical_column_with_hash_bucket("tags", NUM_TAGS * 4),
        "tag_weights",
    )
    item = kte.categorical_column_with_identity("item_id", NUM_ITEMS)
    history = kte.sequence_categorical_column_with_identity(
        "history", NUM_ITEMS
    )
    # `tensor_core_shape`: ids per example where a TPU without an embedding
    # engine (v5e) looks the tables up on its tensor cores; other devices
    # ignore it.
    own = [
        kte.embedding_column(user, 16, tensor_core_shape=[None, 1]),
        kte.embedding_column(country, 4, tensor_core_shape=[None, 1]),
        kte.embedding_column(
            tags, 8, combiner="sqrtn", tensor_core_shape=[None, MAX_TAGS]
        ),
    ]
    shared = kte.shared_embedding_columns(
        [item, history],
        16,
        max_sequence_lengths=[0, HISTORY_LENGTH],
        tensor_core_shape=[None, 1],
    )
    return own, shared


def build_model(
    preprocessor: kte.FeaturePreprocessor,
    own: list[Any],
    shared: list[Any],
    inputs: dict[str, Any] | None = None,
) -> keras.Model:
    """The ranker: both embedding layers, then an MLP to a click score.

    `inputs` defaults to the preprocessor's `keras_inputs()`.
    """
    config = kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1))
    if inputs is None:
        inputs = preprocessor.keras_inputs()
    own_embeddings = kte.TPUEmbeddingLayer(
        own, config=config, output="concat", name="embeddings"
    )(inputs)
    shared_embeddings = kte.SharedTPUEmbedding(
        shared, config=config, name="item_embeddings"
    )(inputs)
    item = shared_embeddings["item_id_shared_embedding"]
    history = keras.layers.GlobalAveragePooling1D()(
        shared_embeddings["history_shared_embedding"]
    )
    x = keras.layers.Concatenate()(
        [
            own_embeddings,
            item,
            history,
            keras.layers.Multiply()([item, history]),
        ]
    )
    x = keras.layers.Dense(64, activation="relu")(x)
    output = keras.layers.Dense(1, activation="sigmoid", name="click")(x)
    return keras.Model(inputs, output, name="ranker")


def batched_dataset(
    preprocessor: kte.FeaturePreprocessor,
    features: dict[str, Any],
    labels: Any,
    batch_size: int,
    shuffle: bool,
) -> tf.data.Dataset:
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    if shuffle:
        dataset = dataset.shuffle(len(labels), seed=0)
    return (
        dataset.batch(batch_size)
        .map(lambda x, y: (preprocessor(x), y))
        .prefetch(tf.data.AUTOTUNE)
    )


def run(
    output_dir: str,
    num_examples: int = 60_000,
    epochs: int = 3,
    batch_size: int = 256,
) -> dict[str, Any]:
    """Trains, evaluates, exports and serves; returns what it measured."""
    keras.utils.set_random_seed(0)
    features, labels = make_click_log(num_examples)
    split = int(0.8 * num_examples)
    train = ({k: v[:split] for k, v in features.items()}, labels[:split])
    held_out = ({k: v[split:] for k, v in features.items()}, labels[split:])

    vocabulary = write_user_vocabulary(output_dir)
    own, shared = build_columns(vocabulary)
    preprocessor = kte.FeaturePreprocessor(own + shared)
    model = build_model(preprocessor, own, shared)
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc")],
    )
    model.fit(
        batched_dataset(preprocessor, *train, batch_size, shuffle=True),
        epochs=epochs,
        verbose=2 if os.environ.get("CI") else 1,
        # tf.data shuffles; Keras' default shuffle=True would only warn.
        shuffle=False,
    )
    evaluation = model.evaluate(
        batched_dataset(preprocessor, *held_out, 1024, shuffle=False),
        return_dict=True,
        verbose=0,
    )
    print(f"Held-out AUC: {evaluation['auc']:.4f}")

    export_dir = os.path.join(output_dir, "serving")
    # Prints the signatures and the output key ('click').
    kte.export_saved_model(model, export_dir, preprocessor=preprocessor)

    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    sample = {k: v[:5] for k, v in held_out[0].items()}
    raw = {
        k: tf.constant(v, tf.int64 if v.dtype == np.int64 else None)
        for k, v in sample.items()
    }
    served = serve(**raw)["click"].numpy()[:, 0]
    in_process = model.predict(preprocessor(raw), verbose=0)[:, 0]
    for row in range(len(served)):
        print(
            f"  user={sample['user_id'][row]} item={sample['item_id'][row]} "
            f"country={sample['country'][row]} -> p(click)={served[row]:.4f}"
        )
    return {
        "auc": float(evaluation["auc"]),
        "served": served,
        "in_process": in_process,
        "export_dir": export_dir,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--examples", type=int, default=80_000)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="kte_demo_")
    os.makedirs(output_dir, exist_ok=True)
    result = run(output_dir, args.examples, args.epochs)
    gap = float(np.max(np.abs(result["served"] - result["in_process"])))
    print(f"Max |served - in-process| on the sample: {gap:.2e}")


if __name__ == "__main__":
    main()
