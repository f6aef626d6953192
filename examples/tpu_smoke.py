"""Smoke run for a TPU VM: the report to send back after a first TPU run.

    PJRT_DEVICE=TPU NEXT_PLUGGABLE_DEVICE_USE_C_API=true \\
    TF_PLUGGABLE_DEVICE_LIBRARY_PATH=$(python -c \\
        'import libtpu; print(libtpu.get_library_path())') \\
    python examples/tpu_smoke.py --tpu local --output-dir /tmp/kte_smoke

It prints the environment (versions, accelerator, replicas, hosts, the
TPU's `embedding_feature`, devices, the environment variables TensorFlow
needs on TPU VMs), then runs stages, each printed PASS, FAIL (with its whole
traceback) or SKIP (with the reason):

- build: the demo's ranking model under `TPUStrategy`: sparse ids (a
  vocabulary file, a vocabulary list), weighted multi-hot tags, an item
  table shared with a history sequence, and the item ids fed dense
  `[batch, 1]`, every table on the TPU embedding engine;
- fit: a first step, then `model.fit` with validation data; the loss must go
  down and every layer's `embedding_step` must equal the steps run;
- evaluate: `model.evaluate` on the validation data (same batch size);
- checkpoint: `kte.engine_checkpoint` after the first step and at the end;
- cpu_restore: both checkpoints restored into the same model built on CPU;
  every table must have changed between them (the engine trained them);
- export: `kte.export_saved_model` of the TPU model itself (its tables read
  from the TPU a block of rows at a time, no optimizer slots);
- serve: the SavedModel on raw features against the TPU model's predictions
  on the same examples (float32 matmul precision on both sides), row by
  row: on a pod this checks that `predict` returned the rows in input
  order (the predictions differ from row to row, so any permutation
  shows).

Without a TPU, `--emulate V1` (or `V2`, SparseCore: `TPUEmbeddingV2`; or
`UNSUPPORTED`, a TPU without an engine) runs the same stages under
`keras_tpu_embed.testing.emulated_tpu` on 2 logical CPU devices
(`--replicas`): TF's own mid-level code, only the chip emulated.
`--hosts 2 --replicas 4` emulates a pod slice of 2 hosts, where the serve
stage also checks that `predict` kept the input's row order.
That is a rehearsal, not the TPU report.

The last line is `SMOKE PASS`, `SMOKE FAIL at <stage>` or `SMOKE SKIP:
<reason>`, and a JSON summary is written to `<output-dir>/smoke_summary.json`.
A machine without a TPU is a SKIP with the reason.

No machine this package is developed on has a TPU, so this script has not
run on one. The tests run it on CPU (SKIP, tests/examples_test.py) and
under `--emulate` (tests/emulated/tpu_smoke_test.py): that checks the
flow and the report, not the TPU.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import sys
import tempfile
import time
import traceback
from typing import Any
from typing import Iterator

import numpy as np

import keras_tpu_embed as kte
from keras_tpu_embed import demo
from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.placement import hardware as tpu_hardware

STAGES = (
    "build",
    "fit",
    "evaluate",
    "checkpoint",
    "cpu_restore",
    "export",
    "serve",
)

# What keras-rs' TPU CI and TF-on-TPU-VM guides set before importing
# TensorFlow (PJRT runtime through the pluggable-device C API).
TPU_ENVIRONMENT = {
    "PJRT_DEVICE": "TPU",
    "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
    "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": (
        "$(python -c 'import libtpu; print(libtpu.get_library_path())')"
    ),
}


class Skip(Exception):
    """A stage that cannot run on this machine, with the reason."""


class Report:
    """Stages with PASS / FAIL / SKIP, printed as they end; a JSON summary."""

    def __init__(self) -> None:
        self.environment: dict[str, Any] = {}
        self.stages: list[dict[str, Any]] = []
        self.numbers: dict[str, Any] = {}

    @property
    def failed_stage(self) -> str | None:
        for stage in self.stages:
            if stage["status"] == "FAIL":
                return str(stage["name"])
        return None

    @property
    def skip_reason(self) -> str | None:
        for stage in self.stages:
            if stage["status"] == "SKIP":
                return str(stage["reason"])
        return None

    @property
    def result(self) -> str:
        if self.failed_stage:
            return "FAIL"
        if self.skip_reason or len(self.stages) < len(STAGES):
            return "SKIP"
        return "PASS"

    @property
    def stopped(self) -> bool:
        """A stage failed or was skipped: the later ones depend on it."""
        return bool(self.failed_stage or self.skip_reason)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[dict[str, Any]]:
        details: dict[str, Any] = {}
        entry: dict[str, Any] = {"name": name, "details": details}
        start = time.perf_counter()
        try:
            yield details
        except Skip as skip:
            entry.update(status="SKIP", reason=str(skip))
            print(f"SKIP {name}: {skip}", flush=True)
        except Exception as error:  # noqa: BLE001 - the report shows it all
            entry.update(
                status="FAIL",
                error=f"{type(error).__name__}: {error}",
                traceback=traceback.format_exc(),
            )
            print(f"FAIL {name}: {type(error).__name__}: {error}")
            print(entry["traceback"], flush=True)
        else:
            entry["status"] = "PASS"
            shown = ", ".join(f"{k}={v}" for k, v in details.items())
            print(f"PASS {name}" + (f" ({shown})" if shown else ""), flush=True)
        entry["seconds"] = round(time.perf_counter() - start, 3)
        self.stages.append(entry)

    def summary(self) -> dict[str, Any]:
        return {
            "result": self.result,
            "failed_stage": self.failed_stage,
            "skip_reason": self.skip_reason,
            "environment": self.environment,
            "stages": self.stages,
            "numbers": self.numbers,
        }

    def final_line(self) -> str:
        if self.result == "FAIL":
            return f"SMOKE FAIL at {self.failed_stage}"
        if self.result == "SKIP":
            return f"SMOKE SKIP: {self.skip_reason}"
        return "SMOKE PASS"

    def write(self, path: str) -> None:
        with open(path, "w") as handle:
            json.dump(self.summary(), handle, indent=2, default=str)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment(strategy: Any = None) -> dict[str, Any]:
    """Versions, accelerator, topology and TPU environment variables."""
    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "tensorflow": tf.__version__,
        "tensorflow_distribution": next(
            (
                f"{name} {_version(name)}"
                for name in ("tensorflow-tpu", "tensorflow-cpu", "tensorflow")
                if _version(name) != "not installed"
            ),
            "unknown",
        ),
        "keras": keras.__version__,
        "libtpu": _version("libtpu"),
        "keras_tpu_embed": kte.__version__,
        "accelerator_type": os.environ.get("TPU_ACCELERATOR_TYPE", "unknown"),
        "devices": [d.name for d in tf.config.list_logical_devices()],
        "variables": {k: os.environ.get(k) for k in TPU_ENVIRONMENT},
    }
    if strategy is not None:
        report["strategy"] = type(strategy).__name__
        report["replicas"] = strategy.num_replicas_in_sync
        report["hosts"] = getattr(strategy.extended, "num_hosts", 1)
        hardware = getattr(strategy.extended, "tpu_hardware_feature", None)
        report["embedding_feature"] = (
            str(hardware.embedding_feature) if hardware is not None else None
        )
        report["embedding_hardware"] = tpu_hardware.embedding_hardware(
            strategy
        ).value
    return report


def print_environment(report: dict[str, Any]) -> None:
    print("== keras_tpu_embed TPU smoke run ==")
    for key, value in report.items():
        if key != "variables":
            print(f"{key}: {value}")
    missing = []
    for name, value in report["variables"].items():
        print(f"{name}={value if value is not None else '(not set)'}")
        if value is None:
            missing.append(name)
    if missing:
        exports = " ".join(f"{k}={TPU_ENVIRONMENT[k]}" for k in missing)
        print(
            f"HINT: {missing} are not set. On a TPU VM, TensorFlow reaches "
            f"the TPU through PJRT when they are set before it starts: "
            f"{exports} python examples/tpu_smoke.py ...",
            flush=True,
        )


def connect(tpu: str) -> Any:
    """A `TPUStrategy` on the TPU named `tpu` ("local" on a TPU VM)."""
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def build_model(
    preprocessor: kte.FeaturePreprocessor,
    own: list[Any],
    shared: list[Any],
    dense_item_ids: bool,
) -> keras.Model:
    """The demo's ranker; with `dense_item_ids`, item ids come `[batch, 1]`."""
    inputs = preprocessor.keras_inputs()
    if dense_item_ids:
        inputs["item_id"] = keras.Input((1,), dtype="int64", name="item_id")
    model = demo.build_model(preprocessor, own, shared, inputs=inputs)
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3), loss="binary_crossentropy"
    )
    return model


