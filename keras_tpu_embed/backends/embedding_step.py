"""What `EmbeddingConfig` adds to the optimizer's step, written once.

One embedding step, per table, on each distinct row's summed gradient:

1. the gradient multiplier: `config.gradient_multiplier_fn(step)`;
2. `config.clipping_limit`: each gradient element clipped to
   `[-limit, limit]`;
3. the optimizer's own step (`optimizers/row_update.py`): its `clipvalue`,
   decoupled weight decay, its rule, weight clipping.

The learning rate is the column's `learning_rate_fn(step)` where the column
has one, else the optimizer's. `step` is the global embedding step (updates
already applied).

The local tables (sparse and dense XLA paths) apply these rules themselves;
the TPU embedding engine gets them as its optimizer (`engine_optimizer`:
the learning-rate function becomes a dynamic learning rate, the clipping
limit an intersected `clipvalue`) plus the multiplier on the gradients it
receives. Both read the functions below.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_tpu_embed._compat import tf
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.optimizers import EmbeddingOptimizer
from keras_tpu_embed.tables.table_specs import TableSpec
from keras_tpu_embed.types import Tensor

ClipBounds = tuple[float | None, float | None]


def learning_rate(table: TableSpec, config: EmbeddingConfig, step: Any) -> Any:
    """The table's learning rate at `step`."""
    if table.learning_rate_fn is not None:
        return table.learning_rate_fn(step)
    return config.optimizer.current_learning_rate()


def scale_gradient(gradient: Tensor, config: EmbeddingConfig, step: Any) -> Any:
    """Rule 1: the gradient multiplier, when the config has one."""
    if config.gradient_multiplier_fn is None:
        return gradient
    multiplier = config.gradient_multiplier_fn(step)
    return gradient * tf.cast(multiplier, gradient.dtype)


def scale_and_clip(gradient: Tensor, config: EmbeddingConfig, step: Any) -> Any:
    """Rules 1 and 2, in that order."""
    gradient = scale_gradient(gradient, config, step)
    if config.clipping_limit is not None:
        limit = float(config.clipping_limit)
        gradient = tf.clip_by_value(gradient, -limit, limit)
    return gradient


def _tighter(a: ClipBounds, b: ClipBounds) -> ClipBounds:
    lows = [x for x in (a[0], b[0]) if x is not None]
    highs = [x for x in (a[1], b[1]) if x is not None]
    return (max(lows) if lows else None, min(highs) if highs else None)


def engine_optimizer(
    table: TableSpec, config: EmbeddingConfig, step: Any
) -> EmbeddingOptimizer:
    """The table's optimizer as the TPU engine must see it.

    A column's `learning_rate_fn` becomes the optimizer's dynamic learning
    rate (a callable reading `step`); `clipping_limit` becomes `clipvalue`
    (intersected with the optimizer's own clip, if any): clipping to the
    limit and then to `clipvalue` is clipping to their intersection.
    """
    optimizer = config.optimizer
    changes: dict[str, Any] = {}
    if table.learning_rate_fn is not None:
        learning_rate_fn = table.learning_rate_fn
        changes["learning_rate"] = lambda: learning_rate_fn(step)
    if config.clipping_limit is not None:
        limit = float(config.clipping_limit)
        changes["clipvalue"] = _tighter(
            optimizer.gradient_clip_bounds, (-limit, limit)
        )
    return dataclasses.replace(optimizer, **changes) if changes else optimizer
