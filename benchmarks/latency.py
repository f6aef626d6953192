"""Latency as a serving user sees it: loaded SavedModels, 1 and 8 threads.

Every export of `exports.py` is written from the same W1 table values,
loaded with plain `tf.saved_model.load` and called through its
`serving_default` signature on dense ids, at batch 1, 64 and 4,096, from 1
Python thread and from 8 threads calling concurrently. Each call's wall
time is one latency sample; p50 / p99 are over every call of every round,
examples/s is the examples served over the wall time of the calls.

Warm-up calls each export at each batch size first (XLA compiles once per
input shape). Rounds rotate the order of the exports, so that drift of a
shared machine hits each alike, and each round also records the ratio of
each export's examples/s to the fastest float32 peer's in that round: the
ratios reported are the medians of those per-round ratios.

Beside each: the max abs difference of its outputs from the float32
reference (numpy, on the same table values) per table, and the bytes of
its SavedModel directory.

Run as a process of its own (`run.py` does): prints one JSON line.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks import exports  # noqa: E402
from benchmarks import measure  # noqa: E402
from benchmarks import workloads  # noqa: E402

BATCHES = (1, 64, 4096)
QUICK_BATCHES = (1, 16, 256)
THREADS = (1, 8)
CALLS = {1: 200, 64: 100, 4096: 10}
"""Calls per thread per round at each batch size (full run)."""
QUICK_CALLS = 3


def is_peer(name: str) -> bool:
    return not name.startswith("kte")


def timed_calls(
    call: Any, inputs: list[dict[str, Any]], calls: int, threads: int
) -> tuple[list[float], float]:
    """`threads` threads each make `calls` calls, started together.

    Returns every call's latency and the wall time from the start to the
    last thread's end.
    """
    latencies: list[list[float]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def worker(index: int) -> None:
        own = latencies[index]
        barrier.wait()
        for i in range(calls):
            begin = time.perf_counter()
            call(inputs[(index + i) % len(inputs)])
            own.append(time.perf_counter() - begin)

    workers = [
        threading.Thread(target=worker, args=(i,)) for i in range(threads)
    ]
    for thread in workers:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in workers:
        thread.join()
    wall = time.perf_counter() - start
    return [t for own in latencies for t in own], wall


def percentile(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples), q))


@dataclasses.dataclass
class Cell:
    """One export at one batch size and thread count, over all rounds."""

    latencies: list[float] = dataclasses.field(default_factory=list)
    examples: int = 0
    wall_s: float = 0.0
    per_round_examples_per_s: list[float] = dataclasses.field(
        default_factory=list
    )
    page_faults: int = 0
    """Minor page faults of the process while this cell's calls ran."""


def minor_faults() -> int:
    """The process's minor page faults so far: memory the allocator gave
    back to the system and took again, zeroed page by page."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    spec = workloads.workload("W1", quick=args.quick)
    sizes = QUICK_BATCHES if args.quick else BATCHES
    batch = workloads.make_batches(spec)[0]
    values = measure.table_values(spec)
    quantized, skipped = exports.quantized_dtypes()
    inputs = {
        size: [
            exports.dense_inputs(batch, size, start)
            for start in range(0, min(8 * size, spec.batch_size), size)
        ]
        for size in sizes
    }
    check = inputs[sizes[-1]][0]
    want = exports.reference(values, check)
    del values  # The exports are written by processes of their own.
    loaded: dict[str, exports.Loaded] = {}
    records: dict[str, dict[str, Any]] = {}
    for name in exports.exporters(quantized):
        print(f"latency: export {name}", file=sys.stderr, flush=True)
        path = tempfile.mkdtemp(prefix=f"{name}_")
        started = time.perf_counter()
        try:
            exports.export_apart(name, args.quick, path)
            model = exports.Loaded(path)
            errors = exports.max_abs_error(model(check), want)
            for size in sizes:
                for one in inputs[size][:3]:
                    model(one)
        except Exception as error:  # noqa: BLE001
            # Reported as failed, with its error, beside the others.
            records[name] = {"error": measure.describe(error)}
            print(f"latency: {name} failed: {error!r}", file=sys.stderr)
            shutil.rmtree(path, ignore_errors=True)
            continue
        loaded[name] = model
        records[name] = {
            "saved_model_bytes": model.bytes,
            "max_abs_diff_per_table": errors,
            "max_abs_diff": max(errors.values()),
            "export_and_warmup_s": time.perf_counter() - started,
        }
    cells = {
        (name, size, threads): Cell()
        for name in loaded
        for size in sizes
        for threads in THREADS
    }
    names = list(loaded)
    for round_index in range(args.rounds):
        print(f"latency: round {round_index}", file=sys.stderr, flush=True)
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            for size in sizes:
                calls = QUICK_CALLS if args.quick else CALLS[size]
                for threads in THREADS:
                    faults = minor_faults()
                    samples, wall = timed_calls(
                        loaded[name], inputs[size], calls, threads
                    )
                    cell = cells[(name, size, threads)]
                    cell.page_faults += minor_faults() - faults
                    cell.latencies += samples
                    cell.examples += len(samples) * size
                    cell.wall_s += wall
                    cell.per_round_examples_per_s.append(
                        len(samples) * size / wall
                    )
    for name in names:
        record = records[name]
        record["cells"] = []
        for size in sizes:
            for threads in THREADS:
                cell = cells[(name, size, threads)]
                record["cells"].append(
                    {
                        "batch": size,
                        "threads": threads,
                        "calls": len(cell.latencies),
                        "p50_ms": percentile(cell.latencies, 50) * 1e3,
                        "p99_ms": percentile(cell.latencies, 99) * 1e3,
                        "examples_per_s": cell.examples / cell.wall_s,
                        "page_faults_per_call": cell.page_faults
                        / len(cell.latencies),
                        "vs_fastest_peer": _paired(cells, name, size, threads),
                    }
                )
    measure.emit(
        {
            "workload": "latency",
            "batches": list(sizes),
            "threads": list(THREADS),
            "rounds": args.rounds,
            "quantized_skipped": skipped,
            "exports": records,
        }
    )


def _paired(
    cells: dict[tuple[str, int, int], Cell], name: str, size: int, threads: int
) -> dict[str, Any]:
    """Median over rounds of examples/s over the fastest float32 peer's.

    The fastest peer is chosen per round, among the float32 peers measured
    in that same round (None when no peer could be measured).
    """
    peers = [n for (n, s, t) in cells if s == size and t == threads]
    peers = [n for n in dict.fromkeys(peers) if is_peer(n)]
    own = cells[(name, size, threads)].per_round_examples_per_s
    if not peers:
        return {"ratio": None, "per_round": []}
    ratios = []
    for index, speed in enumerate(own):
        best = max(
            cells[(p, size, threads)].per_round_examples_per_s[index]
            for p in peers
        )
        ratios.append(speed / best)
    return {"ratio": statistics.median(ratios), "per_round": ratios}


if __name__ == "__main__":
    main()
