"""Ratios, targets, the printed table and the bar chart of a benchmark run.

Every ratio divides two medians from one process: a candidate's speed-up is
the anchor's median step time over its own, and its fraction of the bound is
the bound's median over its own. Targets compare this package's
best candidate with the best peer of the same workload.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks import latency_report

MIB = 2**20
W1_TARGET = 1.5
W1_CPU_EXPORT_TARGET = 1.0
"""The `cpu` export (loaded SavedModel; also the layers in serving mode)
over the fastest float32 peer, at least."""
W1_INT8_TARGET = 1.5
"""The int8 export over the fastest float32 peer, at least."""
W2_TARGET = 1.5
W3_TARGET = 1.1
"""Step time at the largest size over the one before it (10^7 / 10^6)."""
RSS_TARGET = 1.25
QUANTIZED = ("_bfloat16", "_int8")


def is_package(name: str) -> bool:
    return name.startswith("kte")


def is_quantized(name: str) -> bool:
    return name.endswith(QUANTIZED)


def rows(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per candidate of a workload (anchors once, from `tf`)."""
    out = []
    processes = workload["processes"]
    for family, process in processes.items():
        if "error" in process:
            out.append(
                {
                    "name": f"({family})",
                    "family": family,
                    "error": process["error"],
                }
            )
            continue
        records = process["candidates"]
        anchor = next(
            (r for r in records.values() if r["role"] == "anchor"), None
        )
        bounds = [
            r["median_step_s"] for r in records.values() if r["role"] == "bound"
        ]
        bound = min(bounds) if bounds else None
        batch = process["spec"]["batch_size"]
        for name, record in records.items():
            if record["role"] != "candidate" and family != _home(processes):
                continue
            if "error" in record:
                out.append(
                    {"name": name, "family": family, "error": record["error"]}
                )
                continue
            median = record["median_step_s"]
            out.append(
                {
                    "name": name,
                    "family": family,
                    "role": record["role"],
                    "description": record["description"],
                    "form": record["form"],
                    "median_ms": median * 1e3,
                    "examples_per_s": batch / median,
                    "steps_per_s": 1 / median,
                    "speedup": anchor["median_step_s"] / median
                    if anchor
                    else None,
                    "bound_fraction": bound / median if bound else None,
                    "peak_rss_added_mib": record["peak_rss_added_bytes"] / MIB,
                    "state_mib": record["state_bytes"] / MIB,
                    "rss_over_state": (
                        record["peak_rss_added_bytes"] / record["state_bytes"]
                        if record["state_bytes"]
                        else None
                    ),
                    "max_abs_diff": record.get("max_abs_diff_to_anchor"),
                }
            )
    return out


def _home(processes: dict[str, Any]) -> str:
    """The family whose process reports the anchor and bound rows."""
    ok = [f for f, p in processes.items() if "error" not in p]
    return "tf" if "tf" in ok else (ok[0] if ok else "")


