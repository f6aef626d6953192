"""The one place that checks the backend and touches TensorFlow internals.

Everything else in the package imports `tensorflow` and `keras` through the
public API only; the private feature-column classes that column conversion
needs are imported here so that a TensorFlow upgrade breaks one module.
"""

import os
import sys
from typing import Any

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

import keras.src.backend.tensorflow.core  # noqa: E402
from keras.src.backend.common.stateless_scope import (  # noqa: E402
    in_stateless_scope as keras_in_stateless_scope,
)
from keras.src.backend.common.symbolic_scope import (  # noqa: E402
    in_symbolic_scope as keras_in_symbolic_scope,
)
from keras.src.backend.tensorflow.random import _cast_seed as keras_cast_seed  # noqa: E402
from keras.src.initializers.random_initializers import (  # noqa: E402
    compute_fans as keras_compute_fans,
)
from keras.src.random.seed_generator import draw_seed as keras_draw_seed  # noqa: E402
from keras.src.utils.io_utils import print_msg  # noqa: E402
from tensorflow.core.framework import attr_value_pb2 as tf_attr_value_pb2  # noqa: E402

# Checkpoint keys (`escape_local_name`) and the SparseCore table layout proto
# that a SparseCore table's checkpoint carries.
from tensorflow.core.tpu.kernels import (  # noqa: E402
    sparse_core_layout_pb2 as tf_sparse_core_layout_pb2,
)

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
from tensorflow.python.ops import control_flow_util as tf_control_flow_util  # noqa: E402
from tensorflow.python.ops import init_ops as tf_init_ops  # noqa: E402
from tensorflow.python.ops import (  # noqa: E402
    resource_variable_ops as tf_resource_variable_ops,
)

# The fused serving lookup's error path: TF's `tf.cond` lowers to
# Switch/Merge, and every call then walks the untaken fallback branch's
# hundreds of ops as dead nodes; `fast_cond_v2` keeps one `If` op whose
# branch runs as a function call only when taken (serving only: it is not
# differentiable).
from tensorflow.python.ops.cond_v2 import fast_cond_v2 as tf_fast_cond  # noqa: E402
from tensorflow.python.tpu import feature_column_v2 as tf_tpu_feature_column_v2  # noqa: E402
from tensorflow.python.tpu import tpu as tf_tpu  # noqa: E402
from tensorflow.python.tpu import tpu_embedding_v2 as tf_tpu_embedding_v2  # noqa: E402
from tensorflow.python.tpu import tpu_embedding_v3 as tf_tpu_embedding_v3  # noqa: E402
from tensorflow.python.tpu import (  # noqa: E402
    tpu_embedding_v3_utils as tf_tpu_embedding_v3_utils,
)
from tensorflow.python.tpu import tpu_replication as tf_tpu_replication  # noqa: E402

# The SparseCore ops of `TPUEmbeddingV2`, which TF looks up by name in this
# module at each call (`keras_tpu_embed.testing.emulated_sparsecore`).
from tensorflow.python.tpu.ops import gen_xla_ops as tf_gen_xla_ops  # noqa: E402
from tensorflow.python.tpu.ops import tpu_ops as tf_tpu_ops  # noqa: E402
from tensorflow.python.trackable import trackable_utils as tf_trackable_utils  # noqa: E402

# What TF's sharded variable creator hands an initializer that takes
# `shard_info` (`tpu_embedding_v2.make_sharded_variable_creator`).
from tensorflow.python.trackable.base import ShardInfo as TFShardInfo  # noqa: E402
from tensorflow.python.training.saving.saveable_object import (  # noqa: E402
    SaveableObject as TFSaveableObject,
)
from tensorflow.python.training.saving.saveable_object import (  # noqa: E402
    SaveSpec as TFSaveSpec,
)
from tensorflow.python.util import nest as tf_nest  # noqa: E402

# A checkpoint dependency that saves and restores tensors of its own
# (`_serialize_to_tensors` / `_restore_from_tensors`): only TF's internal
# namespace exports the base class.
Trackable: Any = tf.__internal__.tracking.Trackable


def _restore_keras_variables_in_traced_restores() -> None:
    """Lets a Keras variable restore a tensor of unknown shape.

    TF traces a checkpoint restore whose tensors live on several tasks
    (`functional_saver.MultiDeviceSaver.restore`: a pod's hosts each read
    their own shards), and a traced `RestoreV2` gives tensors of unknown
    rank. Keras' TF variable restores a distributed value (a mirrored
    variable has no `_restore_from_tensors` of its own) through `assign`,
    whose shape check (`shape_equal`) takes the length of that unknown
    shape: "Cannot take the length of shape with unknown rank"
    (`keras/src/backend/tensorflow/core.py`, `Variable.
    _restore_from_tensors`). So `tf.train.Checkpoint(model=...).read` of
    any Keras model beside per-host shards failed on a pod. The restored
    tensor is given the variable's static shape first; a tensor of another
    shape fails TF's own check at run time, naming both.
    """
    variable_class = keras.src.backend.tensorflow.core.Variable
    keras_restore = variable_class._restore_from_tensors

    def restore(self: Any, restored_tensors: dict[str, Any]) -> Any:
        value = restored_tensors.get("VARIABLE_VALUE")
        if isinstance(value, tf.Tensor) and value.shape.rank is None:
            restored_tensors = dict(restored_tensors)
            restored_tensors["VARIABLE_VALUE"] = tf.ensure_shape(
                value, self.shape
            )
        return keras_restore(self, restored_tensors)

    if not getattr(keras_restore, "_keras_tpu_embed", False):
        restore._keras_tpu_embed = True  # type: ignore[attr-defined]
        variable_class._restore_from_tensors = restore


_restore_keras_variables_in_traced_restores()


def keras_random_seed(seed: int) -> Any:
    """The `[2]` int32 seed Keras' TF backend gives `tf.random.stateless_*`
    for an initializer's integer `seed` (`backend/tensorflow/random.py`)."""
    return keras_cast_seed(keras_draw_seed(seed))


def nested_layers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Every layer inside `layer`, at any depth (Keras keeps this private)."""
    return list(layer._flatten_layers(include_self=False))


def keras_call_as_in_model(
    layer: keras.layers.Layer, values: dict[int, Any], **kwargs: Any
) -> Any:
    """Calls `layer` as a functional model first called it, each of its
    symbolic inputs replaced by `values[id(symbolic input)]`, with
    `kwargs` added (Keras keeps a call's arguments private, in its node)."""
    args, given = layer._inbound_nodes[0].arguments.fill_in(values)
    return layer(*args, **{**given, **kwargs})


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


__all__ = [
    "tf_attr_value_pb2",
    "TFSaveSpec",
    "TFSaveableObject",
    "tf_sparse_core_layout_pb2",
    "tf_trackable_utils",
    "TFShardInfo",
    "Trackable",
    "caller_stacklevel",
    "tf",
    "keras",
    "tf_control_flow_ops",
    "tf_control_flow_util",
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
    "tf_tpu_embedding_v2",
    "tf_tpu_embedding_v3",
    "tf_tpu_embedding_v3_utils",
    "tf_nest",
    "tf_tpu_strategy",
    "tf_tpu_util",
    "tf_sequence_feature_column",
    "tf_fast_cond",
    "tf_init_ops",
    "keras_compute_fans",
    "keras_in_stateless_scope",
    "keras_in_symbolic_scope",
    "keras_random_seed",
    "nested_layers",
    "keras_call_as_in_model",
    "print_msg",
    "tf_tpu_feature_column_v2",
]
