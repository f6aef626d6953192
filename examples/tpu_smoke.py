"""Smoke run for a real TPU VM: `model.fit` on the TPU embedding engine.

    pip install -e '.[tpu]'            # tensorflow-tpu 2.21 on the TPU VM
    python examples/tpu_smoke.py --tpu local --steps 300

It trains the demo's ranking model (`keras_tpu_embed.demo`: a vocabulary
file, a vocabulary list, weighted hashed tags, and an item table shared with
a history sequence) with `model.fit` under `TPUStrategy`, where every table
lives in one `tf.tpu.experimental.embedding.TPUEmbedding` (`TPUEmbeddingV2`
on SparseCore). It reports steps/s, checkpoints the tables with
`kte.engine_checkpoint`, rebuilds the model outside the strategy, restores
them, exports a SavedModel, and checks that the SavedModel served on raw
features agrees with the TPU model's predictions on the same batch.

No machine this package is developed on has a TPU, so this script has not
run on one. `run` is also executed in the tests under a recording stand-in
of the mid-level API (tests/examples_test.py): that checks the flow and the
checkpoint/export hand-off, not the TPU.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import numpy as np

import keras_tpu_embed as kte
from keras_tpu_embed import demo
from keras_tpu_embed import engine
from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf


def connect(tpu: str) -> Any:
    """A `TPUStrategy` on the TPU named `tpu` ("local" on a TPU VM)."""
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def _examples(features: dict, labels: Any) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((features, labels))


def run(
    strategy: Any,
    output_dir: str,
    steps: int = 300,
    global_batch_size: int = 1024,
    num_examples: int = 50_000,
    tolerance: float = 1e-3,
) -> dict[str, Any]:
    """Trains on `strategy`, exports from CPU, compares; returns numbers."""
    keras.utils.set_random_seed(0)
    hardware = engine.embedding_hardware(strategy)
    print(f"Embedding hardware: {hardware.value}")
    features, labels = demo.make_click_log(num_examples)
    own, shared = demo.build_columns(demo.write_user_vocabulary(output_dir))
    preprocessor = kte.FeaturePreprocessor(own + shared)

    def compiled_model() -> keras.Model:
        model = demo.build_model(preprocessor, own, shared)
        model.compile(optimizer="adam", loss="binary_crossentropy")
        return model

    with strategy.scope():
        model = compiled_model()
    train = kte.distribute_dataset(
        strategy,
        _examples(features, labels).repeat(),
        global_batch_size,
        preprocessor=preprocessor,
    )
    warmup = min(10, steps)
    model.fit(train, epochs=1, steps_per_epoch=warmup, verbose=0)
    start = time.perf_counter()
    history = model.fit(train, epochs=1, steps_per_epoch=steps, verbose=2)
    seconds = time.perf_counter() - start
    print(f"{steps / seconds:.1f} steps/s ({global_batch_size} per step)")

    checkpoint = tf.train.Checkpoint(
        embedding=kte.engine_checkpoint(model)
    ).write(os.path.join(output_dir, "tables"))

    # The serving model is the same model built outside the strategy: its
    # tables come from the engine's checkpoint, its dense layers by order.
    serving_model = compiled_model()
    tf.train.Checkpoint(embedding=kte.engine_checkpoint(serving_model)).read(
        checkpoint
    ).assert_existing_objects_matched()
    for source, target in zip(model.layers, serving_model.layers):
        if type(source) is not type(target):
            raise RuntimeError(f"{source.name} != {target.name}")
        if not isinstance(source, kte.TPUEmbeddingLayer):
            target.set_weights(source.get_weights())
    export_dir = os.path.join(output_dir, "serving")
    kte.export_saved_model(serving_model, export_dir, preprocessor=preprocessor)

    sample = {k: v[:global_batch_size] for k, v in features.items()}
    on_tpu = model.predict(
        kte.distribute_dataset(
            strategy,
            _examples(sample, labels[:global_batch_size]),
            global_batch_size,
            preprocessor=preprocessor,
        ),
        verbose=0,
    )[:, 0]
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    raw = {
        k: tf.constant(v, tf.int64 if v.dtype == np.int64 else None)
        for k, v in sample.items()
    }
    served = serve(**raw)["click"].numpy()[:, 0]
    difference = float(np.max(np.abs(served - on_tpu)))
    print(f"Max |served - TPU| over {len(served)} examples: {difference:.2e}")
    if difference > tolerance:
        raise SystemExit(f"Served predictions differ by more than {tolerance}")
    return {
        "hardware": hardware.value,
        "steps_per_second": steps / seconds,
        "final_loss": float(history.history["loss"][-1]),
        "max_difference": difference,
        "export_dir": export_dir,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tpu", default="local")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--global-batch-size", type=int, default=1024)
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()
    strategy = connect(args.tpu)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="kte_tpu_smoke_")
    run(strategy, output_dir, args.steps, args.global_batch_size)


if __name__ == "__main__":
    main()
