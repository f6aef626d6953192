"""The one place that checks the backend and touches TensorFlow internals.

Everything else in the package imports `tensorflow` and `keras` through the
public API only; the private feature-column classes that column conversion
needs are imported here so that a TensorFlow upgrade breaks one module.
"""

import dataclasses
import os
import sys
from typing import Any
from typing import Callable

_BACKEND = os.environ.get("KERAS_BACKEND", "tensorflow")
if _BACKEND != "tensorflow":
    raise ImportError(
        "keras_tpu_embed runs on the TensorFlow backend of Keras 3 only. "
        f"Received: KERAS_BACKEND={_BACKEND!r}. Set "
        "`os.environ['KERAS_BACKEND'] = 'tensorflow'` before importing keras."
    )
os.environ["KERAS_BACKEND"] = "tensorflow"

try:
    import tensorflow as tf
except ImportError as error:  # pragma: no cover - exercised without TF only
    raise ImportError(
        "keras_tpu_embed needs TensorFlow. Install it with "
        "`pip install 'keras_tpu_embed[cpu]'` (tensorflow-cpu), "
        "`pip install 'keras_tpu_embed[tpu]'` (tensorflow-tpu on a TPU VM) "
        "or `pip install tensorflow`."
    ) from error

import keras  # noqa: E402

if keras.backend.backend() != "tensorflow":  # pragma: no cover
    raise ImportError(
        "keras_tpu_embed runs on the TensorFlow backend of Keras 3 only. "
        f"Keras was imported with backend {keras.backend.backend()!r}; set "
        "KERAS_BACKEND=tensorflow before the first `import keras`."
    )

from keras.src.backend.common.stateless_scope import (  # noqa: E402
    in_stateless_scope as keras_in_stateless_scope,
)
from keras.src.backend.common.symbolic_scope import (  # noqa: E402
    in_symbolic_scope as keras_in_symbolic_scope,
)
from keras.src.backend.tensorflow.random import _cast_seed as keras_cast_seed  # noqa: E402
from keras.src.random.seed_generator import draw_seed as keras_draw_seed  # noqa: E402
from keras.src.utils.io_utils import print_msg  # noqa: E402
from tensorflow.core.framework import attr_value_pb2 as tf_attr_value_pb2  # noqa: E402

# `distribute_dataset` on a pod: a dataset made by the client is copied to
# each host as its graph (what `experimental_distribute_dataset` does); the
# host an input pipeline is being built for is the eager device scope
# (`tf_eager_context` below).
from tensorflow.python.data.experimental.ops import (  # noqa: E402
    distribute as tf_data_distribute,
)

# For `keras_tpu_embed.testing` only: the TPU strategy it subclasses and the
# chip ops it replaces have no public API.
from tensorflow.python.distribute import distribute_lib as tf_distribute_lib  # noqa: E402
from tensorflow.python.distribute import distribute_utils as tf_distribute_utils  # noqa: E402
from tensorflow.python.distribute import (  # noqa: E402
    mirrored_strategy as tf_mirrored_strategy,
)
from tensorflow.python.distribute import tpu_strategy as tf_tpu_strategy  # noqa: E402
from tensorflow.python.distribute import tpu_util as tf_tpu_util  # noqa: E402
from tensorflow.python.eager import context as tf_eager_context  # noqa: E402
from tensorflow.python.feature_column import (  # noqa: E402
    feature_column_v2 as tf_feature_column_v2,
)
from tensorflow.python.feature_column import (  # noqa: E402
    sequence_feature_column as tf_sequence_feature_column,
)
from tensorflow.python.framework import ops as tf_ops  # noqa: E402
from tensorflow.python.ops import control_flow_ops as tf_control_flow_ops  # noqa: E402
from tensorflow.python.ops import init_ops as tf_init_ops  # noqa: E402
from tensorflow.python.ops import (  # noqa: E402
    resource_variable_ops as tf_resource_variable_ops,
)
from tensorflow.python.tpu import feature_column_v2 as tf_tpu_feature_column_v2  # noqa: E402
from tensorflow.python.tpu import tpu as tf_tpu  # noqa: E402
from tensorflow.python.tpu import tpu_embedding_v3 as tf_tpu_embedding_v3  # noqa: E402
from tensorflow.python.tpu import (  # noqa: E402
    tpu_embedding_v3_utils as tf_tpu_embedding_v3_utils,
)
from tensorflow.python.tpu import tpu_replication as tf_tpu_replication  # noqa: E402

# The SparseCore ops of `TPUEmbeddingV2`, which TF looks up by name in this
# module at each call (`keras_tpu_embed.testing.emulated_sparsecore`).
from tensorflow.python.tpu.ops import gen_xla_ops as tf_gen_xla_ops  # noqa: E402
from tensorflow.python.tpu.ops import tpu_ops as tf_tpu_ops  # noqa: E402
from tensorflow.python.training.saving.saveable_object import (  # noqa: E402
    SaveSpec as TFSaveSpec,
)
from tensorflow.python.util import nest as tf_nest  # noqa: E402

from keras_tpu_embed.types import InitializerLike  # noqa: E402
from keras_tpu_embed.types import MidLevelEmbedding  # noqa: E402
from keras_tpu_embed.types import TFFeatureColumn  # noqa: E402

# A checkpoint dependency that saves and restores tensors of its own
# (`_serialize_to_tensors` / `_restore_from_tensors`): only TF's internal
# namespace exports the base class.
Trackable: Any = tf.__internal__.tracking.Trackable