def targets(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for workload, goal in (("W1", W1_TARGET), ("W2", W2_TARGET)):
        if workload not in results:
            continue
        table = [r for r in results[workload]["rows"] if "error" not in r]
        ours = [r for r in table if is_package(r["name"])]
        peers = [
            r
            for r in table
            if r["role"] in ("anchor", "candidate")
            and not is_package(r["name"])
        ]
        if workload == "W2":
            # The training target is against the plain-TensorFlow anchors
            # (the fastest being raw_xla: XLA lookup, TF's sparse Adagrad).
            peers = [
                r
                for r in peers
                if r["role"] == "anchor" or r["name"] == "raw_xla"
            ]
        if not ours or not peers:
            continue
        best = max(
            (r for r in ours if not is_quantized(r["name"])),
            key=lambda r: r["speedup"],
        )
        peer = max(peers, key=lambda r: r["speedup"])
        # The fastest peers also run beside the package (role "peer", see
        # `candidates.paired_peers`).
        paired_peers = sorted(
            {r["name"] for r in peers}
            | {"raw_xla"}
            | (set() if workload == "W2" else {"keras_embedding_xla"})
        )
        out[workload] = _versus(
            best, peer, goal, paired(results[workload], best, paired_peers)
        )
        if workload == "W1":
            named = {r["name"]: r for r in ours}
            for key, name, target in (
                ("W1_cpu_export", "kte_export_cpu", W1_CPU_EXPORT_TARGET),
                ("W1_cpu_serving", "kte_cpu_serving", W1_CPU_EXPORT_TARGET),
                ("W1_int8", "kte_export_cpu_int8", W1_INT8_TARGET),
            ):
                if name in named:
                    out[key] = _versus(
                        named[name],
                        peer,
                        target,
                        paired(results[workload], named[name], paired_peers),
                    )
                else:
                    out[key] = {
                        "ours": name,
                        "met": None,
                        "reason": _not_measured(results["W1"], name),
                    }
        if workload == "W2":
            rss = {r["name"]: r["rss_over_state"] for r in ours}
            out["W2_rss"] = {
                "rss_over_state": rss,
                "target": RSS_TARGET,
                "met": {
                    name: value <= RSS_TARGET for name, value in rss.items()
                },
            }
    if "W3" in results:
        out["W3"] = {"paths": _scale(results["W3"]), "target": W3_TARGET}
    latency = results.get("latency")
    if latency is not None and "error" not in latency:
        out["latency"] = latency_report.targets(latency)
    return out


def median_targets(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets of the last run, with each W1/W2 ratio target judged on
    the median of its ratio over the runs (a fastest peer that changes from
    run to run is then held to the same bar every time)."""
    out = dict(runs[-1])
    for key, last in runs[-1].items():
        if not isinstance(last, dict) or "ratio" not in last:
            continue
        ratios = [r[key]["ratio"] for r in runs if "ratio" in r.get(key, {})]
        median = statistics.median(ratios)
        out[key] = dict(
            last, ratio=median, runs=ratios, met=median >= last["target"]
        )
    return out


def paired(
    workload: dict[str, Any], ours: dict[str, Any], peers: list[str]
) -> dict[str, Any] | None:
    """`ours` against the fastest of `peers` measured in its own process:
    per round, the peer's median step time over ours; the median of those.

    Returns None when no peer ran beside `ours`.
    """
    process = workload["processes"].get(ours["family"], {})
    records = process.get("candidates", {})
    mine = records.get(ours["name"], {}).get("round_medians_s")
    best = None
    for name in peers:
        theirs = records.get(name, {}).get("round_medians_s")
        if not mine or not theirs or name == ours["name"]:
            continue
        ratio = statistics.median(p / o for p, o in zip(theirs, mine))
        if best is None or ratio < best["ratio"]:
            best = {"peer": name, "ratio": ratio, "rounds": len(mine)}
    return best


def _versus(
    ours: dict[str, Any],
    peer: dict[str, Any],
    goal: float,
    in_process: dict[str, Any] | None = None,
) -> Any:
    """`ours` over `peer`. The target is judged on the ratio paired round by
    round in one process (`in_process`) when the peer ran there; the ratio
    of speed-ups over each process's own anchor is kept beside it."""
    across = ours["speedup"] / peer["speedup"]
    ratio = in_process["ratio"] if in_process else across
    return {
        "ours": ours["name"],
        "fastest_peer": in_process["peer"] if in_process else peer["name"],
        "ratio": ratio,
        "paired_in_process": in_process is not None,
        "ratio_across_processes": across,
        "fastest_peer_across_processes": peer["name"],
        "target": goal,
        "met": ratio >= goal,
    }


def _not_measured(workload: dict[str, Any], name: str) -> str:
    for process in workload["processes"].values():
        record = process.get("candidates", {}).get(name, {})
        if "error" in record:
            return f"failed: {record['error']}"
        if name in process.get("not_measured", {}):
            return str(process["not_measured"][name])
    return "not measured (no process reported it)"


def _scale(workload: dict[str, Any]) -> dict[str, Any]:
    """W3 per path of the package: step times and bounds at each size."""
    steps: dict[str, dict[int, float]] = {}
    bounds: dict[str, dict[int, float]] = {}
    for process in workload["processes"].values():
        for name, record in process.get("candidates", {}).items():
            path, size = name.split("@")
            if path.startswith("gather_bound_"):
                path = "kte_" + path[len("gather_bound_") :]
                into = bounds
            else:
                into = steps
            into.setdefault(path, {})[int(size)] = record["median_step_s"]
    scale = {}
    for path, times in steps.items():
        sizes = sorted(times)
        # The target compares the two largest sizes (both beyond cache);
        # the smallest, cache-resident one is reported beside.
        before, last = sizes[-2:] if len(sizes) > 1 else sizes * 2
        ratio = times[last] / times[before]
        bound = bounds.get(path, {})
        scale[path] = {
            "rows": sizes,
            "step_ms": [times[n] * 1e3 for n in sizes],
            "bound_ms": [bound[n] * 1e3 if n in bound else None for n in sizes],
            "ratio": ratio,
            "ratio_rows": [before, last],
            "bound_ratio": (
                bound[last] / bound[before]
                if before in bound and last in bound
                else None
            ),
            "ratio_to_smallest": times[last] / times[sizes[0]],
            "met": ratio <= W3_TARGET,
        }
    return scale


def _fmt(value: Any, spec: str, empty: str = "-") -> str:
    return empty if value is None else format(value, spec)


def table(results: dict[str, Any]) -> str:
    lines = []
    for workload in ("W1", "W2"):
        if workload not in results:
            continue
        training = workload == "W2"
        unit = "steps/s" if training else "examples/s"
        lines.append(
            f"\n{workload} ({'training' if training else 'serving lookup'})"
        )
        lines.append(
            f"{'candidate':34} {'form':6} {'ms':>7} {unit:>10} "
            f"{'x anchor':>8} {'bound':>6} {'RSS+MiB':>8} {'RSS/state':>9} "
            f"{'diff':>7}"
        )
        for row in results[workload]["rows"]:
            if "error" in row:
                lines.append(f"{row['name']:34} failed: {row['error'][:60]}")
                continue
            speed = row["steps_per_s"] if training else row["examples_per_s"]
            lines.append(
                f"{row['name']:34} {row['form']:6} {row['median_ms']:7.2f} "
                f"{speed:10,.0f} {_fmt(row['speedup'], '8.2f')} "
                f"{_fmt(row['bound_fraction'], '6.2f')} "
                f"{row['peak_rss_added_mib']:8,.0f} "
                f"{_fmt(row['rss_over_state'], '9.2f')} "
                f"{_fmt(row['max_abs_diff'], '7.0e')}"
            )
    goals = results.get("targets", {})
    if "W3" in goals:
        lines.append("\nW3 (training step time against table rows)")
        for path, scale in goals["W3"]["paths"].items():
            steps = ", ".join(
                f"{rows:,} rows {ms:.1f} ms (bound {_fmt(bound, '.1f')})"
                for rows, ms, bound in zip(
                    scale["rows"], scale["step_ms"], scale["bound_ms"]
                )
            )
            before, last = scale["ratio_rows"]
            lines.append(
                f"{path}: {steps}; {before:,} -> {last:,} ratio "
                f"{scale['ratio']:.2f} (bound ratio "
                f"{_fmt(scale['bound_ratio'], '.2f')}), "
                f"{scale['rows'][0]:,} -> {last:,} ratio "
                f"{scale['ratio_to_smallest']:.2f}"
            )
    if "latency" in results:
        lines.append(
            latency_report.table(
                results["latency"], results.get("quantization")
            )
        )
    for workload in ("W1", "W2"):
        for process in results.get(workload, {}).get("processes", {}).values():
            for name, why in process.get("not_measured", {}).items():
                lines.append(f"{workload} {name}: {why}")
    lines.append("\nTargets")
    for name in ("W1", "W1_cpu_export", "W1_cpu_serving", "W1_int8", "W2"):
        if name not in goals:
            continue
        goal = goals[name]
        if goal["met"] is None:
            lines.append(f"{name}: {goal['ours']} {goal['reason']}")
            continue
        how = (
            "paired per round in one process"
            if goal.get("paired_in_process")
            else "speed-ups over each process's anchor"
        )
        if "runs" in goal:
            each = ", ".join(f"{r:.2f}" for r in goal["runs"])
            how += f", median of {len(goal['runs'])} runs ({each})"
        lines.append(
            f"{name}: {goal['ours']} / {goal['fastest_peer']} = "
            f"{goal['ratio']:.2f}x, {how} (target >= {goal['target']}): "
            f"{'met' if goal['met'] else 'NOT met'}; across processes "
            f"{goal['ratio_across_processes']:.2f}x of "
            f"{goal['fastest_peer_across_processes']}"
        )
    if "W3" in goals:
        for path, scale in goals["W3"]["paths"].items():
            before, last = scale["ratio_rows"]
            lines.append(
                f"W3 {path} {before:,} -> {last:,} rows: {scale['ratio']:.2f}x "
                f"(target <= {W3_TARGET}): "
                f"{'met' if scale['met'] else 'NOT met'}"
            )
    if "latency" in goals:
        lines += latency_report.target_lines(goals["latency"])
    if "W2_rss" in goals:
        for name, value in goals["W2_rss"]["rss_over_state"].items():
            lines.append(
                f"W2 RSS {name}: {value:.2f}x state (target <= {RSS_TARGET}): "
                f"{'met' if value <= RSS_TARGET else 'NOT met'}"
            )
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> None:
    """Speed-up over the anchor per candidate, one panel per workload."""
    # Only plots need it, and its backend is chosen before pyplot loads.
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    panels = [w for w in ("W1", "W2") if w in results]
    if not panels:
        return
    figure, axes = pyplot.subplots(
        1, len(panels), figsize=(7 * len(panels), 5), squeeze=False
    )
    for axis, workload in zip(axes[0], panels):
        table = [
            r
            for r in results[workload]["rows"]
            if "error" not in r and r["speedup"]
        ]
        table.sort(key=lambda r: r["speedup"])
        colors = [
            "tab:green"
            if is_package(r["name"])
            else ("tab:gray" if r["role"] == "bound" else "tab:blue")
            for r in table
        ]
        axis.barh(
            [r["name"] for r in table],
            [r["speedup"] for r in table],
            color=colors,
        )
        axis.axvline(1.0, color="black", linewidth=0.8)
        axis.set_xlabel(
            "speed-up over safe_embedding_lookup_sparse (same process)"
        )
        kind = "training steps" if workload == "W2" else "serving lookups"
        axis.set_title(f"{workload}: {kind}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
