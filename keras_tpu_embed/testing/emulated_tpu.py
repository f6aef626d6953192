"""`emulated_tpu`: a TPU system on CPU devices, for tests and CI.

No TPU is needed to run a model's TPU code path: under
`emulated_tpu(num_replicas, embedding_feature=...)` the layers see a
`tf.distribute.TPUStrategy` with that hardware and take exactly the branch
they take on a TPU VM. What runs is TensorFlow's own code wherever the
real system runs code off the TPU chip:

- `tf.tpu.experimental.embedding.TPUEmbedding` itself: its config checks,
  its configuration proto, its lazy variable creation with one shard per
  host (`make_sharded_variable_creator`, `shard_info`), its checkpoint
  hooks that retrieve tables before a save and load them after a restore,
  and its enqueue rules (inputs on the host, direct inputs of the step,
  output shapes);
- the replicas are `MirroredStrategy` replicas of `tf.distribute` (merge
  calls, mirrored variables and their aggregation), inside a replicate
  context that TF's enqueue recognizes as a TPU computation, with each
  input of the step marked as a direct input as `tpu.replicate` marks it
  (under TPUStrategy's dynamic padding, TF's own `_pad_all_input` decides
  whether the step's dense inputs lose the mark);
- Keras treats the strategy as a TPUStrategy (loss reduction, predict
  output order).

Only the chip is replaced (`emulated_chip.py`): the engine's device ops run
as CPU kernels that combine rows and apply the optimizer of TF's config
proto (`engine_rules.py`).

Under `embedding_feature="V2"` (SparseCore, v5p/v6e) the mid-level object
is TF's own `tf.tpu.experimental.embedding.TPUEmbeddingV2`: its table
stacking, its variables sharded over the chips, its input preprocessing
and `apply_gradients` run unmodified; only its SparseCore ops are CPU
kernels (`emulated_sparsecore.py`). Nothing of it has run on a SparseCore
TPU; `docs/tpu.md` lists where it may differ.

A pod slice (`num_hosts > 1`) is emulated the way a TPU pod is driven:
this process is the client of a cluster whose hosts are TF servers (tasks
of the job "worker", started in this process, each with `num_replicas /
num_hosts` CPU devices as its cores), and TF's remote eager runtime runs
each host's ops on it. What TF's own code then sees is a pod: the hosts
(`num_hosts`, one per task, `tpu_embedding_v2_utils.get_list_of_hosts`),
each table sharded over them by `TPUEmbedding`'s sharded variable creator
(one shard per host, on that host, with its `shard_info`), one input
pipeline per host (`distribute_datasets_from_function` with
`num_input_pipelines == num_hosts`, each host's pipeline built on that
host and feeding its own replicas), a dataset made by the client reaching
a host only as a graph, as it does on a pod, and Keras' multi-host
`predict` reordering. What is not emulated there: the hosts share one
machine and one process (a host that dies, a slow network or the
coordination service of a real pod are not exercised), replicas reduce on
one device rather than over the TPU interconnect, and the chip's memory
is one, not one per host.

What the emulation cannot tell you: XLA's lowering for TPU, the chip's own
numerics and speed, the real input pipeline of a TPU host, and the network
and failures of a real pod. `examples/tpu_smoke.py` is the run to do on a
TPU VM.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any
from typing import Iterator
from typing import Literal

import numpy as np
from tensorflow.core.framework import attr_value_pb2

from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_control_flow_ops as control_flow_ops
from keras_tpu_embed._compat import tf_distribute_lib as distribute_lib
from keras_tpu_embed._compat import tf_distribute_utils as distribute_utils
from keras_tpu_embed._compat import tf_mirrored_strategy as mirrored_strategy
from keras_tpu_embed._compat import tf_ops as ops
from keras_tpu_embed._compat import tf_tpu
from keras_tpu_embed._compat import tf_tpu_replication as tpu_replication
from keras_tpu_embed._compat import tf_tpu_strategy as tpu_strategy
from keras_tpu_embed._compat import tf_tpu_util as tpu_util
from keras_tpu_embed.testing.emulated_chip import EmulatedChip
from keras_tpu_embed.testing.emulated_sparsecore import EmulatedSparseCore

EmbeddingFeature = Literal["V1", "V2", "UNSUPPORTED"]
EMBEDDING_FEATURES: tuple[str, ...] = ("V1", "V2", "UNSUPPORTED")


class _ReplicateContext(tpu_replication.TPUReplicateContext):  # type: ignore[misc]
    """Marks the replica function as a TPU computation, changing no op.

    TF's enqueue asks the graph for a `TPUReplicateContext` to know that it
    runs inside `strategy.run` (and then moves itself to the host with
    outside compilation). The real context also rewrites every op for XLA
    on the TPU, which cannot run on a CPU: this one keeps the base XLA
    context's no-op bookkeeping.
    """

    def __init__(self, name: str, num_replicas: int) -> None:
        control_flow_ops.XLAControlFlowContext.__init__(self)
        self._name = name
        self._num_replicas = num_replicas
        self._outside_compilation_counter = 0
        self._outside_compilation_cluster = None
        self._is_map_outside_compilation = False
        self._gradient_colocation_stack: list[Any] = []
        self._in_gradient_colocation = None
        self._host_compute_core: list[Any] = []
        self._outer_device_function_stack = None
        self._oc_dev_fn_stack = None
        self._outside_compilation_v2_context = None

    def AddOp(self, op: Any) -> None:  # noqa: N802 - TF's name
        if self._outer_context:
            self._outer_context.AddInnerOp(op)

    def AddValue(self, val: Any) -> Any:  # noqa: N802
        return val

    def AddInnerOp(self, op: Any) -> None:  # noqa: N802
        self.AddOp(op)

    def EnterGradientColocation(self, op: Any, gradient_uid: Any) -> None:  # noqa: N802
        pass

    def ExitGradientColocation(self, op: Any, gradient_uid: Any) -> None:  # noqa: N802
        pass

    def _EnterOutsideCompilationScope(self, **kwargs: Any) -> None:  # noqa: N802
        pass

    def _ExitOutsideCompilationScope(self) -> None:  # noqa: N802
        pass

    def report_unsupported_operations(self) -> None:
        pass

    def get_replicated_var_handle(  # TF's name
        self,
        name: str,
        handle_id: str,
        vars_: list[Any],
        is_mirrored: bool = False,
        is_packed: bool = False,
    ) -> Any:
        """The handle of this replica's own copy (or shard) of a variable.

        On a TPU the replicated input feeds each core its own component;
        `TPUEmbeddingV2`'s sharded tables read and assign their local shard
        through it.
        """
        context = distribute_lib.get_replica_context()
        return vars_[context._replica_id_in_sync_group].handle


def _mark_direct_input(value: Any, marked: bool) -> Any:
    """What `tpu.replicate` does to each input: an identity, marked as a
    direct input of the step unless dynamic padding took the mark."""
    if not isinstance(value, tf.Tensor) or tf.executing_eagerly():
        return value
    identity = tf.identity(value)
    if marked:
        identity.op._set_attr(
            "_tpu_input_identity", attr_value_pb2.AttrValue(b=True)
        )
    return identity


def _as_step_inputs(inputs: Any, padded: bool) -> Any:
    """`inputs` as the replicated computation of `tpu.replicate` sees them.

    `tpu.split_compile_and_replicate` marks an input's identity
    `_tpu_input_identity` only `if not dynamic_shape_inputs or composite`:
    once dynamic padding pads any input of the step, no dense input keeps
    the mark; the components of sparse and ragged inputs, which it never
    pads, always do. TF's enqueue takes only marked inputs.
    """
    flat = tf.nest.flatten(inputs, expand_composites=True)
    composite = tf.nest.flatten(
        tf.nest.map_structure(
            lambda x: tf_tpu._flatten_and_filter_composite(x, False, True),
            inputs,
        )
    )
    marked = [
        _mark_direct_input(value, not padded or from_composite)
        for value, from_composite in zip(flat, composite, strict=True)
    ]
    return tf.nest.pack_sequence_as(inputs, marked, expand_composites=True)


class _HardwareFeature:
    def __init__(self, embedding_feature: str) -> None:
        kinds = tf.tpu.experimental.HardwareFeature.EmbeddingFeature
        self.embedding_feature = getattr(kinds, embedding_feature)
        # SparseCores per chip on v5p / v6e.
        self.num_embedding_devices_per_chip = 4


class _EmulatedTPUExtended(mirrored_strategy.MirroredExtended):  # type: ignore[misc]
    def __init__(
        self,
        container: Any,
        devices: list[str],
        num_hosts: int,
        embedding_feature: str,
    ) -> None:
        hosts = _by_host(devices)
        # The TPU's all-reduce is `cross_replica_sum` inside the compiled
        # step. The mirrored default, collective ops, feeds each op's
        # instance key at call time (`capture_call_time_value`), which TF
        # says control flow does not support: Keras' `steps_per_execution`
        # loop calls the step inside `tf.while_loop`/`tf.cond` and leaves
        # those keys unfed. One-device reduction sums with plain ops (and
        # works across a pod's tasks, whose collectives would need every
        # task to join one group).
        reduction = tf.distribute.ReductionToOneDevice()
        if len(hosts) == 1:
            super().__init__(
                container, devices=devices, cross_device_ops=reduction
            )
        else:
            # MirroredExtended refuses the devices of several tasks in eager
            # mode (its multi-worker input and collectives are for separate
            # clients): it starts on the first host's devices, then takes
            # all of them.
            super().__init__(
                container, devices=hosts[0][1], cross_device_ops=reduction
            )
            self._initialize_strategy(devices)
            # One input worker per host, feeding that host's replicas, as
            # TPUExtended's `_device_input_worker_devices`.
            self._input_workers_devices = tuple(hosts)
        self._emulated_num_hosts = num_hosts
        self._hardware_feature = _HardwareFeature(embedding_feature)
        # The TPU step has static shapes (TPUExtended says the same).
        self._require_static_shapes = True

    @property
    def _tpu_devices(self) -> Any:
        """TPUExtended's device grid: one logical core per replica."""
        return np.array([[d] for d in self.worker_devices], dtype=object)

    @property
    def num_hosts(self) -> int:
        return self._emulated_num_hosts

    @property
    def _host_device(self) -> str:
        return _host_of(self._devices[0])

    def _create_variable(self, next_creator: Any, **kwargs: Any) -> Any:
        """TPUExtended's first rule: `skip_mirrored_creator` makes a plain
        variable where the caller's device scope says.

        `TPUEmbedding`'s sharded creator asks for it, for each host's shard
        on that host; the mirrored creator would copy every shard to every
        replica, all of them on the first host.
        """
        if kwargs.pop("skip_mirrored_creator", False):
            return next_creator(**kwargs)
        return super()._create_variable(next_creator, **kwargs)

    # TF's own: `_reduce_to` below hands it its output.
    _broadcast_output = tpu_strategy.TPUExtended._broadcast_output

    def _reduce_to(
        self, reduce_op: Any, value: Any, destinations: Any, options: Any
    ) -> Any:
        """Outside the step, TF's own TPU reduce.

        Keras' first-batch build (`_maybe_symbolic_build`) and its metric
        reductions then meet the code they meet on a TPU, which, unlike the
        mirrored reduce, cannot average int64 per-replica values. Inside the
        step the chip's `cross_replica_sum` has no CPU kernel; the mirrored
        all-reduce computes the same sum.
        """
        if tpu_util.enclosing_tpu_context() is None:
            return tpu_strategy.TPUExtended._reduce_to(
                self, reduce_op, value, destinations, options
            )
        return super()._reduce_to(reduce_op, value, destinations, options)

    @property
    def num_replicas_per_host(self) -> int:
        return len(self.worker_devices) // self._emulated_num_hosts

    @property
    def tpu_hardware_feature(self) -> _HardwareFeature:
        return self._hardware_feature

    def _pads_inputs(self, args: Any, kwargs: Any, options: Any) -> bool:
        """Whether `tpu.replicate` pads this step's inputs (dynamic padding).

        `TPUExtended._tpu_function_creator` gives `tpu.replicate` maximum
        shapes of unknown dimensions whenever the run options enable a
        dynamic batch size, TF's default, which Keras' `strategy.run` does
        not change. `tpu.split_compile_and_replicate` then pads the step's
        dense inputs, and TF's own `_pad_all_input` decides whether any
        needs it: a dimension of unknown size, or sizes that differ between
        replicas. Its pad ops are left unused here (on a TPU XLA's dynamic
        padder gives the step the real sizes), so the replicas compute on
        their inputs as they are.
        """
        if options is not None and not (
            options.experimental_enable_dynamic_batch_size
        ):
            return False
        # TPUExtended's replicate inputs: the replica id, then the arguments.
        inputs = [
            [
                tf.constant(i, tf.int32),
                distribute_utils.select_replica(i, args),
                distribute_utils.select_replica(i, kwargs),
            ]
            for i in range(self._num_replicas_in_sync)
        ]
        maximum_shapes = [
            tf.TensorShape(
                [None]
                * (
                    value.shape.rank
                    if tf.is_tensor(value)
                    or isinstance(value, tf.__internal__.CompositeTensor)
                    else np.ndim(value)
                )
            )
            for value in tf.nest.flatten(inputs[0])
        ]
        # `tpu.split_compile_and_replicate`'s flattening: composites are
        # never padded (None), Nones are fed as a constant 0.
        flat_maximum_shapes = tf.nest.flatten(
            [
                tf_tpu._flatten_and_filter_composite(value, shape)
                for value, shape in zip(
                    tf.nest.flatten(inputs[0]), maximum_shapes, strict=True
                )
            ]
        )
        flat_inputs = [
            [
                tf.constant(0) if value is None else tf.convert_to_tensor(value)
                for value in tf.nest.flatten(replica, expand_composites=True)
            ]
            for replica in inputs
        ]
        _, padding_maps = tf_tpu._pad_all_input(
            flat_inputs,
            flat_maximum_shapes,
            tf_tpu.PaddingSpec.POWER_OF_TWO
            if options is not None
            and options.experimental_bucketizing_dynamic_shape
            else None,
        )
        return bool(padding_maps)

    def tpu_run(self, fn: Any, args: Any, kwargs: Any, options: Any) -> Any:
        padded = False

        def replica_fn(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = _as_step_inputs((args, kwargs), padded)
            if tf.executing_eagerly():
                return fn(*args, **kwargs)
            # A TPU program starts once all its inputs exist: when the input
            # iterator is exhausted, none of its ops runs. In a CPU graph an
            # op that does not read the inputs (a counter's assign_add)
            # would run anyway, so every op waits for the inputs here.
            inputs = [
                value
                for value in tf.nest.flatten(
                    (args, kwargs), expand_composites=True
                )
                if isinstance(value, tf.Tensor)
            ]
            with tf.control_dependencies(inputs):
                return fn(*args, **kwargs)

        graph = ops.get_default_graph()
        if tf.executing_eagerly():
            return self.call_for_each_replica(replica_fn, args, kwargs)
        padded = self._pads_inputs(args, kwargs, options)
        outer = graph._get_control_flow_context()
        context = _ReplicateContext(
            graph.unique_name("emulated_tpu_cluster"),
            self._num_replicas_in_sync,
        )
        context._outer_context = outer
        graph._set_control_flow_context(context)
        try:
            return self.call_for_each_replica(replica_fn, args, kwargs)
        finally:
            graph._set_control_flow_context(outer)


class EmulatedTPUStrategy(tpu_strategy.TPUStrategyV2):  # type: ignore[misc]
    """A `tf.distribute.TPUStrategy` whose TPU system is emulated on CPUs.

    Build it with `emulated_tpu`, which also installs the emulated chip.
    """

    def __init__(
        self, devices: list[str], num_hosts: int, embedding_feature: str
    ) -> None:
        # MirroredExtended reads this from its container (MirroredStrategy
        # sets it the same way).
        self._collective_key_base = id(self)
        extended = _EmulatedTPUExtended(
            self, devices, num_hosts, embedding_feature
        )
        tf.distribute.Strategy.__init__(self, extended)
        self._enable_packed_variable_in_eager_mode = False
        self.embedding_feature = embedding_feature


def _host_of(device: str) -> str:
    """The host CPU of `device`, as TF's `device_util.get_host_for_device`."""
    spec = tf.DeviceSpec.from_string(device)
    host: str = tf.DeviceSpec(
        job=spec.job,
        replica=spec.replica,
        task=spec.task,
        device_type="CPU",
        device_index=0,
    ).to_string()
    return host


def _by_host(devices: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """`(host, its devices)` for each host of `devices`, in their order."""
    hosts: dict[str, list[str]] = {}
    for device in devices:
        hosts.setdefault(_host_of(device), []).append(device)
    return [(host, tuple(owned)) for host, owned in hosts.items()]


def _cpu_devices(count: int) -> list[str]:
    """`count` logical CPU devices, configured here when TF has not started."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu) or []
    if len(configured) < count:
        try:
            tf.config.set_logical_device_configuration(
                cpu,
                [tf.config.LogicalDeviceConfiguration()] * count,
            )
        except RuntimeError:
            pass
    devices = tf.config.list_logical_devices("CPU")
    if len(devices) < count:
        raise RuntimeError(
            f"emulated_tpu(num_replicas={count}) needs {count} logical CPU "
            f"devices, but TensorFlow already started with {len(devices)}. "
            "Enter emulated_tpu before TensorFlow runs anything in the "
            "process (a fresh process, e.g. a subprocess per test), or "
            "split the CPU yourself first: tf.config."
            "set_logical_device_configuration(tf.config.list_physical_"
            f"devices('CPU')[0], [tf.config.LogicalDeviceConfiguration()] "
            f"* {count})."
        )
    return [device.name for device in devices[:count]]


# The hosts of this process's emulated pod: (hosts, replicas per host) ->
# devices. Its servers live as long as the process (TF cannot stop an
# in-process server), so a pod of the same shape is reused.
_PODS: dict[tuple[int, int], list[str]] = {}
_SERVERS: list[Any] = []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return int(probe.getsockname()[1])


def _pod_devices(num_replicas: int, num_hosts: int) -> list[str]:
    """The TPU cores of `num_hosts` hosts, as TF servers of this process.

    Each host is a task of the job "worker" with `num_replicas /
    num_hosts` CPU devices (its cores); this process is the client of the
    cluster, as the coordinator of a TPU pod is, and runs every host's ops
    through TF's remote eager runtime.
    """
    per_host = num_replicas // num_hosts
    shape = (num_hosts, per_host)
    if shape in _PODS:
        return _PODS[shape]
    if _PODS:
        hosts, replicas = next(iter(_PODS))
        raise RuntimeError(
            f"emulated_tpu(num_replicas={num_replicas}, num_hosts="
            f"{num_hosts}): this process already emulates a pod of {hosts} "
            f"hosts x {replicas} replicas, and TensorFlow connects a "
            "process to one cluster only. Use the same num_replicas and "
            "num_hosts throughout the process, or a process per shape."
        )
    cluster = tf.train.ClusterSpec(
        {"worker": [f"localhost:{_free_port()}" for _ in range(num_hosts)]}
    )
    config = tf.compat.v1.ConfigProto(device_count={"CPU": per_host})
    servers = [
        tf.distribute.Server(
            cluster, job_name="worker", task_index=task, config=config
        )
        for task in range(num_hosts)
    ]
    tf.config.experimental_connect_to_cluster(cluster)
    devices = [
        f"/job:worker/replica:0/task:{task}/device:CPU:{core}"
        for task in range(num_hosts)
        for core in range(per_host)
    ]
    _PODS[shape] = devices
    _SERVERS.extend(servers)
    return devices


@contextlib.contextmanager
def emulated_tpu(
    num_replicas: int = 2,
    num_hosts: int = 1,
    embedding_feature: EmbeddingFeature = "V1",
) -> Iterator[EmulatedTPUStrategy]:
    """A TPU system emulated on CPU devices; yields its `TPUStrategy`.

    Under it, `keras_tpu_embed` layers built in `strategy.scope()` take the
    code path of that TPU: the embedding engine
    (`tf.tpu.experimental.embedding.TPUEmbedding`) for `"V1"`, the
    tensor-core fallback for `"UNSUPPORTED"` (a TPU without an engine, such
    as v5e). TF's own mid-level API runs everywhere off the chip; only the
    chip's embedding ops are CPU kernels. Leaving the block shuts the
    emulated system down.

    `"V2"` is a TPU with SparseCores (4 per chip, as on v5p): TF's own
    `tf.tpu.experimental.embedding.TPUEmbeddingV2` runs under it (table
    stacking, sharded variables, input preprocessing, lookups and
    `apply_gradients`); only its SparseCore ops are CPU kernels
    (`emulated_sparsecore.py`). A v6e has 2 SparseCores per chip: set
    `strategy.extended.tpu_hardware_feature.num_embedding_devices_per_chip
    = 2` before constructing `TPUEmbeddingV2` to emulate one. None of this
    has run on a SparseCore TPU (`docs/tpu.md` says where it may differ).

    Args:
        num_replicas: TPU cores (replicas), >= 1. Each is a logical CPU
            device; they are configured here when TensorFlow has not
            started yet in this process.
        num_hosts: Hosts of the emulated pod slice, dividing
            `num_replicas`. With more than one, the process becomes the
            client of a cluster of `num_hosts` in-process TF servers (see
            the module docstring) for the rest of its life: run such tests
            in a process of their own, with one pod shape per process.
        embedding_feature: TF's name for the hardware:
            `tf.tpu.experimental.HardwareFeature.EmbeddingFeature` `"V1"`,
            `"V2"` (SparseCore) or `"UNSUPPORTED"`.

    Yields:
        The strategy: use it as a `TPUStrategy`.

    Raises:
        ValueError: a bad argument, named.
        RuntimeError: TensorFlow already runs with too few CPU devices,
            or this process already emulates a pod of another shape (or a
            pod, and one host is asked for).
        NotImplementedError: `"V2"` on several hosts, not emulated yet.

    Example:

    ```python
    from keras_tpu_embed.testing import emulated_tpu

    with emulated_tpu(num_replicas=2) as strategy:  # before TF runs
        with strategy.scope():
            model = ...  # with kte.TPUEmbeddingLayer
            model.compile(...)
        train = kte.distribute_dataset(strategy, dataset.repeat(), 16)
        model.fit(train, epochs=1, steps_per_epoch=10)
    ```

    A runnable version is in `docs/tpu.md` ("Testing without a TPU").
    """
    if (
        isinstance(num_replicas, bool)
        or not isinstance(num_replicas, int)
        or num_replicas < 1
    ):
        raise ValueError(
            "`num_replicas` must be a positive int. Received: "
            f"num_replicas={num_replicas!r}"
        )
    if (
        isinstance(num_hosts, bool)
        or not isinstance(num_hosts, int)
        or num_hosts < 1
        or num_replicas % num_hosts
    ):
        raise ValueError(
            "`num_hosts` must be a positive int dividing num_replicas="
            f"{num_replicas}. Received: num_hosts={num_hosts!r}"
        )
    if embedding_feature not in EMBEDDING_FEATURES:
        raise ValueError(
            "Invalid value for argument `embedding_feature`. Expected one of "
            f"{EMBEDDING_FEATURES}. Received: "
            f"embedding_feature={embedding_feature!r}"
        )
    if embedding_feature == "V2" and num_hosts > 1:
        raise NotImplementedError(
            f"emulated_tpu(embedding_feature='V2', num_hosts={num_hosts}): "
            "SparseCore is emulated on one host only. Use num_hosts=1, or "
            "embedding_feature='V1' to emulate a pod."
        )
    if num_hosts > 1:
        devices = _pod_devices(num_replicas, num_hosts)
    elif _PODS:
        raise RuntimeError(
            f"emulated_tpu(num_replicas={num_replicas}, num_hosts=1): this "
            "process is the client of an emulated pod, whose devices are "
            "all remote. Emulate one host in another process."
        )
    else:
        devices = _cpu_devices(num_replicas)
    chip: EmulatedChip | EmulatedSparseCore = (
        EmulatedSparseCore() if embedding_feature == "V2" else EmulatedChip()
    )
    undo = chip.install()
    try:
        strategy = EmulatedTPUStrategy(devices, num_hosts, embedding_feature)
        strategy.emulated_chip = chip
        yield strategy
    finally:
        undo()
