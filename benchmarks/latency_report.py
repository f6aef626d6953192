"""The latency and quantization parts of a run: table, targets and plot.

`latency` is the JSON of `latency.py` (loaded SavedModels, p50 / p99 per
batch size and thread count, errors per table, sizes); `quantization` is
that of `quantization.py` (the demo's AUC through each export).
"""

from __future__ import annotations

from typing import Any

INT8_SIZE_TARGET = 0.3
"""int8 SavedModel bytes over the float32 one's, at most."""


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _cell(record: dict[str, Any], batch: int, threads: int) -> Any:
    return next(
        c
        for c in record["cells"]
        if c["batch"] == batch and c["threads"] == threads
    )


def targets(latency: dict[str, Any]) -> dict[str, Any]:
    """int8 size against float32; the paired ratios at the largest batch."""
    exported = latency["exports"]
    out: dict[str, Any] = {}
    failed = {n: r["error"] for n, r in exported.items() if "error" in r}
    exported = {n: r for n, r in exported.items() if n not in failed}
    if "kte_cpu_int8" in failed or "kte_cpu" in failed:
        out["int8_size"] = {
            "met": None,
            "reason": "failed: "
            + failed.get("kte_cpu_int8", failed.get("kte_cpu", "")),
        }
    elif "kte_cpu_int8" in exported:
        float32 = exported["kte_cpu"]["saved_model_bytes"]
        ratio = exported["kte_cpu_int8"]["saved_model_bytes"] / float32
        out["int8_size"] = {
            "ratio": ratio,
            "target": INT8_SIZE_TARGET,
            "met": ratio <= INT8_SIZE_TARGET,
        }
    else:
        out["int8_size"] = {
            "met": None,
            "reason": latency["quantized_skipped"],
        }
    largest = max(latency["batches"])
    out["largest_batch"] = {
        name: {
            threads: _cell(record, largest, threads)["vs_fastest_peer"]["ratio"]
            for threads in latency["threads"]
        }
        for name, record in exported.items()
        if name.startswith("kte")
    }
    out["cells"] = {
        name: cell_targets(latency, exported, name)
        for name in JUDGED
        if name in exported
    }
    out["failed"] = failed
    return out


JUDGED = ("kte_cpu", "kte_cpu_xla")
"""The default export, and the same with `jit_compile=True`."""


def cell_targets(
    latency: dict[str, Any], exported: dict[str, Any], name: str
) -> list[dict[str, Any]]:
    """Export `name` against the fastest peer of each cell, at p50 and at
    p99 apart (the fastest peer at one need not be at the other)."""
    peers = {n: r for n, r in exported.items() if not n.startswith("kte")}
    cells = []
    for batch in latency["batches"]:
        for threads in latency["threads"]:
            ours = _cell(exported[name], batch, threads)
            cell: dict[str, Any] = {"batch": batch, "threads": threads}
            for quantile in ("p50_ms", "p99_ms"):
                peer = min(
                    peers,
                    key=lambda n: _cell(peers[n], batch, threads)[quantile],
                )
                best = _cell(peers[peer], batch, threads)[quantile]
                cell[quantile] = {
                    "ours": ours[quantile],
                    "peer": peer,
                    "peer_ms": best,
                    "met": ours[quantile] <= best,
                }
            cells.append(cell)
    return cells


