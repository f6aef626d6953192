"""W1 candidates of this package as an export serves them.

- `kte_cpu_serving`: the `cpu` layers called inside `serving_lookups(CPU)`
  (the lookups an export traces) in a `tf.function` on dense padded ids.
- `kte_export_cpu[_<dtype>]`: the loaded SavedModel of
  `kte.export_saved_model(..., lookup_device="cpu", table_dtype=dtype)`,
  called through its `serving_default` signature: float32, and bfloat16 and
  int8 when the package's export takes `table_dtype` (otherwise the process
  says that they were not measured, and why).

The SavedModels are written, each by a process of its own
(`exports.export_apart`), from `measure.table_values(spec)`, the values
that the output check loads into every other candidate, so their outputs
compare with the anchor's as they are; a quantized export differs by its
quantization error, which is what its diff column shows.
"""

from __future__ import annotations

import contextlib
import tempfile
from typing import Any

import tensorflow as tf

from benchmarks import exports
from benchmarks import models
from benchmarks import tensors
from benchmarks import workloads
from benchmarks.measure import Built
from benchmarks.measure import Candidate
from keras_tpu_embed.placement.devices import LookupDevice


def cpu_serving(
    spec: workloads.Workload, batches: list[workloads.Batch], context: dict
) -> Built:
    layers = models.kte_layers(spec, None)
    for layer in layers:
        layer.build()
    tables = models.kte_tables(layers)
    data = tensors.all_tensors(batches, "dense")
    run = tf.function(
        lambda f: models.kte_call(layers, f, False), reduce_retracing=True
    )

    def step(i: int) -> Any:
        # Entered on every call, so that any (re)trace is of the serving
        # lookups; it costs microseconds against a step of milliseconds.
        with contextlib.ExitStack() as stack:
            for layer in layers:
                stack.enter_context(layer.serving_lookups(LookupDevice.CPU))
            return run(data[i % len(data)].features)

    def load(values: dict[str, Any]) -> None:
        for name, variable in tables.items():
            variable.assign(values[name])

    return Built(
        step=step,
        state_bytes=sum(v.numpy().nbytes for v in tables.values()),
        form="dense",
        outputs=lambda i: tensors.numpy_outputs(step(i)),
        load_tables=load,
    )


def exported(table_dtype: str) -> Any:
    def build(
        spec: workloads.Workload, batches: list[workloads.Batch], context: dict
    ) -> Built:
        path = tempfile.mkdtemp(prefix=f"kte_export_{table_dtype}_")
        name = (
            "kte_cpu" if table_dtype == "float32" else f"kte_cpu_{table_dtype}"
        )
        quick = spec.batch_size < workloads.Workload.batch_size
        if spec != workloads.workload("W1", quick=quick):
            raise ValueError(f"The exports are of W1 only, not of {spec}.")
        exports.export_apart(name, quick, path)
        model = exports.Loaded(path)
        data = [
            exports.dense_inputs(batch, spec.batch_size, 0) for batch in batches
        ]

        def step(i: int) -> Any:
            return model(data[i % len(data)])

        return Built(
            step=step,
            state_bytes=model.bytes,
            form="dense",
            outputs=lambda i: tensors.numpy_outputs(step(i)),
            # Written from the values the check loads: nothing to load.
            load_tables=lambda values: None,
        )

    return build


def candidates() -> tuple[list[Candidate], dict[str, str]]:
    """The candidates, and why each one that is not measured is not."""
    quantized, reason = exports.quantized_dtypes()
    out = [
        Candidate(
            "kte_cpu_serving",
            "this package, cpu layers in serving mode (what an export "
            "traces), dense ids",
            cpu_serving,
        )
    ]
    for dtype in ("float32",) + quantized:
        suffix = "" if dtype == "float32" else f"_{dtype}"
        out.append(
            Candidate(
                f"kte_export_cpu{suffix}",
                f"this package's loaded SavedModel, cpu lookups, {dtype} "
                "tables, serving_default signature",
                exported(dtype),
            )
        )
    notes = {}
    if not quantized:
        for dtype in exports.QUANTIZED:
            notes[f"kte_export_cpu_{dtype}"] = reason
    return out, notes
