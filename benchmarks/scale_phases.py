"""One process of the scale workload: a model on the emulated pod, phases.

    python benchmarks/scale_phases.py --feature V1 --hosts 2 \
        --measure checkpoint_write --files DIR [--table-mib 512]
    python benchmarks/scale_phases.py --setup --files DIR [--table-mib 512]

The model (`build_model`): two identity columns, each its own table of
`--table-mib` MiB (`[rows, 64]` and `[rows / 2, 128]`: two widths, so
that SparseCore does not stack them into one), concatenated into
`Dense(1)`; the tables learn with Adagrad (one slot each). On the emulated
pod (`emulated_tpu`, with `--hosts 2` its hosts each a process of their
own: `emulated_devices.pod_devices(..., host_processes=True)`, 2 replicas
per host), the process builds the model (`create`) and trains one step
(`first_step`), measured or not, then runs the phases `--measure` names,
in `PHASES` order, measuring each (the phases are independent of each
other: what a read phase reads comes from the setup).

Each measured phase starts by resetting the peak resident memory of every
process of the pod (this client and each host process: `5` written to
`/proc/<pid>/clear_refs`) and ends with TF's remote work done
(`async_wait`), then reads each process's `VmHWM` (`/proc/<pid>/status`).
Besides, each process's resident memory before the model existed (its
runtime: Python, TF, Keras; `baseline`) and the bytes of the model's state
on it once the tables exist (`state`, by the device of each variable: the
engine's host copies of tables and slots, the emulated chip's shards, the
dense weights). One JSON line on stdout.

`--setup` writes what the read phases read, from the same model trained
one step on the CPU (no strategy): a `tf.train.Checkpoint(model=...)`, a
`tf.train.Checkpoint(embedding=kte.engine_checkpoint(...))`, a
`.weights.h5` and a checkpoint of the bare tables under names of their
own (the warm start's source), so that no measured process writes what it
reads.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402
from typing import Callable  # noqa: E402

PHASES = (
    "create",
    "first_step",
    "checkpoint_write",
    "checkpoint_read",
    "engine_checkpoint_write",
    "restore_tables",
    "save_weights",
    "load_weights",
    "keras_save",
    "warm_start",
    "export_float32",
    "export_int8",
)
"""The phases, in the order one process runs them."""

DIM = 64
GLOBAL_BATCH = 16
REPLICAS_PER_HOST = 2
SEED = 20240606


def table_shapes(table_mib: float) -> dict[str, tuple[int, int]]:
    """The two tables, each of `table_mib` MiB of float32."""
    rows = int(table_mib * 2**20) // (4 * DIM)
    return {"user": (rows, DIM), "item": (rows // 2, 2 * DIM)}


def tables_measured(table_mib: float) -> dict[str, Any]:
    """What a result says of its tables: each shape, and the largest's
    float32 bytes (what the host ratios divide by)."""
    shapes = table_shapes(table_mib)
    return {
        "tables": {name: list(shape) for name, shape in shapes.items()},
        "table_bytes": max(rows * dim * 4 for rows, dim in shapes.values()),
    }


# ---------------------------------------------------------------- memory


def _status_bytes(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def resident(pid: int) -> int:
    return _status_bytes(pid, "VmRSS")


def peak(pid: int) -> int:
    return _status_bytes(pid, "VmHWM")


def reset_peak(pid: int) -> None:
    """The peak resident mark of `pid` back to its resident memory now."""
    with open(f"/proc/{pid}/clear_refs", "w") as handle:
        handle.write("5")


# ----------------------------------------------------------------- model


def build_model(table_mib: float) -> Any:
    import keras

    import keras_tpu_embed as kte

    columns = [
        kte.embedding_column(
            kte.categorical_column_with_identity(name, rows), dim
        )
        for name, (rows, dim) in table_shapes(table_mib).items()
    ]
    inputs = {
        name: keras.Input((1,), dtype="int64", name=name)
        for name in table_shapes(table_mib)
    }
    layer = kte.TPUEmbeddingLayer(
        columns,
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
        output="concat",
        name="embed",
    )
    output = keras.layers.Dense(1, name="head")(layer(inputs))
    model = keras.Model(inputs, output)
    model.compile(optimizer="sgd", loss="mse")
    return model


def batches(strategy: Any, table_mib: float) -> Any:
    import numpy as np
    import tensorflow as tf

    import keras_tpu_embed as kte

    rng = np.random.default_rng(SEED)
    features = {
        name: rng.integers(0, rows, (GLOBAL_BATCH * 4, 1)).astype(np.int64)
        for name, (rows, _) in table_shapes(table_mib).items()
    }
    labels = rng.normal(size=(GLOBAL_BATCH * 4, 1)).astype(np.float32)
    examples = tf.data.Dataset.from_tensor_slices((features, labels))
    return kte.distribute_dataset(strategy, examples.repeat(), GLOBAL_BATCH)


def table_names(model: Any) -> list[str]:
    return [spec.name for spec in model.get_layer("embed").table_specs]


# ----------------------------------------------------------------- state


def _task_of(device: str) -> str:
    """The process that holds `device`: "client" or "host<task>"."""
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(device)
    if spec.job == "worker":
        return f"host{spec.task}"
    return "client"


def _variable_bytes(variable: Any) -> int:
    return int(variable.shape.num_elements()) * variable.dtype.size


def state_bytes(model: Any, strategy: Any) -> dict[str, dict[str, int]]:
    """Bytes of every variable of the model's state, by holding process
    and kind: `engine` (V1: TF's host copies of tables and slots, one
    shard per host; V2: TF's shards over the replicas), `chip` (the
    emulated chip's shards, V1) and `other` (the model's other weights)."""
    held: dict[str, dict[str, int]] = {}
    seen: set[int] = set()

    def add(variable: Any, kind: str) -> None:
        if id(variable) in seen:
            return
        seen.add(id(variable))
        kinds = held.setdefault(
            _task_of(variable.device), {"engine": 0, "chip": 0, "other": 0}
        )
        kinds[kind] += _variable_bytes(variable)

    engine = model.get_layer("embed").engine
    if engine is not None:
        mid_level = engine.mid_level
        # V1 keeps `_variables` (no public accessor); V2 `variables`.
        tables = getattr(mid_level, "_variables", None) or mid_level.variables
        for slots in tables.values():
            for sharded in slots.values():
                shards = getattr(sharded, "variables", None)
                if shards is None:
                    shards = getattr(sharded, "values", [sharded])
                for shard in shards:
                    add(shard, "engine")
    chip = strategy.emulated_chip
    for table in getattr(chip, "tables", []):
        for shard in table.shards.values():
            for variable in shard.variables.values():
                add(variable, "chip")
    for weight in model.weights:
        variable = getattr(weight, "value", weight)
        shards = getattr(variable, "values", None)
        for shard in shards if shards is not None else [variable]:
            add(shard, "other")
    return held


# ---------------------------------------------------------------- phases


class Run:
    """The pod, the model and the files of one measuring process."""

    def __init__(self, args: argparse.Namespace, strategy: Any) -> None:
        self.args = args
        self.strategy = strategy
        self.model: Any = None
        self.files = args.files
        self.out = os.path.join(args.files, f"out_{os.getpid()}")
        os.makedirs(self.out, exist_ok=True)

    def source(self, name: str) -> str:
        return os.path.join(self.files, "setup", name)

    def create(self) -> None:
        import keras

        keras.utils.set_random_seed(SEED)
        with self.strategy.scope():
            self.model = build_model(self.args.table_mib)

    def first_step(self) -> None:
        self.model.fit(
            batches(self.strategy, self.args.table_mib),
            epochs=1,
            steps_per_epoch=1,
            verbose=0,
        )

    def checkpoint_write(self) -> None:
        import tensorflow as tf

        tf.train.Checkpoint(model=self.model).write(
            os.path.join(self.out, "model")
        )

    def checkpoint_read(self) -> None:
        import tensorflow as tf

        status = tf.train.Checkpoint(model=self.model).read(
            self.source("model")
        )
        status.assert_existing_objects_matched()

    def engine_checkpoint_write(self) -> None:
        import tensorflow as tf

        import keras_tpu_embed as kte

        view = kte.engine_checkpoint(self.model)
        tf.train.Checkpoint(embedding=view).write(
            os.path.join(self.out, "engine")
        )

    def restore_tables(self) -> None:
        import keras_tpu_embed as kte

        kte.restore_tables(self.model, self.source("engine"))

    def save_weights(self) -> None:
        self.model.save_weights(os.path.join(self.out, "m.weights.h5"))

    def load_weights(self) -> None:
        self.model.load_weights(self.source("cpu.weights.h5"))

    def keras_save(self) -> None:
        self.model.save(os.path.join(self.out, "m.keras"))

    def warm_start(self) -> None:
        import keras_tpu_embed as kte

        names = {
            table: f"warm_{index}"
            for index, table in enumerate(table_names(self.model))
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = kte.warm_start(
                self.model, self.source("legacy"), variable_names=names
            )
        if report.not_found:
            # warm_start warns and leaves such tables as they are.
            table, looked_for = next(iter(report.not_found.items()))
            raise RuntimeError(
                f"warm_start left tables {sorted(report.not_found)} "
                f"unloaded: '{table}' {looked_for[0]}"
            )

    def export_float32(self) -> None:
        self._export("float32")

    def export_int8(self) -> None:
        self._export("int8")

    def _export(self, dtype: str) -> None:
        import keras_tpu_embed as kte

        # `inputs="ids"`: with raw inputs, the preprocessor made from
        # the columns refuses engine tables (`check_not_on_engine`).
        kte.export_saved_model(
            self.model,
            os.path.join(self.out, f"export_{dtype}"),
            table_dtype=dtype,
            inputs="ids",
            verbose=False,
        )


def describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def measured(
    action: Callable[[], None], pids: dict[str, int]
) -> dict[str, Any]:
    """Runs `action` between a reset and a read of every process's peak."""
    from tensorflow.python.eager import context

    for pid in pids.values():
        reset_peak(pid)
    start = time.perf_counter()
    record: dict[str, Any] = {}
    try:
        action()
        context.async_wait()
    except Exception as error:  # noqa: BLE001
        # A phase that fails is reported, with its error, beside the others.
        record["error"] = describe(error)
        print(f"failed: {error!r}", file=sys.stderr, flush=True)
    record["seconds"] = time.perf_counter() - start
    record["peak"] = {name: peak(pid) for name, pid in pids.items()}
    return record


