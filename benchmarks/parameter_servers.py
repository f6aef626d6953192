"""Training on parameter servers against MultiWorkerMirroredStrategy, and
the coordinator's memory, on local processes of this machine.

    python benchmarks/parameter_servers.py [--rows 2000000] [--dim 32] \
        [--steps 60] [--batch 1024]

One table of `--rows` x `--dim` float32 (Adagrad, one slot), 8 ids per
example drawn uniformly on each worker, pooled into `Dense(1)`:

- **parameter servers**: 2 servers and 2 workers as processes
  (`keras_tpu_embed.testing.local_cluster`), a coordinator process that
  builds the model under `ParameterServerStrategy` and trains it with
  `kte.parameter_server.ParameterServerTrainer` (asynchronous steps, each
  worker `--batch` examples a step), then writes a `tf.train.Checkpoint`
  and exports a SavedModel. The coordinator measures its own peak resident
  memory in each phase (`VmHWM`, reset through `/proc/self/clear_refs`
  before it) above what it held before, over the table's bytes (and in
  MiB): the coordinator holds no table, so a byte of it there would be a
  copy. A first model of a 1,000-row table is built before, unmeasured, so
  that `create` does not count Keras' one-time costs.
- **MultiWorkerMirroredStrategy**: 2 worker processes (`TF_CONFIG`), each
  with its own copy of the table and slot, a custom loop through
  `strategy.run` (Keras 3's `model.fit` cannot run under it), a global
  batch of 2 x `--batch`.

Both train the same number of examples after a warm-up; examples/s is
measured on the coordinator (the chief worker), one JSON line on stdout.
The servers and workers share this machine's cores: the ratio says what
the two designs cost here, not what a cluster gains.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

WIDTH = 8


def build_model(rows: int, dim: int) -> Any:
    import keras

    import keras_tpu_embed as kte

    column = kte.embedding_column(
        kte.categorical_column_with_identity("ids", rows), dim
    )
    layer = kte.TPUEmbeddingLayer(
        [column],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.05)),
        output="concat",
    )
    inputs = {"ids": keras.Input((WIDTH,), dtype="int64", name="ids")}
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def examples(rows: int, batch: int) -> Any:
    import tensorflow as tf

    def one(_: Any) -> Any:
        ids = tf.random.uniform([batch, WIDTH], 0, rows, tf.int64)
        return {"ids": ids}, tf.random.uniform([batch, 1])

    return tf.data.Dataset.range(1).repeat().map(one)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    return _status_bytes("VmRSS")


def coordinator(args: argparse.Namespace) -> dict[str, Any]:
    import tensorflow as tf

    import keras_tpu_embed as kte

    cluster = tf.train.ClusterSpec(json.loads(args.cluster))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    table_bytes = args.rows * args.dim * 4
    memory: dict[str, float] = {}

    def phase(name: str, run: Any) -> Any:
        before = _reset_peak()
        result = run()
        grown = _status_bytes("VmHWM") - before
        memory[name] = round(grown / table_bytes, 4)
        memory[f"{name}_mib"] = round(grown / 2**20, 1)
        return result

    def create(rows: int) -> Any:
        with strategy.scope():
            return build_model(rows, args.dim)

    # A first model of a small table takes the one-time costs (Keras'
    # first model, its traces), so that `create` measures what the table
    # costs the coordinator.
    create(1000)
    model = phase("create", lambda: create(args.rows))
    trainer = kte.parameter_server.ParameterServerTrainer(model)

    def dataset_fn() -> Any:
        return examples(args.rows, args.batch)

    trainer.fit(dataset_fn, steps_per_epoch=args.warmup, verbose=0)

    def train() -> float:
        start = time.perf_counter()
        trainer.fit(dataset_fn, steps_per_epoch=args.steps, verbose=0)
        return time.perf_counter() - start

    seconds = phase("train", train)
    files = tempfile.mkdtemp()
    phase(
        "checkpoint",
        lambda: tf.train.Checkpoint(model=model).save(f"{files}/ckpt"),
    )
    phase(
        "export",
        lambda: kte.export_saved_model(model, f"{files}/served", inputs="ids"),
    )
    return {
        "examples_per_second": args.steps * args.batch / seconds,
        "coordinator_peak_over_table": memory,
    }


def mirrored_worker(args: argparse.Namespace) -> dict[str, Any]:
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model(args.rows, args.dim)
    global_batch = 2 * args.batch
    data = iter(
        strategy.experimental_distribute_dataset(
            examples(args.rows, global_batch)
        )
    )

    @tf.function
    def step(x: Any, y: Any) -> None:
        def replica(x: Any, y: Any) -> None:
            with tf.GradientTape() as tape:
                errors = tf.square(model(x, training=True) - y)[:, 0]
                loss = tf.nn.compute_average_loss(
                    errors, global_batch_size=global_batch
                )
            gradients = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply(gradients, model.trainable_variables)

        strategy.run(replica, args=(x, y))

    for _ in range(args.warmup):
        step(*next(data))
    start = time.perf_counter()
    # Half the steps: each takes both workers' batches.
    steps = max(1, args.steps // 2)
    for _ in range(steps):
        step(*next(data))
    seconds = time.perf_counter() - start
    return {"examples_per_second": steps * global_batch / seconds}


def _python(arguments: list[str], env: dict[str, str]) -> Any:
    return subprocess.Popen(
        [sys.executable, __file__, *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _result(process: Any) -> dict[str, Any]:
    out, err = process.communicate(timeout=3600)
    if process.returncode != 0:
        raise RuntimeError(err[-3000:])
    found: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    from keras_tpu_embed.testing.local_cluster import free_ports
    from keras_tpu_embed.testing.local_cluster import local_cluster

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    sizes = [f"--{k}={getattr(args, k)}" for k in SIZES]
    with local_cluster(parameter_servers=2, workers=2) as (cluster, _):
        servers = _result(
            _python(
                [
                    "--role=coordinator",
                    f"--cluster={json.dumps(cluster)}",
                    *sizes,
                ],
                env,
            )
        )
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    workers = [
        _python(
            ["--role=mirrored", *sizes],
            dict(
                env,
                TF_CONFIG=json.dumps(
                    {
                        "cluster": {"worker": addresses},
                        "task": {"type": "worker", "index": index},
                    }
                ),
            ),
        )
        for index in range(2)
    ]
    mirrored = [_result(worker) for worker in workers][0]
    return {
        "table": [args.rows, args.dim],
        "parameter_servers": servers,
        "multi_worker_mirrored": mirrored,
        "examples_per_second_ratio": (
            servers["examples_per_second"] / mirrored["examples_per_second"]
        ),
    }


SIZES = ("rows", "dim", "steps", "batch", "warmup")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--role", default="main")
    parser.add_argument("--cluster", default="")
    args = parser.parse_args()
    if args.role == "coordinator":
        result = coordinator(args)
    elif args.role == "mirrored":
        result = mirrored_worker(args)
    else:
        result = run(args)
    print(json.dumps(result), flush=True)
    if args.role == "coordinator":
        # Its threads keep polling the servers: leave at once.
        os._exit(0)


if __name__ == "__main__":
    main()
