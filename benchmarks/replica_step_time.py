"""Step time of `model.fit` on one device and under MirroredStrategy.

    python benchmarks/replica_step_time.py [--replicas 1|2] [--steps 30]

The replicas are logical CPU devices: on a machine without GPUs they share
the same cores, so the numbers say what combining the replicas' row
gradients costs, never what a second GPU would gain. Prints one JSON line per
lookup path: the median time of a step after warm-up, in milliseconds.
"""

import argparse
import json
import time

import numpy as np
import tensorflow as tf

VOCAB, DIM, WIDTH, BATCH = 100_000, 32, 8, 1024
PATHS = ("host", "tensor_core")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas
    )
    # After the logical devices are set: Keras would start the runtime
    # with one CPU device.
    import keras

    import keras_tpu_embed as kte

    devices = [f"/cpu:{i}" for i in range(args.replicas)]
    rng = np.random.default_rng(0)
    ids = rng.integers(-1, VOCAB, size=(BATCH * args.steps, WIDTH))
    labels = rng.normal(size=(len(ids), 1)).astype(np.float32)
    # One strategy for both models: two MirroredStrategy objects over the
    # same devices in one process reuse each other's collective keys.
    strategy = (
        tf.distribute.MirroredStrategy(devices)
        if args.replicas > 1
        else tf.distribute.OneDeviceStrategy(devices[0])
    )
    for path in PATHS:
        core = path == "tensor_core"
        with strategy.scope():
            column = kte.embedding_column(
                kte.categorical_column_with_identity("ids", VOCAB),
                DIM,
                embedding_lookup_device="tpu_tensor_core" if core else None,
                tensor_core_shape=[None, WIDTH] if core else None,
            )
            layer = kte.TPUEmbeddingLayer(
                [column],
                config=kte.EmbeddingConfig(
                    optimizer=kte.optimizers.Adagrad(0.05)
                ),
                output="concat",
            )
            inputs = {"ids": keras.Input((WIDTH,), dtype="int64", name="ids")}
            outputs = keras.layers.Dense(1)(layer(inputs))
            model = keras.Model(inputs, outputs)
            model.compile(optimizer="adam", loss="mse")
        data = tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels))
        data = data.batch(BATCH).prefetch(2)

        class Timer(keras.callbacks.Callback):
            def __init__(self) -> None:
                super().__init__()
                self.times: list[float] = []

            def on_train_batch_begin(self, batch, logs=None):  # type: ignore[no-untyped-def]
                self.start = time.perf_counter()

            def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
                self.times.append(time.perf_counter() - self.start)

        timer = Timer()
        model.fit(data, epochs=1, verbose=0, callbacks=[timer])
        steady = timer.times[5:]  # after tracing and warm-up
        print(
            json.dumps(
                {
                    "path": path,
                    "replicas": args.replicas,
                    "global_batch": BATCH,
                    "median_step_ms": round(1000 * float(np.median(steady)), 1),
                }
            )
        )


if __name__ == "__main__":
    main()
