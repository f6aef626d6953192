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
proto (`engine_rules.py`). The devices (logical CPUs, or a pod's hosts)
come from `emulated_devices.py`, and what `tpu.replicate` does around the
step (its context, the direct-input marks, dynamic padding's decision)
from `emulated_replication.py`.

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
from typing import Any
from typing import Iterator
from typing import Literal

import numpy as np

from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_mirrored_strategy as mirrored_strategy
from keras_tpu_embed._compat import tf_tpu_strategy as tpu_strategy
from keras_tpu_embed._compat import tf_tpu_util as tpu_util
from keras_tpu_embed._tf_private import add_control_inputs
from keras_tpu_embed._tf_private import in_xla_compiled_function
from keras_tpu_embed._tf_private import tpu_extended_broadcast_output
from keras_tpu_embed._tf_private import tpu_extended_reduce_to
from keras_tpu_embed.testing.emulated_chip import EmulatedChip
from keras_tpu_embed.testing.emulated_devices import by_host
from keras_tpu_embed.testing.emulated_devices import cpu_devices
from keras_tpu_embed.testing.emulated_devices import host_of
from keras_tpu_embed.testing.emulated_devices import pod_devices
from keras_tpu_embed.testing.emulated_devices import pod_is_connected
from keras_tpu_embed.testing.emulated_replication import as_step_inputs
from keras_tpu_embed.testing.emulated_replication import pads_inputs
from keras_tpu_embed.testing.emulated_replication import replicate_context
from keras_tpu_embed.testing.emulated_sparsecore import EmulatedSparseCore

EmbeddingFeature = Literal["V1", "V2", "UNSUPPORTED"]
EMBEDDING_FEATURES: tuple[str, ...] = ("V1", "V2", "UNSUPPORTED")


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
        hosts = by_host(devices)
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
        return host_of(self._devices[0])

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

    def _get_variable_creator_initial_value(
        self, replica_id: int, device: Any, primary_var: Any, **kwargs: Any
    ) -> Any:
        """TPUExtended's rule (`_create_mirrored_tpu_variables` in
        `tensorflow/python/distribute/tpu_strategy.py`): every replica's copy
        starts from the value the first replica's was given.

        The mirrored rule this class would inherit reads the first copy
        inside a `tf.function`, so a variable made in a step (keras-rs
        builds its tables in the first call) could not be lifted out of it.
        """
        value = kwargs["initial_value"]
        if replica_id > 0 or not callable(value):
            # After the first replica, `value` is what the first was given
            # (`_real_mirrored_creator` passes its kwargs on).
            return value
        made: list[Any] = []

        def once() -> Any:
            if not made:
                made.append(value())
            return made[0]

        return once

    # TF's own: `_reduce_to` below hands it its output.
    _broadcast_output = tpu_extended_broadcast_output

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
            return tpu_extended_reduce_to(
                self, reduce_op, value, destinations, options
            )
        return super()._reduce_to(reduce_op, value, destinations, options)

    @property
    def num_replicas_per_host(self) -> int:
        return len(self.worker_devices) // self._emulated_num_hosts

    @property
    def tpu_hardware_feature(self) -> _HardwareFeature:
        return self._hardware_feature

    def tpu_run(self, fn: Any, args: Any, kwargs: Any, options: Any) -> Any:
        padded = False

        def replica_fn(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = as_step_inputs((args, kwargs), padded)
            if tf.executing_eagerly():
                return fn(*args, **kwargs)
            # A TPU program starts once all its inputs exist: when the input
            # iterator is exhausted, none of its ops runs. In a CPU graph an
            # op that does not read the inputs (a counter's assign_add)
            # would run anyway, so the step's ops that touch a resource wait
            # for the inputs. Not those that create a variable: a variable
            # made in the step (keras-rs builds its tables in its first
            # call) has its initialization lifted out of the function,
            # which fails if it waits for the step's inputs; on a TPU it
            # does not.
            inputs = [
                value.op
                for value in tf.nest.flatten(
                    (args, kwargs), expand_composites=True
                )
                if isinstance(value, tf.Tensor)
            ]
            graph = tf.compat.v1.get_default_graph()
            creating: set[Any] = set()

            def note_creation(next_creator: Any, **arguments: Any) -> Any:
                before = len(graph.get_operations())
                variable = next_creator(**arguments)
                creating.update(graph.get_operations()[before:])
                return variable

            existing = len(graph.get_operations())
            with tf.variable_creator_scope(note_creation):
                outputs = fn(*args, **kwargs)
            for op in graph.get_operations()[existing:]:
                if op not in creating and touches_resource(op):
                    add_control_inputs(op, inputs)
            return outputs

        if tf.executing_eagerly():
            return self.call_for_each_replica(replica_fn, args, kwargs)
        if in_xla_compiled_function(tf.compat.v1.get_default_graph()):
            # XLA on CPU compiles a function for one device; the emulated
            # cores are several CPU devices, and the chip's ops are host
            # kernels XLA cannot compile. A TPUStrategy compiles its step
            # with XLA whatever the caller asks.
            raise NotImplementedError(
                "emulated_tpu cannot run strategy.run inside "
                "tf.function(jit_compile=True): XLA on CPU compiles one "
                "function for one device, and the emulated TPU's cores and "
                "embedding engine are CPU devices and host kernels. Drop "
                "jit_compile=True around strategy.run (a TPUStrategy "
                "compiles the step with XLA anyway)."
            )
        padded = pads_inputs(self._num_replicas_in_sync, args, kwargs, options)
        with replicate_context(self._num_replicas_in_sync):
            return self.call_for_each_replica(replica_fn, args, kwargs)


def touches_resource(op: Any) -> bool:
    """Whether `op` reads or writes a variable (or another resource): what a
    step does that outlives it, and so what must not run without inputs."""
    return any(value.dtype == tf.resource for value in op.inputs)


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
        devices = pod_devices(num_replicas, num_hosts)
    elif pod_is_connected():
        raise RuntimeError(
            f"emulated_tpu(num_replicas={num_replicas}, num_hosts=1): this "
            "process is the client of an emulated pod, whose devices are "
            "all remote. Emulate one host in another process."
        )
    else:
        devices = cpu_devices(num_replicas)
    chip: EmulatedChip | EmulatedSparseCore = (
        EmulatedSparseCore()
        if embedding_feature == "V2"
        else EmulatedChip(worker_devices=devices)
    )
    undo = chip.install()
    try:
        strategy = EmulatedTPUStrategy(devices, num_hosts, embedding_feature)
        strategy.emulated_chip = chip
        yield strategy
    finally:
        undo()
