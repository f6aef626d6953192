"""Where the time of one serving call of the default export goes.

Writes W1's `kte_cpu` export (`exports.py`: `export_saved_model` of the
package's layers, `lookup_device="cpu"`, float32) and the fastest peer's,
`keras_embedding_xla`, and `kte_cpu_xla` (`jit_compile=True`),
loads each with `tf.saved_model.load`, and at each
batch size calls `serving_default` on W1's dense ids:

- wall time per call (median of `--calls`, after a warm-up);
- a host trace of the same calls (`tf.profiler`, its XSpace read back):
  per call, the time inside XLA programs (how many, and the top fusions),
  in TensorFlow ops outside XLA (per op type, those inside a `tf.cond`
  branch apart), and the rest of the traced call (executor scheduling,
  function dispatch).

    python benchmarks/profile_serving.py [--quick] [--calls 200]
                                         [--workload W4 [--row-cap N]]

Run on the machine of the README's numbers; the op times of a shared,
loaded machine vary, so read the shares, not the microseconds.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import collections  # noqa: E402
import glob  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import tensorflow as tf  # noqa: E402

from benchmarks import criteo_models  # noqa: E402
from benchmarks import criteo_serving  # noqa: E402
from benchmarks import exports  # noqa: E402
from benchmarks import workloads  # noqa: E402

EXPORTS = ("kte_cpu", "kte_cpu_xla", "keras_embedding_xla")


def _xspace(directory: str) -> Any:
    # Not every TensorFlow build ships it; only reading a profile needs it.
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = glob.glob(
        os.path.join(directory, "**", "*.xplane.pb"), recursive=True
    )
    space = xplane_pb2.XSpace()
    with open(paths[0], "rb") as handle:
        space.ParseFromString(handle.read())
    return space


def profile(serve: Any, inputs: dict, calls: int) -> dict[str, Any]:
    """Wall time per call, and the host trace of `calls` calls summed per
    kind of event, per call (microseconds)."""
    for _ in range(5):
        serve(**inputs)
    walls = []
    for _ in range(calls):
        begin = time.perf_counter()
        serve(**inputs)
        walls.append(time.perf_counter() - begin)
    directory = tempfile.mkdtemp(prefix="trace_")
    tf.profiler.experimental.start(directory)
    try:
        for _ in range(calls):
            serve(**inputs)
    finally:
        tf.profiler.experimental.stop()
    space = _xspace(directory)
    totals: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, float] = collections.defaultdict(float)
    ops: dict[str, float] = collections.defaultdict(float)
    op_counts: dict[str, float] = collections.defaultdict(float)
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                micros = event.duration_ps / 1e6 / calls
                totals[name] += micros
                counts[name] += 1 / calls
                if name.startswith("StatefulPartitionedCall/") and ":" in name:
                    # A TensorFlow op outside XLA: `scope/name:Type`.
                    kind = name.rsplit(":", 1)[1]
                    if "/cond/" in name:
                        kind += " (in a tf.cond branch)"
                    ops[kind] += micros
                    op_counts[kind] += 1 / calls
    fusions = {
        k: v
        for k, v in totals.items()
        if "fusion" in k and not k.startswith("end:")
    }
    return {
        "wall_us": 1e6 * statistics.median(walls),
        # The Python call into the runtime: the whole call as traced.
        "call_us": totals.get("TFE_Py_ExecuteCancelable", 0.0),
        "xla_us": totals.get("CpuExecutable::ExecuteAsyncOnStream", 0.0),
        "xla_programs": counts.get("CpuExecutable::ExecuteAsyncOnStream", 0),
        "tf_ops_us": sum(ops.values()),
        "tf_ops": sum(op_counts.values()),
        "executor_steps": counts.get("ExecutorState::Process", 0),
        "ops_us": dict(ops),
        "op_counts": dict(op_counts),
        "fusions_us": fusions,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--workload", choices=("W1", "W4"), default="W1")
    parser.add_argument(
        "--row-cap", type=int, default=None, help="W4's cap on table rows"
    )
    args = parser.parse_args(argv)
    tf.get_logger().setLevel("ERROR")
    directory = tempfile.mkdtemp(prefix="profile_serving_")
    loaded = {}
    if args.workload == "W4":
        w4 = workloads.criteo_workload(quick=args.quick, row_cap=args.row_cap)
        features, _ = criteo_models.model_data(
            workloads.make_criteo_batches(w4)[:1]
        )[0]
        for name, export in (
            ("kte_cpu", criteo_serving.export_kte),
            (
                "kte_cpu_xla",
                lambda s, p: criteo_serving.export_kte(s, p, jit=True),
            ),
            ("keras_embedding_xla", criteo_serving.export_keras),
        ):
            export(w4, os.path.join(directory, name))
            loaded[name] = exports.Loaded(os.path.join(directory, name))
        batch_size = w4.batch_size

        def batch_inputs(size: int) -> dict:
            return {k: v[:size] for k, v in features.items()}
    else:
        spec = workloads.workload("W1", quick=args.quick)
        batch = workloads.make_batches(spec)[0]
        for name in EXPORTS:
            path = os.path.join(directory, name)
            exports.export_apart(name, args.quick, path)
            loaded[name] = exports.Loaded(path)
        batch_size = spec.batch_size

        def batch_inputs(size: int) -> dict:
            return exports.dense_inputs(batch, size, 0)

    sizes = [b for b in (1, 64, 4096) if b <= batch_size]
    for size in sizes:
        inputs = batch_inputs(size)
        calls = args.calls if size < 4096 else max(args.calls // 10, 10)
        for name, export in loaded.items():
            r = profile(export.serve, inputs, calls)
            rest = r["call_us"] - r["xla_us"] - r["tf_ops_us"]
            # XLA programs of one call can run at once on both cores: then
            # their sum exceeds the call, and the rest is not measurable.
            rest_text = f"{rest:,.0f} us" if rest >= 0 else "n/a (overlap)"
            print(
                f"batch {size} {name}: wall {r['wall_us']:,.0f} us/call "
                f"(traced {r['call_us']:,.0f}): {r['xla_programs']:.0f} XLA "
                f"programs {r['xla_us']:,.0f} us; {r['tf_ops']:.0f} TF ops "
                f"outside XLA {r['tf_ops_us']:,.0f} us; executor and "
                f"dispatch {rest_text} ({r['executor_steps']:.0f} "
                "executor steps)"
            )
            top = sorted(r["fusions_us"].items(), key=lambda kv: -kv[1])
            for kind, micros in top[: args.top]:
                print(f"    XLA {kind:<40}{micros:>10,.0f} us")
            top = sorted(r["ops_us"].items(), key=lambda kv: -kv[1])
            for kind, micros in top[: args.top]:
                print(
                    f"    op  {kind:<40}{micros:>10,.0f} us"
                    f"{r['op_counts'][kind]:>6.0f} x"
                )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