def _embedding_layers(model: keras.Model) -> list[Any]:
    return [
        layer
        for layer in model.layers
        if isinstance(layer, kte.TPUEmbeddingLayer)
    ]


def _cpu_tables(model: keras.Model) -> dict[str, Any]:
    return {
        table.name: layer.table_variable(table.name).numpy()
        for layer in _embedding_layers(model)
        for table in layer.local_table_specs
    }


def run(
    strategy: Any,
    output_dir: str,
    steps: int = 100,
    epochs: int = 3,
    global_batch_size: int = 1024,
    num_examples: int = 50_000,
    tolerance: float = 1e-3,
    report: Report | None = None,
) -> dict[str, Any]:
    """Runs the stages on `strategy`; returns the JSON summary.

    Args:
        strategy: The `TPUStrategy` (any strategy: a non-TPU one is a SKIP).
        output_dir: Where the vocabulary, checkpoints, SavedModel and
            `smoke_summary.json` go.
        steps: Training steps per epoch.
        epochs: Epochs of `model.fit`; the loss must go down over them.
        global_batch_size: The batch over all replicas (fit, evaluate and
            predict use the same one: TF fixes it at the first step).
        num_examples: Size of the synthetic click log.
        tolerance: Largest |served - TPU| prediction difference allowed.
        report: Where to record the stages (a new one by default).

    Returns:
        The summary written to `<output_dir>/smoke_summary.json`.
    """
    report = report or Report()
    if not report.environment:
        report.environment = environment(strategy)
        print_environment(report.environment)
    # Full float32 matmuls for the served-vs-TPU comparison: with
    # TensorFloat-32 off, TF's XLA kernels ask for HIGHEST precision
    # (tf2xla, e.g. GetPrecisionConfig in conv_op_helpers.cc), on TPUs too.
    tf.config.experimental.enable_tensor_float_32_execution(False)
    keras.utils.set_random_seed(0)
    try:
        _stages(
            strategy,
            output_dir,
            steps,
            epochs,
            global_batch_size,
            num_examples,
            tolerance,
            report,
        )
    finally:
        report.write(os.path.join(output_dir, "smoke_summary.json"))
    print(report.final_line(), flush=True)
    return report.summary()


