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

One step of `apply_update`, per table, on the gradient of each distinct row
(duplicate ids in the batch summed, as the engine sums them):

1. clip the gradient to `clipvalue`;
2. decoupled weight decay (inferred from the proto's reference to
   `DecoupledWeightDecayExtension`): `w -= factor * w`, with the factor
   multiplied by the learning rate when
   `multiply_weight_decay_factor_by_learning_rate`;
3. the optimizer's rule on `w` and its slots;
4. clip the weights to `[clip_weight_min, clip_weight_max]`.

Only the touched rows are read and written — a step costs O(ids in the
batch), never O(vocabulary) — except for `Adam(lazy_adam=False)`, whose
non-lazy rule moves every row on every step, as the engine's does.

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
