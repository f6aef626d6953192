"""What `tpu.replicate` does around an emulated TPU step.

The replicated computation of a TPU step runs in a `TPUReplicateContext`,
which TF's enqueue looks for; each input is an identity marked as a direct
input of the step, unless dynamic padding took the mark. Here are those
three pieces, with TF's own padding decision (`tpu._pad_all_input`), so
that `EmulatedTPUStrategy` can run the step on CPU replicas the way
`TPUStrategy` hands it to `tpu.replicate`.
"""

from __future__ import annotations

import contextlib
from typing import Any
from typing import Iterator

import numpy as np

from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_control_flow_ops as control_flow_ops
from keras_tpu_embed._compat import tf_distribute_lib as distribute_lib
from keras_tpu_embed._compat import tf_distribute_utils as distribute_utils
from keras_tpu_embed._compat import tf_ops as ops
from keras_tpu_embed._compat import tf_tpu
from keras_tpu_embed._compat import tf_tpu_replication as tpu_replication
from keras_tpu_embed._tf_private import control_flow_context
from keras_tpu_embed._tf_private import mark_tpu_input_identity
from keras_tpu_embed._tf_private import replica_index
from keras_tpu_embed._tf_private import set_control_flow_context
from keras_tpu_embed._tf_private import tpu_flatten_and_filter_composite
from keras_tpu_embed._tf_private import tpu_pad_all_input


class ReplicateContext(tpu_replication.TPUReplicateContext):  # type: ignore[misc]
    """Marks the replica function as a TPU computation, changing no op.

    TF's enqueue asks the graph for a `TPUReplicateContext` to know that it
    runs inside `strategy.run` (and then moves itself to the host with
    outside compilation). The real context also rewrites every op for XLA
    on the TPU, which cannot run on a CPU: this one keeps the base XLA
    context's no-op bookkeeping.
    """

    def __init__(self, name: str, num_replicas: int, outer: Any) -> None:
        control_flow_ops.XLAControlFlowContext.__init__(self)
        self._outer_context = outer
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
        return vars_[replica_index(context)].handle


def mark_direct_input(value: Any, marked: bool) -> Any:
    """What `tpu.replicate` does to each input: an identity, marked as a
    direct input of the step unless dynamic padding took the mark."""
    if not isinstance(value, tf.Tensor) or tf.executing_eagerly():
        return value
    identity = tf.identity(value)
    if marked:
        mark_tpu_input_identity(identity.op)
    return identity


def as_step_inputs(inputs: Any, padded: bool) -> Any:
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
            lambda x: tpu_flatten_and_filter_composite(x, False, True),
            inputs,
        )
    )
    marked = [
        mark_direct_input(value, not padded or from_composite)
        for value, from_composite in zip(flat, composite, strict=True)
    ]
    return tf.nest.pack_sequence_as(inputs, marked, expand_composites=True)


@contextlib.contextmanager
def replicate_context(num_replicas: int) -> Iterator[None]:
    """The default graph inside a `ReplicateContext`, as `tpu.replicate`
    enters its own around the step."""
    graph = ops.get_default_graph()
    outer = control_flow_context(graph)
    context = ReplicateContext(
        graph.unique_name("emulated_tpu_cluster"), num_replicas, outer
    )
    set_control_flow_context(graph, context)
    try:
        yield
    finally:
        set_control_flow_context(graph, outer)


def pads_inputs(
    num_replicas: int, args: Any, kwargs: Any, options: Any
) -> bool:
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
        for i in range(num_replicas)
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
            tpu_flatten_and_filter_composite(value, shape)
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
    _, padding_maps = tpu_pad_all_input(
        flat_inputs,
        flat_maximum_shapes,
        tf_tpu.PaddingSpec.POWER_OF_TWO
        if options is not None
        and options.experimental_bucketizing_dynamic_shape
        else None,
    )
    return bool(padding_maps)
