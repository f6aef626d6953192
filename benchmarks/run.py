"""The benchmark suite: one command, every candidate, one table.

    python benchmarks/run.py [--workloads W1,W2,W3,latency,quantization,
                                          W4,row_layouts,scale]
                             [--rounds 5] [--steps N] [--repeat 1]
                             [--out benchmarks/results] [--quick]

Each family of candidates runs in a process of its own (peak RSS is then
per candidate, and one family's allocator state cannot slow another), and
every process measures the anchor, `tf.nn.safe_embedding_lookup_sparse`,
and the gather bound itself, so every ratio is taken within one process.
The `legacy` family runs with `TF_USE_LEGACY_KERAS=1`. `latency` (loaded
SavedModels from 1 and 8 threads, `latency.py`) and `quantization` (the
demo's AUC through each table dtype, `quantization.py`), `W4` (the
Criteo-shaped workload, `criteo.py`) and `row_layouts` (int8 row layouts
against the gather bound, `row_layouts.py`) are a process each. `scale`
(peak memory per host and phase on the emulated pod, `scale.py`) runs only
when named: about 80 minutes and 8 GB, processes of its own, and it writes
its own `scale.json` (a run of `scale` alone leaves `results.json` as it
is).
Prints the table and the targets; writes `results.json`, `results.png` and
`latency.png` under `--out`; progress goes to stderr. A full run took
13 minutes on 2 cores. `--quick` shrinks batches and tables so
that the whole suite runs in a minute or two (for the test); its numbers
mean nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks import latency_report  # noqa: E402
from benchmarks import report  # noqa: E402

FAMILIES = {
    "W1": ["tf", "keras", "keras_rs", "legacy", "kte"],
    "W2": ["tf", "keras", "keras_rs", "legacy", "kte"],
    "W3": ["kte", "kte_tensor_core"],
    "latency": ["latency"],
    "quantization": ["quantization"],
    "W4": ["W4"],
    "row_layouts": ["row_layouts"],
    "scale": ["scale"],
}
DEFAULT_WORKLOADS = [w for w in FAMILIES if w != "scale"]
"""What a run without `--workloads` measures."""
OWN_RESULTS = {"scale"}
"""Workloads that write their own results file under `--out`."""
SCRIPTS = {
    "latency": "latency.py",
    "quantization": "quantization.py",
    "W4": "criteo.py",
    "row_layouts": "row_layouts.py",
    "scale": "scale.py",
}
"""Parts that are a script of their own, not a family of candidates."""
STEPS = {"W1": 20, "W2": 6, "W3": 6}
"""Steps per candidate per round, unless --steps says otherwise."""


def plan(workload: str, quick: bool) -> list[str]:
    """The processes of a workload: a family each, or with `--quick` one
    script in W1 and W2 (the numbers of a quick run are only a smoke test,
    and each process start costs seconds of imports)."""
    if not quick or workload not in ("W1", "W2"):
        return FAMILIES[workload]
    return ["all", "legacy"]


def run_family(
    workload: str, family: str, args: argparse.Namespace
) -> dict[str, Any]:
    script = "legacy_candidates.py" if family == "legacy" else "candidates.py"
    script = SCRIPTS.get(workload, script)
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    if family == "legacy":
        env["TF_USE_LEGACY_KERAS"] = "1"
    else:
        env.pop("TF_USE_LEGACY_KERAS", None)
    command = [sys.executable, os.path.join(HERE, script)]
    if workload == "latency":
        command += ["--rounds", str(args.rounds)]
    elif workload == "W4":
        command += ["--json", "--rounds", str(min(args.rounds, 3))]
        if args.w4_row_cap:
            command += ["--row-cap", str(args.w4_row_cap)]
    elif workload == "row_layouts":
        command += ["--rounds", str(max(args.rounds, 3))]
    elif workload == "scale":
        command += ["--json", "--out", args.out]
    elif workload in FAMILIES and workload not in SCRIPTS:
        command += [
            "--workload",
            workload,
            "--family",
            family,
            "--rounds",
            str(args.rounds),
            "--steps",
            str(args.steps or STEPS[workload]),
        ]
    if args.quick:
        command.append("--quick")
    print(f"{workload} {family} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        print(f"{workload} {family} failed: {tail[0]}", file=sys.stderr)
        return {"error": f"exit {done.returncode}: {tail[0]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    result["wall_s"] = time.perf_counter() - started
    print(
        f"{workload} {family} done in {result['wall_s']:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return result


def run_once(
    jobs: list[tuple[str, str]], args: argparse.Namespace
) -> dict[str, Any]:
    """One full run of the chosen processes: the results by workload."""
    results: dict[str, Any] = {}
    # Full runs measure one process at a time; a quick run (a smoke test
    # whose numbers mean nothing) starts them all at once.
    workers = len(jobs) if args.quick else 1
    with concurrent.futures.ThreadPoolExecutor(max(workers, 1)) as pool:
        done = list(pool.map(lambda job: run_family(*job, args), jobs))
    for (workload, family), result in zip(jobs, done):
        if workload in SCRIPTS:
            results[workload] = result
            continue
        results.setdefault(workload, {"processes": {}})
        results[workload]["processes"][family] = result
    for workload in args.workloads.split(","):
        if workload in results and workload not in SCRIPTS:
            results[workload]["rows"] = report.rows(results[workload])
    return results


def machine() -> dict[str, Any]:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="full runs; with more than one, the W1/W2 targets are judged "
        "on the median ratio over runs (W2 >= 1.5x is held as the median "
        "of 3)",
    )
    parser.add_argument(
        "--w4-row-cap",
        type=int,
        default=0,
        help="W4's row cap (criteo.py's default, 10^7, needs about 21 GB "
        "for its five candidates; 2000000 fits a 24 GB machine)",
    )
    parser.add_argument(
        "--families", default="", help="comma-separated subset of families"
    )
    args = parser.parse_args(argv)
    chosen = set(filter(None, args.families.split(",")))
    results: dict[str, Any] = {
        "command": " ".join(
            ["python", "benchmarks/run.py"] + (argv or sys.argv[1:])
        ),
        "machine": machine(),
    }
    jobs = [
        (workload, family)
        for workload in args.workloads.split(",")
        for family in plan(workload, args.quick)
        if not chosen or family in chosen
    ]
    runs = []
    for repeat in range(args.repeat):
        if args.repeat > 1:
            print(f"run {repeat + 1} of {args.repeat}", file=sys.stderr)
        runs.append(run_once(jobs, args))
    # The tables, plots and per-process records are those of the last run;
    # the targets are judged on the median over runs when there are several.
    results.update(runs[-1])
    results["targets"] = report.targets(results)
    if args.repeat > 1:
        results["targets"] = report.median_targets(
            [report.targets(run) for run in runs]
        )
    text = report.table(results)
    for workload in ("W4", "row_layouts", "scale"):
        if workload in results:
            part = results[workload]
            text += "\n\n" + part.get("table", f"{workload}: {part}")
    print(f"$ {results['command']}\n{text}")
    if set(args.workloads.split(",")) <= OWN_RESULTS:
        return results
    os.makedirs(args.out, exist_ok=True)
    results["table"] = text
    with open(os.path.join(args.out, "results.json"), "w") as handle:
        json.dump(results, handle, indent=1)
    report.plot(results, os.path.join(args.out, "results.png"))
    if "latency" in results and "error" not in results["latency"]:
        latency_report.plot(
            results["latency"], os.path.join(args.out, "latency.png")
        )
    return results


if __name__ == "__main__":
    main()
