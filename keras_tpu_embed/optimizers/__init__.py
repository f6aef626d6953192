"""Embedding optimizers with the TPU embedding engine's update rules.

Each optimizer mirrors its `tf.tpu.experimental.embedding` twin: same
parameter names and defaults, `to_tpu()` builds that twin, and `update` is the
engine's rule written as pure tensor math on the rows a batch touched, so the
same model trains the same way on CPU, GPU and TPU.

Sources of the rules: the comments of TensorFlow's
`optimization_parameters.proto` and the SparseCore optimizer computations in
`tensorflow/core/tpu/kernels/sparse_core_ops_utils.cc` (which the TPU tests'
numpy references agree with). Where no public source shows the engine's
behaviour, the choice is marked "inferred" below.

One step on a table (gradient clip, decoupled weight decay, the rule,
weight clip; touched rows only, except `Adam(lazy_adam=False)`) is spelled
out in `row_update.py`.

Layout: `base.py` (parameters every optimizer has), one module per
optimizer family, `row_update.py` (one whole step on a table) and
`tf_twins.py` (conversion from the TF optimizers). This module only
re-exports.
"""

from keras_tpu_embed.optimizers.adagrad import Adagrad as Adagrad
from keras_tpu_embed.optimizers.adagrad import (
    AdagradMomentum as AdagradMomentum,
)
from keras_tpu_embed.optimizers.adam import Adam as Adam
from keras_tpu_embed.optimizers.base import (
    EmbeddingOptimizer as EmbeddingOptimizer,
)
from keras_tpu_embed.optimizers.base import SlotSpec as SlotSpec
from keras_tpu_embed.optimizers.ftrl import FTRL as FTRL
from keras_tpu_embed.optimizers.row_update import apply_update as apply_update
from keras_tpu_embed.optimizers.sgd import SGD as SGD
from keras_tpu_embed.optimizers.tf_twins import (
    SUPPORTED_OPTIMIZERS as SUPPORTED_OPTIMIZERS,
)
from keras_tpu_embed.optimizers.tf_twins import from_tpu as from_tpu
from keras_tpu_embed.optimizers.tf_twins import get as get

__all__ = [
    "SGD",
    "Adagrad",
    "AdagradMomentum",
    "Adam",
    "FTRL",
    "EmbeddingOptimizer",
    "SUPPORTED_OPTIMIZERS",
    "from_tpu",
    "get",
]