def table(latency: dict[str, Any], quantization: dict[str, Any] | None) -> str:
    lines = ["\nLatency (loaded SavedModels, serving_default, dense ids)"]
    if "error" in latency:
        return "\n".join(lines + [f"failed: {latency['error']}"])
    lines.append(
        f"{'export':26} {'batch':>5} {'thr':>3} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'examples/s':>11} {'x peer':>6} {'faults':>6} {'diff':>7} "
        f"{'MiB':>7}"
    )
    for name, record in latency["exports"].items():
        if "error" in record:
            lines.append(f"{name:26} failed: {record['error']}")
            continue
        for cell in record["cells"]:
            lines.append(
                f"{name:26} {cell['batch']:5d} {cell['threads']:3d} "
                f"{cell['p50_ms']:8.2f} {cell['p99_ms']:8.2f} "
                f"{cell['examples_per_s']:11,.0f} "
                f"{_fmt(cell['vs_fastest_peer']['ratio'], '6.2f')} "
                f"{_fmt(cell.get('page_faults_per_call'), '6.0f')} "
                f"{record['max_abs_diff']:7.0e} "
                f"{record['saved_model_bytes'] / 2**20:7.1f}"
            )
    if latency["quantized_skipped"]:
        lines.append(f"quantized exports: {latency['quantized_skipped']}")
    lines.append(
        "x peer: median over rounds of examples/s over the fastest float32 "
        "peer's in the same round; faults: the process's minor page faults "
        "per call (freed memory taken back from the system; see "
        "docs/performance.md); diff: max abs vs the float32 reference"
    )
    lines.append("\nQuantization (W1 tables; max abs error per table)")
    float32 = latency["exports"]["kte_cpu"].get("saved_model_bytes")
    for name, record in latency["exports"].items():
        if not name.startswith("kte_cpu") or "error" in record:
            continue
        errors = ", ".join(
            f"{table} {error:.1e}"
            for table, error in record["max_abs_diff_per_table"].items()
        )
        lines.append(
            f"{name:26} {errors}; SavedModel "
            f"{record['saved_model_bytes'] / 2**20:,.1f} MiB "
            + (
                f"({record['saved_model_bytes'] / float32:.2f}x float32)"
                if float32
                else ""
            )
        )
    if quantization is None:
        return "\n".join(lines)
    if "error" in quantization:
        lines.append(f"demo AUC: failed: {quantization['error']}")
        return "\n".join(lines)
    lines.append(
        f"demo ({quantization['examples']:,} examples, "
        f"{quantization['epochs']} epochs, {quantization['held_out']:,} "
        "held out), through each loaded export:"
    )
    for dtype, record in quantization["demo"].items():
        if "error" in record or "auc_diff" not in record:
            lines.append(f"  {dtype:9} {record.get('error', 'no float32')}")
            continue
        lines.append(
            f"  {dtype:9} AUC {record['auc']:.4f} "
            f"(diff {record['auc_diff']:+.4f}), max |score diff| "
            f"{record['max_abs_score_diff']:.1e}, SavedModel "
            f"{record['saved_model_bytes'] / 2**20:,.2f} MiB "
            f"({record['size_ratio']:.2f}x)"
        )
    if quantization["quantized_skipped"]:
        lines.append(f"  bfloat16, int8: {quantization['quantized_skipped']}")
    return "\n".join(lines)


def target_lines(goals: dict[str, Any]) -> list[str]:
    lines = []
    size = goals.get("int8_size")
    if size is not None and size["met"] is None:
        lines.append(f"int8 SavedModel size: {size['reason']}")
    elif size is not None:
        lines.append(
            f"int8 SavedModel / float32: {size['ratio']:.2f}x (target <= "
            f"{size['target']}): {'met' if size['met'] else 'NOT met'}"
        )
    for name, cells in goals.get("cells", {}).items():
        for cell in cells:
            judged = [
                f"{quantile[:3]} {c['ours']:.2f} ms vs {c['peer']} "
                f"{c['peer_ms']:.2f}: {'met' if c['met'] else 'NOT met'}"
                for quantile, c in ((q, cell[q]) for q in ("p50_ms", "p99_ms"))
            ]
            lines.append(
                f"latency {name} batch {cell['batch']}, "
                f"{cell['threads']} thread(s) (target <= the fastest peer): "
                + "; ".join(judged)
            )
    for name, ratios in goals.get("largest_batch", {}).items():
        paired = ", ".join(
            f"{threads} thread(s) {_fmt(ratio, '.2f')}x"
            for threads, ratio in ratios.items()
        )
        lines.append(
            f"latency {name} / fastest peer at the largest batch: {paired}"
        )
    return lines


def plot(latency: dict[str, Any], path: str) -> None:
    """p50 (solid) and p99 (dotted) latency against batch, per export."""
    # Only plots need it, and its backend is chosen before pyplot loads.
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    threads = latency["threads"]
    figure, axes = pyplot.subplots(
        1, len(threads), figsize=(7 * len(threads), 5), squeeze=False
    )
    for axis, count in zip(axes[0], threads):
        for index, (name, record) in enumerate(latency["exports"].items()):
            cells = sorted(
                (c for c in record["cells"] if c["threads"] == count),
                key=lambda c: c["batch"],
            )
            color = f"C{index % 10}"
            batches = [c["batch"] for c in cells]
            axis.plot(
                batches,
                [c["p50_ms"] for c in cells],
                marker="o",
                color=color,
                linestyle="-" if name.startswith("kte") else "--",
                label=name,
            )
            axis.plot(
                batches,
                [c["p99_ms"] for c in cells],
                color=color,
                linestyle=":",
                linewidth=0.8,
            )
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("batch size")
        axis.set_ylabel("latency per call, ms (p50 marked, p99 dotted)")
        axis.set_title(f"SavedModel serving_default, {count} thread(s)")
        axis.grid(True, which="both", linewidth=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