def run_phases(args: argparse.Namespace) -> dict[str, Any]:
    import tensorflow as tf

    from keras_tpu_embed.testing import emulated_devices
    from keras_tpu_embed.testing import emulated_tpu

    tf.get_logger().setLevel("ERROR")
    replicas = REPLICAS_PER_HOST * args.hosts
    pids = {"client": os.getpid()}
    if args.hosts > 1:
        emulated_devices.pod_devices(replicas, args.hosts, host_processes=True)
        for task, pid in enumerate(emulated_devices.host_process_ids()):
            pids[f"host{task}"] = pid
    wanted = args.measure.split(",")
    # The read phases read the setup's files: a phase needs only the
    # model and its first step before it.
    runs = [p for p in PHASES if p in wanted or p in ("create", "first_step")]
    result: dict[str, Any] = {
        "feature": args.feature,
        "hosts": args.hosts,
        "replicas": replicas,
        **tables_measured(args.table_mib),
        "phases": {},
    }
    with emulated_tpu(
        replicas, num_hosts=args.hosts, embedding_feature=args.feature
    ) as strategy:
        result["baseline"] = {name: resident(pid) for name, pid in pids.items()}
        run = Run(args, strategy)
        for phase in runs:
            action = getattr(run, phase)
            if phase in wanted:
                record = measured(action, pids)
                result["phases"][phase] = record
                print(f"{phase}: {record}", file=sys.stderr, flush=True)
                if "error" in record and phase in ("create", "first_step"):
                    break
            else:
                action()
            if phase == "first_step":
                result["state"] = state_bytes(run.model, strategy)
    shutil.rmtree(run.out, ignore_errors=True)
    return result


