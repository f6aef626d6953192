"""Peak resident memory of `kte.warm_start`, against the state it fills.

Writes a TPUEstimator-style checkpoint of one table `[rows, dim]` and its
Adagrad slot (`<table>/Adagrad`), whole or in `--slices` slices (as
`fixed_size_partitioner` saves them), in a process of its own; then, in
another, builds one identity column's table with the Adagrad optimizer, on
CPU or on the TPU embedding engine under `emulated_tpu(2)` (`--engine`;
with `--first-step` after the engine's first step, when TF has created the
tables), and warm-starts it with `slots=True`. Reports the peak resident
memory the call adds (the high-water mark from just before it through its
end, less what was resident before: `measure.reset_peak`) over the bytes
of the state it fills, the table and its slot:

    python benchmarks/warm_start_memory.py --rows 2097152 --slices 4
    python benchmarks/warm_start_memory.py --rows 2097152 --engine

`--package-root DIR` imports `keras_tpu_embed` from another checkout (the
code before a change, say) with this script's harness.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "input_layer/item_embedding/embedding_weights"


def write_checkpoint(prefix: str, rows: int, dim: int, slices: int) -> None:
    """The table and its slot, each saved in `slices` slices of rows, as
    `fixed_size_partitioner` cuts them (the first `rows % slices` one row
    longer), with positive values."""
    import tensorflow as tf

    base, extra = divmod(rows, slices)
    sizes = [base + (1 if index < extra else 0) for index in range(slices)]
    names, specs, tensors = [], [], []
    for key, offset in ((KEY, 0.5), (KEY + "/Adagrad", 1.0)):
        first = 0
        for size in sizes:
            names.append(key)
            specs.append(
                ""
                if slices == 1
                else tf.Variable.SaveSliceInfo(
                    full_name="",
                    full_shape=[rows, dim],
                    var_offset=[first, 0],
                    var_shape=[size, dim],
                ).spec
            )
            tensors.append(
                tf.abs(tf.random.stateless_normal([size, dim], [first, 1]))
                + offset
            )
            first += size
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names,
        shape_and_slices=specs,
        tensors=tensors,
    )


def measure_warm_start(
    args: argparse.Namespace, prefix: str
) -> dict[str, object]:
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_tpu_embed as kte
    from benchmarks import measure

    tf.get_logger().setLevel("ERROR")

    def build() -> keras.Model:
        column = kte.embedding_column(
            kte.categorical_column_with_identity("item", args.rows),
            args.dim,
            initializer=keras.initializers.Zeros(),
        )
        inputs = {"item": keras.Input((1,), dtype="int64", name="item")}
        layer = kte.TPUEmbeddingLayer(
            [column],
            config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
            name="embed",
        )
        model = keras.Model(inputs, layer(inputs)["item_embedding"])
        model.compile(loss="mse")
        return model

    def warm_start(model: keras.Model) -> tuple[int, int]:
        before = measure.resident_bytes()
        measure.reset_peak()
        kte.warm_start(model, prefix, num_shards=args.slices, slots=True)
        return before, max(measure.peak_bytes() - before, 0)

    if not args.engine:
        model = build()
        before, added = warm_start(model)
        layer = model.get_layer("embed")
        loaded = layer.table_variable("item")[-1].numpy()
    else:
        from keras_tpu_embed.testing import emulated_tpu

        with emulated_tpu(2) as strategy:
            with strategy.scope():
                model = build()
            if args.first_step:
                items = tf.data.Dataset.from_tensor_slices(
                    (
                        {"item": np.zeros((8, 1), np.int64)},
                        np.zeros((8, 1), np.float32),
                    )
                )
                model.predict(
                    kte.distribute_dataset(strategy, items, 8), verbose=0
                )
            before, added = warm_start(model)
            engine = model.get_layer("embed").engine
            shard = engine.shards_of("item")[-1]
            try:
                loaded = engine.read_shard_rows(
                    "item", "parameters", shard, shard.rows - 1, shard.rows
                ).numpy()
            except RuntimeError:  # nothing was written (engine refused)
                loaded = np.zeros(1)
    state = 2 * args.rows * args.dim * 4
    return {
        "workload": "warm_start_memory",
        "package_root": os.path.abspath(args.package_root),
        "rows": args.rows,
        "dim": args.dim,
        "slices": args.slices,
        "engine": args.engine,
        "first_step": args.first_step,
        "state_bytes": state,
        "rss_before_bytes": before,
        "peak_rss_added_bytes": added,
        "added_over_state": added / state,
        # The checkpoint's rows are positive: the table was loaded.
        "last_row_loaded": bool(np.all(loaded > 0)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2**21)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--slices", type=int, default=1)
    parser.add_argument("--engine", action="store_true")
    parser.add_argument("--first-step", action="store_true")
    parser.add_argument("--package-root", default=HERE)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--write-only", action="store_true")
    args = parser.parse_args(argv)
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.abspath(args.package_root))
    if args.write_only:
        write_checkpoint(args.checkpoint, args.rows, args.dim, args.slices)
        return
    prefix = args.checkpoint or os.path.join(
        tempfile.mkdtemp(prefix="warm_start_memory_"), "legacy"
    )
    if not os.path.exists(prefix + ".index"):
        # Written by a process of its own: its memory is not measured.
        subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--write-only",
                f"--checkpoint={prefix}",
                f"--rows={args.rows}",
                f"--dim={args.dim}",
                f"--slices={args.slices}",
            ],
            check=True,
        )
    from benchmarks import measure

    measure.emit(measure_warm_start(args, prefix))


if __name__ == "__main__":
    main()
