"""TensorFlow's private fields, each read (or set) by one named function.

Some things the package needs have no public API in TensorFlow: a TPU
column's arguments, a distributed dataset's cardinality, the TPU embedding
engine's tables between steps, what `tpu.replicate` does around a step.
Each is read here, through a function whose docstring names the TF source
that defines the field and why no public road exists, so that a TensorFlow
upgrade breaks this module only. Everything else reads TensorFlow through
its public API (`_compat.py` imports the internal modules).
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_attr_value_pb2
from keras_tpu_embed._compat import tf_control_flow_util
from keras_tpu_embed._compat import tf_eager_context
from keras_tpu_embed._compat import tf_tpu
from keras_tpu_embed._compat import tf_tpu_embedding_v2
from keras_tpu_embed._compat import tf_tpu_embedding_v3
from keras_tpu_embed._compat import tf_tpu_feature_column_v2
from keras_tpu_embed._compat import tf_tpu_strategy
from keras_tpu_embed.types import InitializerLike
from keras_tpu_embed.types import MidLevelEmbedding
from keras_tpu_embed.types import TFFeatureColumn


@dataclasses.dataclass(frozen=True)
class TPUColumnArguments:
    """What a TF TPU embedding column keeps of its constructor privately."""

    max_sequence_length: int
    learning_rate_fn: Any
    embedding_lookup_device: Any
    tensor_core_shape: Any
    initializer: InitializerLike | None
    shared_embedding_collection_name: str  # empty: not a shared column


def tpu_column_arguments(column: TFFeatureColumn) -> TPUColumnArguments:
    """The private arguments of a `_TPUEmbeddingColumnV2` or
    `_TPUSharedEmbeddingColumnV2`.

    `tensorflow/python/tpu/feature_column_v2.py` stores
    `max_sequence_length`, `learning_rate_fn`, `embedding_lookup_device`
    and `tensor_core_shape` (and, for shared columns, `initializer` and
    `shared_embedding_collection_name`) only as `_`-attributes set in
    `__new__` / `__init__`, with no property: converting such a column to
    ours must read them there. The device and shape are absent on columns
    built before TF had them (None then); a column that is not shared has
    no initializer here (its public `initializer` holds it) and an empty
    collection name.
    """
    return TPUColumnArguments(
        max_sequence_length=column._max_sequence_length,
        learning_rate_fn=column._learning_rate_fn,
        embedding_lookup_device=getattr(
            column, "_embedding_lookup_device", None
        ),
        tensor_core_shape=getattr(column, "_tensor_core_shape", None),
        initializer=getattr(column, "_initializer", None),
        shared_embedding_collection_name=getattr(
            column, "_shared_embedding_collection_name", ""
        ),
    )


@dataclasses.dataclass(frozen=True)
class SharedColumnCreatorArguments:
    """What `tf.feature_column.shared_embeddings` keeps of its arguments."""

    dimension: int
    initializer: InitializerLike | None
    name: str
    trainable: bool
    ckpt_to_load_from: str | None
    tensor_name_in_ckpt: str | None


def shared_column_creator_arguments(
    creator: Any,
) -> SharedColumnCreatorArguments:
    """The arguments of a `SharedEmbeddingColumnCreator`.

    `tensorflow/python/feature_column/feature_column_v2.py`'s
    `SharedEmbeddingColumnCreator.__init__` stores them as `_dimension`,
    `_initializer`, `_name`, `_trainable`, `_ckpt_to_load_from` and
    `_tensor_name_in_ckpt`; its only property is `embedding_weights`, so the
    shared table's size and initializer can be read nowhere else.
    """
    return SharedColumnCreatorArguments(
        dimension=creator._dimension,
        initializer=creator._initializer,
        name=creator._name,
        trainable=bool(creator._trainable),
        ckpt_to_load_from=creator._ckpt_to_load_from,
        tensor_name_in_ckpt=creator._tensor_name_in_ckpt,
    )


# The classes of `tf.compat.v1.tpu.experimental.embedding_column` and
# `shared_embedding_columns`: TF exports the factories, not the classes
# (`tensorflow/python/tpu/feature_column_v2.py`).
TFTPUEmbeddingColumn: Any = tf_tpu_feature_column_v2._TPUEmbeddingColumnV2
TFTPUSharedEmbeddingColumn: Any = (
    tf_tpu_feature_column_v2._TPUSharedEmbeddingColumnV2
)


def distributed_dataset_options(distributed: Any) -> Any:
    """The `tf.distribute.InputOptions` a distributed dataset was made
    with, or None.

    `DistributedDataset` and `DistributedDatasetsFromFunction`
    (`tensorflow/python/distribute/input_lib.py`) keep them as `_options`
    with no property; whether they fetch to the device decides whether the
    embedding engine can read their ids on the host.
    """
    return getattr(distributed, "_options", None)


def distributed_dataset_cardinality(distributed: Any) -> int | None:
    """The number of elements a distributed dataset reports, or None.

    Its public `cardinality` property (`input_lib.py`) raises before the
    dataset is built; the `_cardinality` it returns is read directly so
    that an unbuilt dataset answers None.
    """
    batches = getattr(distributed, "_cardinality", None)
    return None if batches is None else int(batches)


def set_distributed_dataset_cardinality(distributed: Any, steps: int) -> None:
    """Makes a distributed dataset report `steps` as its `cardinality`.

    `input_lib.py` computes `_cardinality` from the first host's dataset and
    offers no setter; Keras reads it for the steps of an epoch.
    """
    distributed._cardinality = steps


# Datasets that yield their input's elements, all of them once, reordered
# at most: `prefetch` (`prefetch_op.py`), `with_options` (`dataset_ops.py`),
# `shuffle` (`shuffle_op.py`).
_SAME_ELEMENTS = ("_PrefetchDataset", "_OptionsDataset", "_ShuffleDataset")
_BATCHES = ("_BatchDataset", "_ParallelBatchDataset")  # `batch_op.py`


def batch_arguments(dataset: Any) -> tuple[Any, int, bool] | None:
    """`(examples, batch_size, drop_remainder)` when `dataset` is
    `examples.batch(batch_size, drop_remainder)`, perhaps prefetched,
    shuffled or given options after; else None.

    How many full batches a batched dataset holds needs the length of what
    it batches: only a short last batch has another size. TF keeps a
    dataset's input and arguments as private fields (`_input_dataset`,
    `_batch_size`, `_drop_remainder`), with no public road to them.
    """
    while type(dataset).__name__ in _SAME_ELEMENTS:
        dataset = dataset._input_dataset
    if type(dataset).__name__ not in _BATCHES:
        return None
    size = tf.get_static_value(dataset._batch_size)
    drop = tf.get_static_value(dataset._drop_remainder)
    if size is None or drop is None:
        return None
    return dataset._input_dataset, int(size), bool(drop)


def replica_index(context: Any) -> int:
    """The replica whose function is being traced, 0 when not known.

    Replicas that trace one function each (`MirroredStrategy`, the emulated
    TPU) key their per-replica buffers and enqueues by it.

    Under `TPUStrategy` `_replica_id_in_sync_group` (`distribute_lib.py`)
    is a tensor: one function is traced for all cores, so the answer is 0;
    replicas that trace one function each have it as a Python int.
    """
    replica = getattr(context, "_replica_id_in_sync_group", 0)
    return replica if isinstance(replica, int) else 0


def mark_tpu_input_identity(op: Any) -> None:
    """Marks `op` as a direct input of a TPU step, as `tpu.replicate` does.

    `split_compile_and_replicate` in `tensorflow/python/tpu/tpu.py` sets the
    attribute with `Operation._set_attr`; TF's enqueue reads it, and no
    public API sets an op attribute after its creation.
    """
    op._set_attr("_tpu_input_identity", tf_attr_value_pb2.AttrValue(b=True))


def in_xla_compiled_function(graph: Any) -> bool:
    """Whether `graph` is traced for `tf.function(jit_compile=True)`
    (`control_flow_util.GraphOrParentsInXlaContext`, which XLA's own
    lowering asks); no public API says it."""
    return bool(tf_control_flow_util.GraphOrParentsInXlaContext(graph))


def add_control_inputs(op: Any, control_inputs: list[Any]) -> None:
    """Makes `op` wait for `control_inputs` after its creation
    (`Operation._add_control_inputs`, `tensorflow/python/framework/ops.py`);
    `tf.control_dependencies` works only while an op is created, and no
    public API adds one afterwards."""
    op._add_control_inputs(control_inputs)


def tpu_flatten_and_filter_composite(*args: Any) -> Any:
    """`tpu._flatten_and_filter_composite` (`tensorflow/python/tpu/tpu.py`):
    how `tpu.replicate` flattens its inputs, composites apart; private, and
    the emulation must flatten exactly as it does."""
    return tf_tpu._flatten_and_filter_composite(*args)


def tpu_pad_all_input(*args: Any) -> Any:
    """`tpu._pad_all_input` (`tensorflow/python/tpu/tpu.py`): dynamic
    padding's decision of which step inputs to pad; private, and the
    emulation must decide exactly as `tpu.replicate` does."""
    return tf_tpu._pad_all_input(*args)


def control_flow_context(graph: Any) -> Any:
    """The control-flow context of `graph` (`ops.Graph.
    _get_control_flow_context`, `tensorflow/python/framework/ops.py`), which
    `tpu.replicate` enters with its `TPUReplicateContext`; no public API."""
    return graph._get_control_flow_context()


def set_control_flow_context(graph: Any, context: Any) -> None:
    """`ops.Graph._set_control_flow_context`: enters (or leaves) a context,
    as `tpu.replicate` does around the step; no public API."""
    graph._set_control_flow_context(context)


def tpu_extended_reduce_to(
    extended: Any, reduce_op: Any, value: Any, destinations: Any, options: Any
) -> Any:
    """`TPUExtended._reduce_to` (`tensorflow/python/distribute/
    tpu_strategy.py`), run on the emulated strategy: the TPU's reduce outside
    the step, which `Strategy.reduce` reaches only through this private
    hook."""
    return tf_tpu_strategy.TPUExtended._reduce_to(
        extended, reduce_op, value, destinations, options
    )


# `TPUExtended._broadcast_output` (`tpu_strategy.py`): the output step of
# that reduce, taken as it is by the emulated strategy.
tpu_extended_broadcast_output: Any = (
    tf_tpu_strategy.TPUExtended._broadcast_output
)


# ----------------------------------------------- the TPU embedding engine
# The engine's tables live in TF's mid-level object; reading and writing
# them between steps (for `.keras` files, checkpoints and warm starts) has
# no public API in `tpu_embedding_v2.py` / `tpu_embedding_v3.py`.


def mid_level_built(mid_level: MidLevelEmbedding) -> bool:
    """Whether TF created the engine's tables: `TPUEmbedding._built`, set
    at the first enqueue or `build` (`tensorflow/python/tpu/
    tpu_embedding_v2.py`); there is no public flag."""
    return bool(mid_level._built)


def mid_level_table_variables(mid_level: MidLevelEmbedding) -> Any:
    """`{table: {slot: sharded variable}}`: the host copies of the tables.

    `TPUEmbedding._variables` (`tpu_embedding_v2.py`) holds them, one
    shard per host; the public `embedding_tables` has no slots. They hold
    the TPU's values only after `mid_level_retrieve`.
    """
    return mid_level._variables


def mid_level_hosts(mid_level: MidLevelEmbedding) -> list[str]:
    """The host CPU devices that hold the tables' shards, in shard order.

    `TPUEmbedding.__init__` stores `get_list_of_hosts(strategy)` as
    `_hosts` (`tpu_embedding_v2.py`), which its sharded variable creator,
    load and retrieve use; set before the tables exist, no public API.
    """
    return list(mid_level._hosts)


def mid_level_retrieve(mid_level: MidLevelEmbedding) -> None:
    """Copies the tables from the TPU into their host copies:
    `TPUEmbedding._retrieve_variables` (`tpu_embedding_v2.py`), which TF
    runs before a checkpoint save of the mid-level object; no public API."""
    mid_level._retrieve_variables()


def mid_level_load_variables(mid_level: MidLevelEmbedding) -> None:
    """Sends the host copies of the tables to the TPU:
    `TPUEmbedding._load_variables` (`tpu_embedding_v2.py`), which TF runs
    after a checkpoint restore; no public API."""
    _host_writes_done()
    mid_level._load_variables()


def _host_writes_done() -> None:
    """Waits until every op this process sent to a host has run.

    The caller has just written the host copies eagerly (`assign` on each
    host's device); TF's load is a `tf.function` run on the hosts
    (`_load_variables_impl`), which a remote host runs as a component
    function, apart from the eager ops streamed to it: without this
    barrier the load may read a host copy before its last write. On the
    emulated 2-host pod under load, a warm start before the first step
    left host 1's last-written slot at its initial value once in a few
    runs (`tests/emulated_hosts/warm_start_pod_test.py`). TF's
    `context.async_wait` syncs every executor, remote ones included;
    with one host and nothing pending it returns at once.
    """
    tf_eager_context.async_wait()


def mid_level_load_table(mid_level: MidLevelEmbedding, table: str) -> Any:
    """Sends one table's host copies (with its slots) to the TPU.

    `_load_variables_impl` (`tpu_embedding_v2.py`) runs, per host, the load
    op of each table's optimizer on that host's shards; given one table it
    loads that table alone. It is the function `_load_variables` calls,
    which takes every table; there is no public API for either.
    """
    configs = [
        config for config in mid_level._table_config if config.name == table
    ]
    _host_writes_done()
    return tf_tpu_embedding_v2._load_variables_impl(
        mid_level._config_proto.SerializeToString(),
        mid_level._hosts,
        {table: mid_level._variables[table]},
        configs,
    )


def engine_optimizer_slot_names(optimizer: Any) -> list[str]:
    """The slots of a `tf.tpu.experimental.embedding` optimizer:
    `_Optimizer._slot_names` (`tpu_embedding_v2_utils.py`), which TF reads
    to create them; no public accessor."""
    return list(optimizer._slot_names())


def wrap_v1_enqueue_op(
    mid_level: MidLevelEmbedding,
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> None:
    """Replaces `TPUEmbedding._generate_enqueue_op` by `wrap(original)`.

    `TPUEmbedding.enqueue` (`tensorflow/python/tpu/tpu_embedding_v2.py`)
    calls it with the step's flat inputs, weights and features, under
    outside compilation in a TPU step (on the host), after its checks that
    the inputs are the step's direct inputs: the one place where the ids
    can be rewritten on the host and still be enqueued.
    """
    mid_level._generate_enqueue_op = wrap(mid_level._generate_enqueue_op)


def engine_optimizer_slot_initializers(optimizer: Any) -> dict[str, Any]:
    """Slot name -> the initializer TF creates that slot with:
    `_Optimizer._slot_initializers` (`tpu_embedding_v2_utils.py`), a list
    parallel to `_slot_names`, which `_create_slots` reads; no public
    accessor."""
    return dict(zip(optimizer._slot_names(), optimizer._slot_initializers()))


def wrap_sparsecore_preprocessing(
    mid_level: MidLevelEmbedding,
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> None:
    """Replaces `TPUEmbeddingV2._preprocess_features` by `wrap(original)`.

    `TPUEmbeddingV2.enqueue` (`tensorflow/python/tpu/tpu_embedding_v3.py`)
    runs this host preprocessing under outside compilation with the step's
    own inputs; it is the only place where sequence features can be
    rewritten on the host and still reach the enqueue as direct inputs.
    """
    mid_level._preprocess_features = wrap(mid_level._preprocess_features)


class _OneShardOf:
    """A slot initializer asked for the whole stacked shape that answers
    with one shard's (`sparsecore_build_per_sparse_core`)."""

    def __init__(self, initializer: InitializerLike, shards: int) -> None:
        self.initializer = initializer
        self.shards = shards

    def __call__(self, shape: Any, dtype: Any = None, **kwargs: Any) -> Any:
        rows, *rest = (int(d) for d in shape)
        return self.initializer([rows // self.shards, *rest], dtype, **kwargs)


def sparsecore_build_per_sparse_core(
    mid_level: MidLevelEmbedding, shards: int
) -> None:
    """`TPUEmbeddingV2.build`, creating each chip's shard from its own
    initial value, each SparseCore's rows asked for alone.

    TF's default (`_initializers_shard_info_by_default`, `tpu_embedding_
    v3.py`) initializes every stacked table and slot of every chip in one
    `tf.function` (`_batch_initialize_tables`): the whole state at once on
    the first chip's host. With it off, TF creates each chip's shard from
    its own initial value (`table_initialize_fn_non_batch`), asking a
    `shard_info`-aware table initializer for each SparseCore's rows
    (`_compute_sc_shard_info`); but there `slot_initialize_fn` calls the
    optimizer's slot initializers (`_Optimizer._slot_initializers`) with
    the whole stacked shape, so each chip's slot shard would hold the whole
    stack's rows. For the build, each slot initializer answers with one of
    the `shards` shards' shape (`_OneShardOf`); each shard's shape is
    checked after it. TF versions without the attribute have only the
    per-shard path.

    Raises:
        RuntimeError: a shard of a stacked table or slot has another shape
            than its layout says (TF changed how it creates them).
    """
    optimizers = {
        id(table.optimizer): table.optimizer
        for table in mid_level._table_config
        if table.optimizer is not None
    }
    originals = {key: opt._slot_initializers for key, opt in optimizers.items()}
    # TF 2.20 has no such attribute: its sharded variable creator already
    # asks the slot initializers for each shard's shape, so they are left
    # as they are there.
    whole_stack_slots = hasattr(
        mid_level, "_initializers_shard_info_by_default"
    )
    if whole_stack_slots:
        mid_level._initializers_shard_info_by_default = False
    wrapped = []
    try:
        for key, optimizer in optimizers.items():
            if not whole_stack_slots:
                break

            def per_shard(original: Callable[[], Any] = originals[key]) -> Any:
                return [_OneShardOf(init, shards) for init in original()]

            # An attribute of the instance over the class's method, deleted
            # after the build: the optimizer hashes its `__dict__`.
            optimizer._slot_initializers = per_shard
            wrapped.append(optimizer)
        mid_level.build()
    finally:
        for optimizer in wrapped:
            del optimizer._slot_initializers
    for layout in mid_level.embedding_layouts.values():
        per_shard_rows = (
            layout.total_rows_per_sparse_core_shard
            * layout.num_sparse_cores
            // layout.num_partitions
        )
        expected = [per_shard_rows, int(layout.unsharded_padded_shape[1])]
        for slot, variable in mid_level.variables[
            layout.stacked_table_name
        ].items():
            for shard in variable.values:
                if list(shard.shape) != expected:
                    raise RuntimeError(
                        f"TPUEmbeddingV2 created shard {list(shard.shape)} of "
                        f"'{layout.stacked_table_name}' {slot}; its layout "
                        f"says {expected}. This TensorFlow version creates "
                        "SparseCore tables differently: please report it."
                    )


def sparsecore_clone_feature_config(feature_configs: Any) -> Any:
    """`tpu_embedding_v3._clone_feature_config`: a deep copy of a feature
    config that keeps shared tables shared, as `TPUEmbeddingV2` makes one
    before stacking; private in `tpu_embedding_v3.py`."""
    return tf_tpu_embedding_v3._clone_feature_config(feature_configs)


def sparsecore_stack_tables(*args: Any) -> Any:
    """`tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer`:
    TF's table stacking for SparseCore, run as `TPUEmbeddingV2` runs it so
    that the layout read back is the chip's; private in
    `tpu_embedding_v3.py`."""
    return tf_tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer(
        *args
    )


def sharded_variable_class() -> type:
    """TF's `ShardedVariable`, which only `tf.__internal__` exports.

    What `ParameterServerStrategy` makes of a partitioned variable
    (`tensorflow/python/distribute/sharded_variable.py`): the tables on
    parameter servers are made of it, so that they save one checkpoint key
    per table, in slices, as a table on one device does.
    """
    sharded: type = tf.__internal__.distribute.ShardedVariable
    return sharded


def variable_partitioner(strategy: Any) -> Any:
    """The `variable_partitioner` a `ParameterServerStrategy` was given.

    Kept as `extended._variable_partitioner`
    (`parameter_server_strategy_v2.py`); no public property reads it.
    """
    return getattr(strategy.extended, "_variable_partitioner", None)


def parameter_server_count(strategy: Any) -> int:
    """The `ps` tasks a `ParameterServerStrategy` places variables on.

    Kept as `extended._num_ps` (`parameter_server_strategy_v2.py`): the
    strategy's public `cluster_resolver` is `None` for it, and its
    `extended.parameter_devices` is not implemented.
    """
    return int(strategy.extended._num_ps)


def keras_track_variable(layer: keras.layers.Layer, variable: Any) -> None:
    """Makes `variable` one of `layer`'s weights, as `add_weight` does.

    Keras' `Layer._track_variable` (`keras/src/layers/layer.py`): a table
    on parameter servers is a Keras variable of our own class
    (`parameter_server/sharded_tables.py`), which `add_weight` cannot make.
    """
    layer._track_variable(variable)


def sharded_variable_saveables(value: Any) -> Any:
    """A `ShardedVariable`'s checkpoint saveables, one slice per shard.

    `ShardedVariable._gather_saveables_for_checkpoint`
    (`sharded_variable.py`): the only way TF saves it, which a Keras
    variable holding one must hand on itself.
    """
    return value._gather_saveables_for_checkpoint()


def replica_local_variable(variable: Any) -> Any:
    """This replica's copy of a mirrored variable, in a replica context.

    `DistributedVariable._get_on_device_or_primary` (`values.py`). Needed
    because `tf.gather` on a `MirroredVariable` in a replica context finds
    no `sparse_read` (attribute access is refused there) and gathers from
    the variable converted to a tensor: the whole table read, and copied
    once the variable is in TF's copy-on-read mode, at every gather
    (measured: 232 ms a gather of 8k rows from a 2,000,000 x 32 table under
    `MirroredStrategy`, 2 ms from the replica's copy). Only under
    `MirroredStrategy` and `MultiWorkerMirroredStrategy`: inside a TPU
    computation TF reads a replicated variable through a handle of all its
    copies, which one copy would bypass. Anything else is returned as it
    is.
    """
    mirrored = (
        tf.distribute.MirroredStrategy,
        tf.distribute.MultiWorkerMirroredStrategy,
    )
    if (
        isinstance(variable, tf.distribute.DistributedValues)
        and isinstance(tf.distribute.get_strategy(), mirrored)
        and not tf.distribute.in_cross_replica_context()
    ):
        return variable._get_on_device_or_primary()
    return variable
