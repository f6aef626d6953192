"""export_versions: the pairing of two checkouts' exports, on a fake clock
(what is computed, never how fast anything is)."""

import ast

from benchmarks import export_versions


def test_the_ratio_is_before_over_each_export_per_round(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(export_versions.time, "perf_counter", lambda: clock[0])

    def taking(seconds):
        def call(**inputs):
            clock[0] += seconds

        return call

    serve = {"before": taking(3.0), "after": taking(1.0), "jit": taking(2.0)}
    ratios = export_versions.paired(serve, {}, calls=3, rounds=4)
    assert ratios == {"after": 3.0, "jit": 1.5}


def test_each_checkout_writes_its_workloads_export():
    w1 = export_versions.export_code("W1", "/tmp/x", jit=False)
    w4 = export_versions.export_code("W4", "/tmp/y", jit=True)
    for code in (w1, w4):
        ast.parse(code)  # runs as `python -c` in the checkout
    assert "export_apart('kte_cpu', False, '/tmp/x')" in w1
    assert "export_kte(spec, '/tmp/y', jit=True)" in w4
    assert "jit" not in export_versions.export_code("W4", "/p", jit=False)
