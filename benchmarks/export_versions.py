"""The same serving export written by two checkouts, timed side by side.

Each checkout (`--before`, `--after`: a directory holding this package and
its `benchmarks/`, e.g. a `git worktree` of an older commit) writes the
workload's default export (W1: `exports.export_apart("kte_cpu", ...)`; W4:
`criteo_serving.export_kte`, and with `--jit` the after checkout's
`jit_compile=True` export too) from a process of its own. All are loaded
into this one process and called at batch 1, 64 and 4,096 in rotating
rounds; each round takes each export's median call time, and the figure
printed is the median over rounds of before's over the other's: how many
times faster the change made the call, paired.

    git worktree add --detach /tmp/before <commit>
    python benchmarks/export_versions.py --before /tmp/before \\
        --after . [--workload W4 [--jit]]

W4's exports draw their own dense weights, so their outputs are not
compared here (the tests compare each export with its model).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

CALLS = {1: 200, 64: 100, 4096: 10}
W4_ROW_CAP = 100_000


def export_code(workload: str, path: str, jit: bool) -> str:
    """Python run in a checkout's own process to write its export."""
    if workload == "W1":
        return (
            "from benchmarks import exports; "
            f"exports.export_apart('kte_cpu', False, {path!r})"
        )
    extra = ", jit=True" if jit else ""
    return (
        "from benchmarks import criteo_serving, workloads; "
        f"spec = workloads.criteo_workload(row_cap={W4_ROW_CAP}); "
        f"criteo_serving.export_kte(spec, {path!r}{extra})"
    )


def write(tree: str, workload: str, path: str, jit: bool) -> None:
    tree = os.path.abspath(tree)
    env = dict(os.environ, PYTHONPATH=tree)
    subprocess.run(
        [sys.executable, "-c", export_code(workload, path, jit)],
        check=True,
        cwd=tree,
        env=env,
    )


def inputs_of(workload: str) -> Any:
    """A function of the batch size giving the workload's dense inputs
    (imported here: after the exports, from this checkout)."""
    from benchmarks import workloads

    if workload == "W1":
        from benchmarks import exports

        batch = workloads.make_batches(workloads.workload("W1"))[0]
        return lambda size: exports.dense_inputs(batch, size, 0)
    from benchmarks import criteo_models

    spec = workloads.criteo_workload(row_cap=W4_ROW_CAP)
    features, _ = criteo_models.model_data(
        workloads.make_criteo_batches(spec)[:1]
    )[0]
    return lambda size: {k: v[:size] for k, v in features.items()}


def paired(serve: dict[str, Any], inputs: dict, calls: int, rounds: int) -> Any:
    """Per export after the first: the median over rounds of the first's
    median call time over its own."""
    names = list(serve)
    for call in serve.values():
        for _ in range(3):
            call(**inputs)
    ratios: dict[str, list[float]] = {name: [] for name in names[1:]}
    for index in range(rounds):
        shift = index % len(names)
        medians = {}
        for name in names[shift:] + names[:shift]:
            times = []
            for _ in range(calls):
                begin = time.perf_counter()
                serve[name](**inputs)
                times.append(time.perf_counter() - begin)
            medians[name] = statistics.median(times)
        for name in names[1:]:
            ratios[name].append(medians[names[0]] / medians[name])
    return {name: statistics.median(r) for name, r in ratios.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default=".")
    parser.add_argument("--workload", choices=("W1", "W4"), default="W1")
    parser.add_argument("--jit", action="store_true", help="W4 only")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="export_versions_")
    plan = [("before", args.before, False), ("after", args.after, False)]
    if args.jit and args.workload == "W4":
        plan.append(("after_jit_compile", args.after, True))
    for name, tree, jit in plan:
        write(tree, args.workload, os.path.join(directory, name), jit)
    import tensorflow as tf

    serve = {
        name: tf.saved_model.load(os.path.join(directory, name)).signatures[
            "serving_default"
        ]
        for name, _, _ in plan
    }
    make_inputs = inputs_of(args.workload)
    for size, calls in CALLS.items():
        faster = paired(serve, make_inputs(size), calls, args.rounds)
        print(
            f"{args.workload} batch {size}: "
            + "; ".join(f"{n} {x:.2f}x faster" for n, x in faster.items())
            + " than before (paired)"
        )


if __name__ == "__main__":
    main()