REFERENCE_PHASES = ("checkpoint_write", "checkpoint_read")
"""The phases of `--feature TF`."""


def run_reference(args: argparse.Namespace) -> dict[str, Any]:
    """TF alone, for reference: the engine's host copies as plain
    `tf.Variable`s (each table and slot one variable per host, TF's rows
    per host), written and read with `tf.train.Checkpoint`."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    from keras_tpu_embed.testing import emulated_devices

    tf.get_logger().setLevel("ERROR")
    replicas = REPLICAS_PER_HOST * args.hosts
    pids = {"client": os.getpid()}
    emulated_devices.pod_devices(replicas, args.hosts, host_processes=True)
    for task, pid in enumerate(emulated_devices.host_process_ids()):
        pids[f"host{task}"] = pid
    baseline = {name: resident(pid) for name, pid in pids.items()}
    variables: dict[str, Any] = {}
    state: dict[str, dict[str, int]] = {}
    for name, (rows, dim) in table_shapes(args.table_mib).items():
        base, extra = divmod(rows, args.hosts)
        for task in range(args.hosts):
            shard = [base + (1 if task < extra else 0), dim]
            host = f"/job:worker/replica:0/task:{task}/device:CPU:0"
            for slot in ("parameters", "accumulators"):
                with tf.device(host):
                    variables[f"{name}_{slot}_{task}"] = tf.Variable(
                        tf.fill(shard, 0.5)
                    )
                held = state.setdefault(
                    f"host{task}", {"engine": 0, "chip": 0, "other": 0}
                )
                held["engine"] += shard[0] * shard[1] * 4
    context.async_wait()
    checkpoint = tf.train.Checkpoint(**variables)
    path = os.path.join(args.files, f"reference_{os.getpid()}")
    phases = {
        "checkpoint_write": lambda: checkpoint.write(path),
        "checkpoint_read": lambda: checkpoint.read(path).assert_consumed(),
    }
    measured_phases = {
        phase: measured(action, pids) for phase, action in phases.items()
    }
    for written in glob.glob(path + ".*"):
        os.remove(written)
    return {
        "feature": "TF",
        "hosts": args.hosts,
        "replicas": replicas,
        **tables_measured(args.table_mib),
        "baseline": baseline,
        "state": state,
        "phases": measured_phases,
    }


def setup(args: argparse.Namespace) -> dict[str, Any]:
    """The files the read phases read, from the model on the CPU."""
    import keras
    import tensorflow as tf

    import keras_tpu_embed as kte

    tf.get_logger().setLevel("ERROR")
    directory = os.path.join(args.files, "setup")
    os.makedirs(directory, exist_ok=True)
    keras.utils.set_random_seed(SEED + 1)
    model = build_model(args.table_mib)
    model.fit(
        batches(tf.distribute.get_strategy(), args.table_mib),
        epochs=1,
        steps_per_epoch=1,
        verbose=0,
    )
    tf.train.Checkpoint(model=model).write(os.path.join(directory, "model"))
    tf.train.Checkpoint(embedding=kte.engine_checkpoint(model)).write(
        os.path.join(directory, "engine")
    )
    model.save_weights(os.path.join(directory, "cpu.weights.h5"))
    layer = model.get_layer("embed")
    tf.train.Checkpoint(
        **{
            f"warm_{index}": layer.table_variable(table)
            for index, table in enumerate(table_names(model))
        }
    ).write(os.path.join(directory, "legacy"))
    from keras_tpu_embed.engines.engine import KERAS_FILE_TABLE_LIMIT_BYTES

    return {
        "setup": directory,
        "keras_file_limit_bytes": KERAS_FILE_TABLE_LIMIT_BYTES,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--feature",
        default="V1",
        choices=("V1", "V2", "TF"),
        help="TF: plain variables in the engine's host copies' place, "
        "for reference (checkpoint write and read only, --hosts > 1)",
    )
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--table-mib", type=float, default=512)
    parser.add_argument(
        "--measure",
        default=",".join(PHASES),
        help=f"comma-separated phases to measure, of {PHASES}",
    )
    parser.add_argument("--files", required=True, help="a scratch directory")
    parser.add_argument("--setup", action="store_true")
    args = parser.parse_args(argv)
    unknown = set(args.measure.split(",")) - set(PHASES)
    if unknown:
        parser.error(f"--measure names {sorted(unknown)}, not of {PHASES}")
    if args.setup:
        result = setup(args)
    elif args.feature == "TF":
        result = run_reference(args)
    else:
        result = run_phases(args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