def _stages(
    strategy: Any,
    output_dir: str,
    steps: int,
    epochs: int,
    global_batch_size: int,
    num_examples: int,
    tolerance: float,
    report: Report,
) -> None:
    hardware = tpu_hardware.embedding_hardware(strategy)
    features, labels = demo.make_click_log(num_examples)
    split = num_examples - max(global_batch_size * 2, num_examples // 5)
    train_raw = ({k: v[:split] for k, v in features.items()}, labels[:split])
    valid_raw = ({k: v[split:] for k, v in features.items()}, labels[split:])
    own, shared = demo.build_columns(demo.write_user_vocabulary(output_dir))
    preprocessor = kte.FeaturePreprocessor(own + shared)

    def tpu_features(raw: dict[str, Any]) -> dict[str, Any]:
        ids = preprocessor(raw)
        # One item id per example, fed dense [batch, 1] to the engine.
        ids["item_id"] = tf.reshape(
            tf.sparse.to_dense(ids["item_id"], default_value=-1), [-1, 1]
        )
        return ids

    def distributed(raw: tuple[dict, Any], repeat: bool) -> Any:
        examples = tf.data.Dataset.from_tensor_slices(raw)
        return kte.distribute_dataset(
            strategy,
            examples.repeat() if repeat else examples,
            global_batch_size,
            preprocessor=tpu_features,
            # A TPU without an engine pads the ids of these on the host.
            columns=own + shared,
        )

    with report.stage("build") as details:
        details["embedding_hardware"] = hardware.value
        if hardware is tpu_hardware.EmbeddingHardware.NONE:
            raise Skip(
                f"no TPU: the strategy is {type(strategy).__name__}, not "
                "TPUStrategy; run on a TPU VM with --tpu local"
            )
        try:
            with strategy.scope():
                model = build_model(preprocessor, own, shared, True)
        except (RuntimeError, ValueError) as error:
            refused = (
                hardware is tpu_hardware.EmbeddingHardware.NO_ENGINE
                and "has no embedding engine" in str(error)
            )
            if refused:
                raise Skip(str(error)) from error
            raise
        details["engine_tables"] = sorted(
            table.name
            for layer in _embedding_layers(model)
            for table in layer.table_specs
            if table not in layer.local_table_specs
        )
    if report.stopped:
        return

    train = distributed(train_raw, repeat=True)
    valid = distributed(valid_raw, repeat=False)
    with report.stage("fit") as details:
        model.fit(train, epochs=1, steps_per_epoch=1, verbose=0)
        start_path = tf.train.Checkpoint(
            embedding=kte.engine_checkpoint(model)
        ).write(os.path.join(output_dir, "tables_after_first_step"))
        start = time.perf_counter()
        history = model.fit(
            train,
            epochs=epochs,
            steps_per_epoch=steps,
            validation_data=valid,
            verbose=2,
        )
        seconds = time.perf_counter() - start
        losses = [float(x) for x in history.history["loss"]]
        details["losses"] = [round(x, 5) for x in losses]
        details["val_losses"] = [
            round(float(x), 5) for x in history.history["val_loss"]
        ]
        details["steps_per_second"] = round(epochs * steps / seconds, 2)
        details["embedding_step"] = {
            layer.name: int(layer.embedding_step.numpy())
            for layer in _embedding_layers(model)
        }
        report.numbers.update(details)
        if not all(math.isfinite(x) for x in losses):
            raise AssertionError(f"non-finite training loss: {losses}")
        if not losses[-1] < losses[0]:
            raise AssertionError(f"the loss did not go down: {losses}")
        expected = 1 + epochs * steps
        wrong = {
            name: step
            for name, step in details["embedding_step"].items()
            if step != expected
        }
        if wrong:
            raise AssertionError(
                f"embedding_step should be {expected} (steps run): {wrong}"
            )
    if report.stopped:
        return

    with report.stage("evaluate") as details:
        evaluation = model.evaluate(valid, return_dict=True, verbose=0)
        details["loss"] = round(float(evaluation["loss"]), 5)
        last_validation = float(history.history["val_loss"][-1])
        if not math.isclose(evaluation["loss"], last_validation, rel_tol=1e-3):
            raise AssertionError(
                f"evaluate's loss {evaluation['loss']} differs from fit's "
                f"last val_loss {last_validation} on the same data"
            )
    if report.stopped:
        return

    with report.stage("checkpoint") as details:
        end_path = tf.train.Checkpoint(
            embedding=kte.engine_checkpoint(model)
        ).write(os.path.join(output_dir, "tables"))
        details["path"] = end_path
    if report.stopped:
        return

    with report.stage("cpu_restore") as details:
        # The same model outside the strategy, with the preprocessor's
        # (sparse) item ids: the engine's checkpoints restore there by
        # table name.
        cpu_model = build_model(preprocessor, own, shared, False)
        restore = tf.train.Checkpoint(
            embedding=kte.engine_checkpoint(cpu_model)
        )
        restore.read(start_path).assert_existing_objects_matched()
        first = _cpu_tables(cpu_model)
        restore.read(end_path).assert_existing_objects_matched()
        last = _cpu_tables(cpu_model)
        moved = {
            name: float(np.max(np.abs(last[name] - first[name])))
            for name in last
        }
        details["max_table_change"] = moved
        unchanged = sorted(
            name for name, change in moved.items() if change == 0
        )
        if unchanged:
            raise AssertionError(f"the engine did not train {unchanged}")
    if report.stopped:
        return

    export_dir = os.path.join(output_dir, "serving")
    with report.stage("export") as details:
        # The trained model itself: no CPU model, no optimizer slots.
        kte.export_saved_model(model, export_dir, preprocessor=preprocessor)
        details["export_dir"] = export_dir
    if report.stopped:
        return

    with report.stage("serve") as details:
        sample = {k: v[:global_batch_size] for k, v in valid_raw[0].items()}
        on_tpu = model.predict(
            distributed((sample, valid_raw[1][:global_batch_size]), False),
            verbose=0,
        )[:, 0]
        serve = tf.saved_model.load(export_dir).signatures["serving_default"]
        raw = {
            k: tf.constant(v, tf.int64 if v.dtype == np.int64 else None)
            for k, v in sample.items()
        }
        served = serve(**raw)["click"].numpy()[:, 0]
        difference = float(np.max(np.abs(served - on_tpu)))
        details["examples"] = len(served)
        # Rows that predict alike could be swapped unseen.
        details["distinct_predictions"] = len(np.unique(served.round(6)))
        if details["distinct_predictions"] < len(served) // 2:
            raise AssertionError(
                f"only {details['distinct_predictions']} distinct "
                f"predictions of {len(served)}: a row permutation by "
                "predict would not show"
            )
        details["max_difference"] = difference
        report.numbers["max_difference"] = difference
        if not difference <= tolerance:
            raise AssertionError(
                f"served and TPU predictions differ by {difference} "
                f"> {tolerance}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tpu", default="local")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--global-batch-size", type=int, default=1024)
    parser.add_argument("--num-examples", type=int, default=50_000)
    parser.add_argument("--output-dir", default=None)
    parser.add_argument(
        "--emulate",
        choices=("V1", "V2", "UNSUPPORTED"),
        default=None,
        help="no TPU: run under keras_tpu_embed.testing.emulated_tpu with this "
        "embedding_feature (in a fresh process)",
    )
    parser.add_argument(
        "--replicas", type=int, default=2, help="replicas of --emulate"
    )
    parser.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="hosts of --emulate, dividing --replicas (2: a pod slice, "
        "whose predict must keep the input's row order)",
    )
    args = parser.parse_args(argv)
    # A failure must show the whole traceback, Keras frames included.
    keras.config.disable_traceback_filtering()
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="kte_tpu_smoke_")
    os.makedirs(output_dir, exist_ok=True)
    report = Report()
    if args.emulate:
        return _emulated(args, output_dir, report)
    strategy = None
    try:
        strategy = connect(args.tpu)
    except Exception as error:  # noqa: BLE001 - reported as the reason
        first_line = str(error).strip().splitlines()[0] if str(error) else ""
        reason = f"no TPU reachable ({type(error).__name__}: {first_line})"
    report.environment = environment(strategy)
    print_environment(report.environment)
    if strategy is None:
        with report.stage("connect"):
            raise Skip(reason)
        report.write(os.path.join(output_dir, "smoke_summary.json"))
        print(report.final_line(), flush=True)
    else:
        run(
            strategy,
            output_dir,
            steps=args.steps,
            epochs=args.epochs,
            global_batch_size=args.global_batch_size,
            num_examples=args.num_examples,
            report=report,
        )
    print(f"Summary: {os.path.join(output_dir, 'smoke_summary.json')}")
    return {"PASS": 0, "FAIL": 1, "SKIP": 2}[report.result]


def _emulated(args: argparse.Namespace, output_dir: str, report: Report) -> int:
    """The stages under `emulated_tpu`, in place of a TPU."""
    from keras_tpu_embed.testing import emulated_tpu

    with emulated_tpu(
        args.replicas, num_hosts=args.hosts, embedding_feature=args.emulate
    ) as tpu:
        report.environment = environment(tpu)
        report.environment["emulated"] = args.emulate
        print_environment(report.environment)
        run(
            tpu,
            output_dir,
            steps=args.steps,
            epochs=args.epochs,
            global_batch_size=args.global_batch_size,
            num_examples=args.num_examples,
            report=report,
        )
    print(f"Summary: {os.path.join(output_dir, 'smoke_summary.json')}")
    return {"PASS": 0, "FAIL": 1, "SKIP": 2}[report.result]


if __name__ == "__main__":
    sys.exit(main())
