"""Timing and memory of the candidates of one process, in interleaved rounds.

Each candidate is built in turn; its peak resident memory is the high-water
mark from just before its build through its warm-up steps, less the memory
resident before it (Linux resets the mark through `/proc/self/clear_refs`),
so full-table copies made by a step count against the candidate that makes
them. Timing then runs rounds in which every candidate takes a few steps, in
an order that rotates each round, so that drift of the machine (another
process, thermal state) hits every candidate alike. The medians of the step
times are compared with the anchor measured in the same rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import sys
import time
from typing import Any
from typing import Callable

import numpy as np

from benchmarks import workloads


@dataclasses.dataclass
class Built:
    """A candidate ready to run.

    Attributes:
        step: Runs one step (a lookup, or a training step) on batch `i`.
        state_bytes: Bytes of its tables, optimizer slots and dense model.
        form: The input form it reads (ragged / sparse / dense).
        outputs: For lookups, the activations of batch `i` as numpy arrays.
        load_tables: Overwrites its tables with given values, by table name.
        tables: Its table variables, by table name (anchors only: the
            bounds gather from them).
        slots: Its accumulators, by table name (training anchors only).
    """

    step: Callable[[int], Any]
    state_bytes: int
    form: str
    outputs: Callable[[int], dict[str, np.ndarray]] | None = None
    load_tables: Callable[[dict[str, np.ndarray]], None] | None = None
    tables: dict[str, Any] | None = None
    slots: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A named way of doing the workload.

    `build(spec, batches, context)` makes it runnable; `context["anchor"]`
    is the anchor's `Built` once the anchor is built, `context["previous"]`
    the candidate built last (the bounds read their tables rather than
    allocate their own).
    """

    name: str
    description: str
    build: Callable[..., Built]
    role: str = "candidate"
    """"anchor" (the in-process reference), "bound", or "candidate"."""


def _status_kib(field: str) -> int:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def resident_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def peak_bytes() -> int:
    return _status_kib("VmHWM") * 1024


def reset_peak() -> None:
    """Resets the peak-RSS mark to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass


def measure(
    candidates: list[Candidate],
    spec: workloads.Workload,
    batches: list[workloads.Batch],
    rounds: int,
    steps: int,
    warmup: int = 3,
    check: bool = True,
) -> dict[str, Any]:
    """Builds, warms up and times `candidates`; returns one record each."""
    built: dict[str, Built] = {}
    records: dict[str, dict[str, Any]] = {}
    context: dict[str, Built] = {}
    for candidate in candidates:
        before = resident_bytes()
        reset_peak()
        start = time.perf_counter()
        try:
            ready = candidate.build(spec, batches, context)
            for index in range(warmup):
                ready.step(index)
        except Exception as error:  # noqa: BLE001
            # One candidate that cannot run is reported as failed, with
            # its error, beside the others' numbers.
            records[candidate.name] = {
                "description": candidate.description,
                "role": candidate.role,
                "error": describe(error),
            }
            print(f"failed {candidate.name}: {error!r}", file=sys.stderr)
            continue
        peak = peak_bytes()
        if candidate.role == "anchor":
            context["anchor"] = ready
        context["previous"] = ready
        built[candidate.name] = ready
        records[candidate.name] = {
            "description": candidate.description,
            "role": candidate.role,
            "form": ready.form,
            "state_bytes": ready.state_bytes,
            "peak_rss_bytes": peak,
            "peak_rss_added_bytes": max(peak - before, 0),
            "build_and_warmup_s": time.perf_counter() - start,
            "step_times_s": [],
        }
        print(f"built {candidate.name}", file=sys.stderr, flush=True)
    names = list(built)
    counter = warmup
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            times = records[name]["step_times_s"]
            for _ in range(steps):
                begin = time.perf_counter()
                built[name].step(counter)
                times.append(time.perf_counter() - begin)
                counter += 1
            # Per round, for ratios paired round by round (`report.py`).
            records[name].setdefault("round_medians_s", []).append(
                statistics.median(times[-steps:])
            )
    for name in names:
        record = records[name]
        record["median_step_s"] = statistics.median(record["step_times_s"])
    if check and not spec.training:
        _check_outputs(built, records, spec)
    return records


def describe(error: BaseException) -> str:
    """An exception's type and the start of its message, for a report."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def table_values(spec: workloads.Workload) -> dict[str, np.ndarray]:
    """Deterministic table contents for the output check."""
    rng = np.random.default_rng(workloads.SEED + 1)
    return {
        name: rng.standard_normal(shape, dtype=np.float32)
        for name, shape in spec.table_shapes().items()
    }


