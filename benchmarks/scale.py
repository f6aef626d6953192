"""The scale workload: peak memory per process and phase, over its state.

    python benchmarks/scale.py [--table-mib 512] [--configs V1x1,V1x2,V2x1]
                               [--phases create,...] [--sequential]
                               [--out benchmarks/results] [--quick]
    python benchmarks/run.py --workloads scale     (the same, in the suite)

Issue 39's question: does every phase hold at most one shard per host?
On the emulated pod (`V1x2`: 2 hosts x 2 replicas, each host a process of
its own; `V1x1`, `V2x1`: one host of 2 replicas, which is this process, as
on a single TPU VM) the model of `scale_phases.py` (two tables of
`--table-mib` MiB, Adagrad) goes through every phase of `PHASES`, and
each process's peak resident memory in the phase, less its runtime before
the model existed, is divided by the bytes of state it holds:

- `ratio`: over everything the process holds (TF's host copies of its
  table and slot shards, plus the emulated chip's shards, which a real
  TPU holds in its HBM, plus dense weights). Target: <= 1.25x per host.
- `host_ratio` (V1): the chip's shards taken out of both sides, which
  is what a real TPU host holds in its RAM: the sizing table's input.
- the client of a pod (`V1x2`): its peak over one table's bytes.

Every phase runs in a fresh process (the first one measures `create` and
`first_step`; each other builds the model, trains one step, then runs the
phases before its own unmeasured, as `scale_phases.py` says), unless
`--sequential` measures all phases of a configuration in one process
(quicker; a phase then also carries what earlier ones left allocated, so
its reading can only be higher). A setup process first writes the files
the read phases read (from the model on the CPU).

Prints the table of ratios and the sizing table (`sizing`: which paths
fit in 400 GB hosts, by table size and hosts); writes both with every
reading to `scale.json` under `--out`. `--json` prints the result as the
last line (for `run.py`). `--quick` uses 4 MiB tables and the sequential
form: a smoke test; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.scale_phases import PHASES  # noqa: E402
from benchmarks.scale_phases import REFERENCE_PHASES  # noqa: E402

CONFIGS = {
    "V1x1": ("V1", 1),
    "V1x2": ("V1", 2),
    "V2x1": ("V2", 1),
    "TFx2": ("TF", 2),
}
"""Configuration -> (embedding feature, hosts). `TF`: TF alone, for
reference (the host copies as plain variables, checkpoint write and read:
what TF's own checkpointing holds per host)."""
TARGET = 1.25
HOST_BYTES = 400e9
"""The host memory of the sizing table (a TPU v4 host has about 400 GB)."""
SIZING_TABLES = (10e9, 100e9, 1e12, 4e12)
"""Table sizes (float32 parameters) of the sizing table."""
SIZING_HOSTS = (1, 4, 16, 64)
SLOTS = 1
"""Adagrad's one slot, the state the ratios were measured with."""
KERAS_FILE_PHASES = ("save_weights", "load_weights", "keras_save")


def run_process(arguments: list[str]) -> dict[str, Any]:
    """One `scale_phases.py` process; its JSON line, or its error."""
    command = [sys.executable, os.path.join(HERE, "scale_phases.py")]
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_USE_LEGACY_KERAS", None)
    print("scale:", " ".join(arguments), file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run(
        command + arguments, env=env, capture_output=True, text=True
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        print(f"scale: failed: {tail[0]}", file=sys.stderr, flush=True)
        return {"error": f"exit {done.returncode}: {tail[0]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    result["wall_s"] = time.perf_counter() - started
    return result


def plan(phases: list[str], sequential: bool) -> list[list[str]]:
    """The phases each process measures."""
    if sequential:
        return [phases]
    first = [p for p in phases if p in ("create", "first_step")]
    rest = [[p] for p in phases if p not in ("create", "first_step")]
    return ([first] if first else []) + rest


def readings(process: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per phase and process of one measuring process: its ratios."""
    out: dict[str, dict[str, Any]] = {}
    state = process.get("state", {})
    table = process["table_bytes"]
    for phase, record in process.get("phases", {}).items():
        row: dict[str, Any] = {"seconds": record["seconds"]}
        if "error" in record:
            row["error"] = record["error"]
        for name, peak in record["peak"].items():
            net = peak - process["baseline"][name]
            held = state.get(name, {})
            total = sum(held.values())
            entry: dict[str, Any] = {
                "peak_bytes": peak,
                "added_bytes": net,
                "state_bytes": total,
                "over_table": net / table,
            }
            if total:
                entry["ratio"] = net / total
                # The chip's shards exist from the first step on.
                held_chip = held.get("chip", 0)
                chip = 0 if phase == "create" else held_chip
                entry["host_ratio"] = (net - chip) / (total - held_chip)
            row[name] = entry
        out[phase] = row
    return out


def measure_config(
    name: str, args: argparse.Namespace, files: str
) -> dict[str, Any]:
    feature, hosts = CONFIGS[name]
    phases: dict[str, Any] = {}
    processes = []
    chosen = args.phases.split(",")
    if feature == "TF":
        chosen = [p for p in chosen if p in REFERENCE_PHASES]
    for wanted in plan(chosen, args.sequential or feature == "TF"):
        result = run_process(
            [
                "--feature",
                feature,
                "--hosts",
                str(hosts),
                "--table-mib",
                str(args.table_mib),
                "--measure",
                ",".join(wanted),
                "--files",
                files,
            ]
        )
        processes.append(result)
        if "error" in result:
            for phase in wanted:
                phases[phase] = {"error": result["error"]}
            continue
        phases.update(readings(result))
    return {
        "feature": feature,
        "hosts": hosts,
        "phases": phases,
        "processes": processes,
    }


def _host_names(row: dict[str, Any]) -> list[str]:
    hosts = [k for k in row if k.startswith("host")]
    return hosts or (["client"] if "client" in row else [])


def worst(row: dict[str, Any], key: str) -> float | None:
    """The largest `key` ratio over the hosts of a phase's readings."""
    values = [row[h][key] for h in _host_names(row) if key in row[h]]
    return max(values) if values else None


def _cell(row: dict[str, Any] | None, key: str) -> str:
    if row is None:
        return "-"
    if "error" in row:
        return "failed"
    value = worst(row, key)
    if value is None:
        return "-"
    return f"{value:.2f}{'*' if value > TARGET else ' '}"


def table(results: dict[str, Any]) -> str:
    """The ratios: per phase, the worst host of each configuration."""
    configs = results["configs"]
    columns: list[tuple[str, str, str]] = []
    for name, config in configs.items():
        columns.append((f"{name} ratio", name, "ratio"))
        if config["feature"] == "V1":
            columns.append((f"{name} host", name, "host_ratio"))
        if config["hosts"] > 1 and config["feature"] != "TF":
            columns.append((f"{name} client/T", name, "client"))
    width = 24
    lines = [
        f"scale: 2 tables of {results['table_mib']:g} MiB each (Adagrad), "
        "peak RSS added in the phase over the state held; worst host "
        f"(* over the {TARGET}x target); client/T: a pod client's peak over "
        "one table",
        "phase".ljust(width) + "".join(c[0].rjust(16) for c in columns),
    ]
    errors: dict[str, str] = {}
    for phase in results["phases"]:
        cells = []
        for _, name, key in columns:
            row = configs[name]["phases"].get(phase)
            if row is not None and "error" in row:
                errors[f"{name} {phase}"] = row["error"]
            if key == "client":
                client = None if row is None else row.get("client")
                cells.append(
                    "failed"
                    if row is not None and "error" in row
                    else "-"
                    if client is None
                    else f"{client['over_table']:.2f}"
                )
            else:
                cells.append(_cell(row, key))
        lines.append(phase.ljust(width) + "".join(c.rjust(16) for c in cells))
    for where, error in errors.items():
        lines.append(f"  {where}: {error}")
    lines.append(
        f"  save_weights, load_weights, keras_save: engine tables over "
        f"{results['keras_file_limit_bytes'] / 2**30:g} GiB are refused by "
        "design (Keras stores each variable whole); not measured above it"
    )
    return "\n".join(lines)


def sizing(results: dict[str, Any]) -> dict[str, Any]:
    """Which phases fit in `HOST_BYTES` per host, by table size and hosts.

    A model of one table of `size` bytes (float32 parameters) with
    Adagrad, V1. A host holds `(1 + SLOTS) * size / hosts` of host copies
    and peaks at `host_ratio` times that (the worst host of `V1x2`, or
    `V1x1` on one host, where the client is the host); on a pod the
    client runs on host 0, which adds the client's peak (`client/T` times
    `size`). The emulated chip's shards are left out: a TPU holds them in
    its HBM, which this does not size.
    """
    configs = results["configs"]
    limit = results["keras_file_limit_bytes"]
    out: dict[str, Any] = {}
    for size in SIZING_TABLES:
        for hosts in SIZING_HOSTS:
            measured = configs.get("V1x1" if hosts == 1 else "V1x2")
            if measured is None:
                continue
            state = (1 + SLOTS) * size / hosts
            fits, over, refused, unknown = [], [], [], []
            for phase in results["phases"]:
                row = measured["phases"].get(phase)
                if phase in KERAS_FILE_PHASES and size > limit:
                    refused.append(phase)
                    continue
                ratio = None if row is None else worst(row, "host_ratio")
                if row is None or "error" in row or ratio is None:
                    unknown.append(phase)
                    continue
                need = ratio * state
                client = row.get("client") if hosts > 1 else None
                if client is not None:
                    need += max(client["over_table"], 0.0) * size
                (fits if need <= HOST_BYTES else over).append(phase)
            out[f"{size:g} x {hosts}"] = {
                "table_bytes": size,
                "hosts": hosts,
                "fits": fits,
                "too_big": over,
                "refused": refused,
                "not_measured": unknown,
            }
    return out


def _size_name(size: float) -> str:
    return f"{size / 1e12:g} TB" if size >= 1e12 else f"{size / 1e9:g} GB"


def sizing_markdown(plan_: dict[str, Any]) -> str:
    """The sizing table as markdown: rows table sizes, columns hosts."""
    hosts = sorted({cell["hosts"] for cell in plan_.values()})
    sizes = sorted({cell["table_bytes"] for cell in plan_.values()})
    header = "| table (float32) | " + " | ".join(
        f"{h} host{'s' if h > 1 else ''}" for h in hosts
    )
    lines = [header + " |", "|---" * (len(hosts) + 1) + "|"]
    for size in sizes:
        cells = []
        for count in hosts:
            cell = plan_.get(f"{size:g} x {count}")
            if cell is None:
                cells.append("-")
                continue
            parts = []
            if cell["too_big"]:
                parts.append("too big: " + ", ".join(cell["too_big"]))
            if cell["refused"]:
                parts.append("refused: Keras files")
            if cell["not_measured"]:
                parts.append("failed: " + ", ".join(cell["not_measured"]))
            if not parts:
                parts.append("every path")
            cells.append("; ".join(p for p in parts if p))
        lines.append(f"| {_size_name(size)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-mib", type=float, default=512)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--sequential", action="store_true")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--files", default=None, help="scratch directory")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.table_mib = 4
        args.sequential = True
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    unknown |= set(args.phases.split(",")) - set(PHASES)
    if unknown:
        parser.error(
            f"unknown {sorted(unknown)}: configs are {list(CONFIGS)}, "
            f"phases {list(PHASES)}"
        )
    files = args.files or tempfile.mkdtemp(prefix="scale_")
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": " ".join(
            ["python", "benchmarks/scale.py"] + (argv or sys.argv[1:])
        ),
        "table_mib": args.table_mib,
        "sequential": args.sequential,
        "phases": [p for p in PHASES if p in args.phases.split(",")],
        "setup": run_process(
            ["--setup", "--table-mib", str(args.table_mib), "--files", files]
        ),
        "configs": {},
    }
    results["keras_file_limit_bytes"] = results["setup"].get(
        "keras_file_limit_bytes", 2 * 2**30
    )
    for name in args.configs.split(","):
        results["configs"][name] = measure_config(name, args, files)
    if args.files is None:
        shutil.rmtree(files, ignore_errors=True)
    results["sizing"] = sizing(results)
    results["wall_s"] = time.perf_counter() - started
    text = table(results)
    text += "\n\nWhich paths fit in 400 GB hosts (V1, Adagrad):\n"
    text += sizing_markdown(results["sizing"])
    results["table"] = text
    print(text, file=sys.stderr if args.json else sys.stdout, flush=True)
    os.makedirs(args.out, exist_ok=True)
    name = "scale_quick.json" if args.quick else "scale.json"
    with open(os.path.join(args.out, name), "w") as handle:
        json.dump(results, handle, indent=1)
    if args.json:
        print(json.dumps(results), flush=True)
    return results


if __name__ == "__main__":
    main()
