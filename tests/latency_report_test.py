"""The latency report: each cell of the default export (and of its
`jit_compile=True` twin) judged against the fastest peer, at p50 and p99
apart."""

from benchmarks import latency_report


def _record(cells):
    return {
        "saved_model_bytes": 1,
        "cells": [
            {
                "batch": batch,
                "threads": threads,
                "p50_ms": p50,
                "p99_ms": p99,
                "vs_fastest_peer": {"ratio": 1.0},
            }
            for (batch, threads), (p50, p99) in cells.items()
        ],
    }


def test_each_cell_is_judged_against_its_fastest_peer_per_quantile():
    latency = {
        "batches": [1, 64],
        "threads": [1],
        "quantized_skipped": "",
        "exports": {
            "kte_cpu": _record({(1, 1): (0.3, 0.5), (64, 1): (0.5, 0.9)}),
            "kte_cpu_xla": _record({(1, 1): (0.1, 0.5), (64, 1): (0.5, 0.7)}),
            # Fastest at p50 in the first cell, not at p99.
            "peer_a": _record({(1, 1): (0.2, 0.9), (64, 1): (0.6, 1.0)}),
            "peer_b": _record({(1, 1): (0.4, 0.6), (64, 1): (0.7, 0.8)}),
        },
    }
    lines = latency_report.target_lines(latency_report.targets(latency))
    cells = [line for line in lines if "thread(s) (target" in line]
    assert cells == [
        "latency kte_cpu batch 1, 1 thread(s) (target <= the fastest peer): "
        "p50 0.30 ms vs peer_a 0.20: NOT met; p99 0.50 ms vs peer_b 0.60: met",
        "latency kte_cpu batch 64, 1 thread(s) (target <= the fastest peer): "
        "p50 0.50 ms vs peer_a 0.60: met; p99 0.90 ms vs peer_b 0.80: NOT met",
        "latency kte_cpu_xla batch 1, 1 thread(s) (target <= the fastest "
        "peer): p50 0.10 ms vs peer_a 0.20: met; p99 0.50 ms vs peer_b 0.60: "
        "met",
        "latency kte_cpu_xla batch 64, 1 thread(s) (target <= the fastest "
        "peer): p50 0.50 ms vs peer_a 0.60: met; p99 0.70 ms vs peer_b 0.80: "
        "met",
    ]