def _check_outputs(
    built: dict[str, Built],
    records: dict[str, dict[str, Any]],
    spec: workloads.Workload,
) -> None:
    """Loads one set of tables everywhere; compares outputs to the anchor."""
    anchor = next(
        name for name, record in records.items() if record["role"] == "anchor"
    )
    values = table_values(spec)
    reference = None
    for name in [anchor] + [n for n in built if n != anchor]:
        ready = built[name]
        if ready.outputs is None or ready.load_tables is None:
            continue
        ready.load_tables(values)
        got = ready.outputs(0)
        if reference is None:
            reference = got
        records[name]["max_abs_diff_to_anchor"] = max(
            float(np.max(np.abs(got[key] - reference[key])))
            for key in reference
        )


def emit(result: dict[str, Any]) -> None:
    """The process's result as one JSON line on stdout."""
    print(json.dumps(result), flush=True)


def process_main(
    families: Callable[[Any], dict[str, list[Candidate]]],
    references: Callable[[Any], list[Candidate]],
    notes: Callable[[Any, str], dict[str, str]] | None = None,
) -> None:
    """Command line of one measuring process: one workload, one family.

    Measures the `references` (the anchor and the bound, `anchors.py`)
    first, except in W3, which compares the package with itself, then the
    family's candidates; prints the records as one JSON line.
    """
    # Imported by the measuring process only: importing this module (for
    # `Built` and `Candidate`) does not start TensorFlow.
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    parser = argparse.ArgumentParser(description=process_main.__doc__)
    parser.add_argument("--workload", required=True)
    parser.add_argument(
        "--family", required=True, help="a family, or 'all' of this script's"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-check", dest="check", action="store_false")
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated candidates of the family (e.g. "
        "kte_cpu_ragged): measured in this process alone, without the "
        "anchor and bounds, for a peak RSS that no other candidate's freed "
        "memory hides (TensorFlow's oneDNN CPU allocator keeps what it "
        "frees, and the next build reuses it); no anchor, so no ratio",
    )
    args = parser.parse_args()
    spec = workloads.workload(args.workload, quick=args.quick)
    batches = workloads.make_batches(spec)
    groups = families(spec)
    if args.family == "all":
        chosen = [c for group in groups.values() for c in group]
    else:
        chosen = groups[args.family]
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {c.name for c in chosen})
        if unknown:
            parser.error(
                f"--only names {unknown}, not candidates of family "
                f"{args.family!r}: choose from {[c.name for c in chosen]}"
            )
        chosen = [c for c in chosen if c.name in names]
    elif spec.name != "W3":
        chosen = references(spec) + chosen
    # A peer repeated for pairing (role "peer") is measured once when its
    # own family runs in the same process ('all').
    own = {c.name for c in chosen if c.role != "peer"}
    chosen = [c for c in chosen if c.role != "peer" or c.name not in own]
    records = measure(
        chosen,
        spec,
        batches,
        args.rounds,
        args.steps,
        warmup=1 if args.quick else 3,
        # The output check compares with the anchor, absent with --only.
        check=args.check and not args.only,
    )
    emit(
        {
            "workload": spec.name,
            "family": args.family,
            "spec": dataclasses.asdict(spec),
            "gathered_rows": batches[0].gathered_rows(),
            "candidates": records,
            # Candidates not measured, each with the reason.
            "not_measured": notes(spec, args.family) if notes else {},
        }
    )