def keras_random_seed(seed: int) -> Any:
    """The `[2]` int32 seed Keras' TF backend gives `tf.random.stateless_*`
    for an initializer's integer `seed` (`backend/tensorflow/random.py`)."""
    return keras_cast_seed(keras_draw_seed(seed))


def nested_layers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Every layer inside `layer`, at any depth (Keras keeps this private)."""
    return list(layer._flatten_layers(include_self=False))


def caller_stacklevel() -> int:
    """The `stacklevel` of a warning raised by the caller of this function
    that points at the first frame outside this package, Keras and
    TensorFlow: a layer's `call` runs under a varying depth of Keras
    frames, so a fixed `stacklevel` names Keras' `traceback_utils.py`."""
    internal = tuple(
        os.path.dirname(module.__file__) + os.sep
        for module in (sys.modules[__package__ or "keras_tpu_embed"], keras, tf)
        if module.__file__
    )
    frame = sys._getframe(1)  # the function that warns: stacklevel 1
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(
        internal
    ):
        frame = frame.f_back
        level += 1
    return level


# ------------------------------------------------- TF private fields, read
# Each function below reads (or sets) one private field of TF that has no
# public accessor; its docstring names the TF source that defines it.


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


def replica_index(context: Any) -> int:
    """This replica's index in its sync group, as a Python int (0 outside
    a replica).

    `ReplicaContext.replica_id_in_sync_group` (`distribute_lib.py`) is a
    tensor; the int it is made from is `_replica_id_in_sync_group`, which
    the emulated chip needs to key its per-replica buffers while tracing.
    """
    return int(getattr(context, "_replica_id_in_sync_group", 0))


def mark_tpu_input_identity(op: Any) -> None:
    """Marks `op` as a direct input of a TPU step, as `tpu.replicate` does.

    `split_compile_and_replicate` in `tensorflow/python/tpu/tpu.py` sets the
    attribute with `Operation._set_attr`; TF's enqueue reads it, and no
    public API sets an op attribute after its creation.
    """
    op._set_attr("_tpu_input_identity", tf_attr_value_pb2.AttrValue(b=True))


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
    """`{table: {slot: sharded variable}}` with the TPU's values on the host.

    `TPUEmbedding._retrieve_variables` copies the values from the TPU (as
    TF does before a checkpoint save) and `_variables` holds them
    (`tpu_embedding_v2.py`); the public `embedding_tables` has no slots.
    """
    mid_level._retrieve_variables()
    return mid_level._variables


def mid_level_load_variables(mid_level: MidLevelEmbedding) -> None:
    """Sends the host copies of the tables to the TPU:
    `TPUEmbedding._load_variables` (`tpu_embedding_v2.py`), which TF runs
    after a checkpoint restore; no public API."""
    mid_level._load_variables()


def engine_optimizer_slot_names(optimizer: Any) -> list[str]:
    """The slots of a `tf.tpu.experimental.embedding` optimizer:
    `_Optimizer._slot_names` (`tpu_embedding_v2_utils.py`), which TF reads
    to create them; no public accessor."""
    return list(optimizer._slot_names())


def traced_replica_id(context: Any) -> int:
    """The replica whose function is being traced, 0 when not known.

    Under `TPUStrategy` `_replica_id_in_sync_group` (`distribute_lib.py`)
    is a tensor: one function is traced for all cores, so the answer is 0;
    replicas that trace one function each have it as a Python int.
    """
    replica = getattr(context, "_replica_id_in_sync_group", 0)
    return replica if isinstance(replica, int) else 0


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


__all__ = [
    "mid_level_built",
    "mid_level_table_variables",
    "mid_level_load_variables",
    "engine_optimizer_slot_names",
    "traced_replica_id",
    "wrap_sparsecore_preprocessing",
    "sparsecore_clone_feature_config",
    "sparsecore_stack_tables",
    "SharedColumnCreatorArguments",
    "TFTPUEmbeddingColumn",
    "TFTPUSharedEmbeddingColumn",
    "TPUColumnArguments",
    "control_flow_context",
    "distributed_dataset_cardinality",
    "distributed_dataset_options",
    "mark_tpu_input_identity",
    "replica_index",
    "set_control_flow_context",
    "set_distributed_dataset_cardinality",
    "shared_column_creator_arguments",
    "tpu_column_arguments",
    "tpu_extended_broadcast_output",
    "tpu_extended_reduce_to",
    "tpu_flatten_and_filter_composite",
    "tpu_pad_all_input",
    "TFSaveSpec",
    "Trackable",
    "caller_stacklevel",
    "tf",
    "keras",
    "tf_control_flow_ops",
    "tf_data_distribute",
    "tf_eager_context",
    "tf_distribute_lib",
    "tf_distribute_utils",
    "tf_feature_column_v2",
    "tf_mirrored_strategy",
    "tf_ops",
    "tf_resource_variable_ops",
    "tf_tpu",
    "tf_tpu_ops",
    "tf_gen_xla_ops",
    "tf_tpu_replication",
    "tf_tpu_embedding_v3",
    "tf_tpu_embedding_v3_utils",
    "tf_nest",
    "tf_tpu_strategy",
    "tf_tpu_util",
    "tf_sequence_feature_column",
    "tf_init_ops",
    "keras_in_stateless_scope",
    "keras_in_symbolic_scope",
    "keras_random_seed",
    "nested_layers",
    "print_msg",
    "tf_tpu_feature_column_v2",
]
