"""Peak resident memory of a quantized export, against one table.

Builds a model of one identity column `[rows, 64]` (float32), then writes
it with `kte.export_saved_model(..., table_dtype=...)` and reports the
peak resident memory the export adds (the high-water mark from just
before the export through its end, less what was resident before:
`measure.reset_peak`), divided by the table's bytes. The issue's budget:
at most 1.25x one table.

One export per process, so that memory freed by an earlier one cannot be
reused by the next and hide its peak:

    python benchmarks/export_memory.py --rows 2000000 --table-dtype int8

`--package-root DIR` imports `keras_tpu_embed` from another checkout (the
code before a change, say) with this script's harness.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--table-dtype", default="int8")
    parser.add_argument("--package-root", default=HERE)
    parser.add_argument("--out", default=None, help="export directory")
    args = parser.parse_args(argv)
    # The harness from this checkout, the package from --package-root.
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.abspath(args.package_root))

    # After sys.path names the package to measure (--package-root), so that
    # this is the package imported.
    import keras
    import tensorflow as tf

    import keras_tpu_embed as kte
    from benchmarks import measure

    tf.get_logger().setLevel("ERROR")
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", args.rows),
        args.dim,
        # Zeros initialise a big table quickly; the values are set below.
        initializer=keras.initializers.Zeros(),
    )
    preprocessor = kte.FeaturePreprocessor([column])
    inputs = preprocessor.keras_inputs()
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    model = keras.Model(inputs, layer(inputs))
    table = layer.table_variable("item")
    # Distinct rows (a random-normal table), written in slices so that the
    # set-up itself never holds a second copy of the table.
    step = 1 << 18
    for start in range(0, args.rows, step):
        stop = min(start + step, args.rows)
        values = tf.random.stateless_normal(
            [stop - start, args.dim], seed=[start, 1]
        )
        table[start:stop].assign(values)
    # As after training: a gather puts the variable in TF's copy-on-read
    # mode, in which a dense read of it copies the whole table.
    layer({"item": tf.constant([[0]], tf.int64)})
    table_bytes = args.rows * args.dim * 4
    directory = args.out or tempfile.mkdtemp(prefix="export_memory_")
    before = measure.resident_bytes()
    measure.reset_peak()
    kte.export_saved_model(
        model,
        os.path.join(directory, "export"),
        preprocessor,
        table_dtype=args.table_dtype,
        verbose=False,
    )
    added = max(measure.peak_bytes() - before, 0)
    measure.emit(
        {
            "workload": "export_memory",
            "package_root": os.path.abspath(args.package_root),
            "rows": args.rows,
            "dim": args.dim,
            "table_dtype": args.table_dtype,
            "table_bytes": table_bytes,
            "rss_before_bytes": before,
            "peak_rss_added_bytes": added,
            "added_over_table": added / table_bytes,
            "target": "<= 1.25",
            "met": added / table_bytes <= 1.25,
        }
    )


if __name__ == "__main__":
    main()
