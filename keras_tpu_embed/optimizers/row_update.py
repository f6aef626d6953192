"""One embedding step on a table: `apply_update`.

One step, per table, on the gradient of each distinct row (duplicate ids
in the batch summed, as the engine sums them):

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
"""

from __future__ import annotations

from typing import Any
from typing import Mapping

from keras_tpu_embed._compat import tf
from keras_tpu_embed._tf_private import replica_local_variable
from keras_tpu_embed.optimizers import compiled_rows
from keras_tpu_embed.optimizers.base import EmbeddingOptimizer
from keras_tpu_embed.parameter_server import shard_rows
from keras_tpu_embed.parameter_server.sharded_tables import is_sharded
from keras_tpu_embed.types import Tensor


def _clip(value: Tensor, bounds: tuple[float | None, float | None]) -> Tensor:
    low, high = bounds
    if low is not None:
        value = tf.maximum(value, tf.cast(low, value.dtype))
    if high is not None:
        value = tf.minimum(value, tf.cast(high, value.dtype))
    return value


def apply_update(
    optimizer: EmbeddingOptimizer,
    table: tf.Variable,
    slots: Mapping[str, tf.Variable],
    unique_ids: Tensor,
    gradient: Tensor,
    learning_rate: Tensor,
    rows: Tensor | None = None,
    guard: Tensor | None = None,
    count: Tensor | None = None,
) -> list[Any]:
    """Applies one engine step to `table` (see the module docstring).

    Args:
        optimizer: The table's optimizer.
        table: The table variable, `[vocabulary_size, dim]`.
        slots: The optimizer's slot variables, keyed by slot name.
        unique_ids: Row ids, `[n]`. Repeated ids are allowed when each
            repetition carries the same (total) gradient: they compute the
            same new values, so their scatters agree. For rules that update
            every row, repeated ids' gradients are summed instead.
        gradient: The gradient of each row with duplicate ids already summed,
            as the engine sums them, `[n, dim]`.
        learning_rate: A scalar.
        rows: `table`'s current rows at `unique_ids`, when the caller has
            them already (saves a random gather over the table).
        guard: A boolean scalar; when given, the step runs only if it is
            true (an XLA-compatible `tf.cond`). Skipped where a zero
            gradient changes nothing (`_zero_gradient_is_noop`), which is
            what the update then gets when the guard is false: under XLA the
            conditional made the benchmark's training step 1.2x slower.
        count: When given, only the first `count` of `unique_ids` are rows
            to update; the rest pad them (to `compiled_rows.padded_size`)
            so that the step runs as one XLA computation
            (`compiled_rows.py`). `rows` must then be given, padded too.

    Returns:
        The update ops, for control dependencies.
    """
    if guard is not None and not _zero_gradient_is_noop(optimizer):
        done = tf.cond(
            guard,
            lambda: _with_done(
                apply_update(
                    optimizer,
                    table,
                    slots,
                    unique_ids,
                    gradient,
                    learning_rate,
                    rows,
                    count=count,
                )
            ),
            lambda: tf.constant(True),
        )
        return [done]

    def rule(
        rows: Tensor,
        old_slots: Mapping[str, Tensor],
        gradient: Tensor,
        learning_rate: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        if not optimizer.updates_all_rows():
            gradient = _clip(gradient, optimizer.gradient_clip_bounds)
        return _rule(optimizer, rows, old_slots, gradient, learning_rate)

    if is_sharded(table):
        # On parameter servers: order-correct gathers, per-shard writes.
        if optimizer.updates_all_rows():
            return shard_rows.dense_update(
                lambda *args: _rule(optimizer, *args),
                table,
                slots,
                unique_ids,
                _clip(gradient, optimizer.gradient_clip_bounds),
                learning_rate,
            )
        return shard_rows.sparse_update(
            rule, table, slots, unique_ids, gradient, learning_rate, count, rows
        )
    if count is not None and not optimizer.updates_all_rows():
        assert rows is not None, "padded rows come from the forward gather"
        unique_ids, new_rows, new_slots = compiled_rows.step(
            rule, slots, unique_ids, rows, gradient, learning_rate, count
        )
        return _scatter(table, slots, unique_ids, new_rows, new_slots)
    if optimizer.updates_all_rows():
        # Non-lazy rules move untouched rows too: a dense step.
        gradient = tf.scatter_nd(
            unique_ids[:, tf.newaxis],
            _clip(gradient, optimizer.gradient_clip_bounds),
            tf.shape(table, tf.int64),
        )
        rows = table.read_value()
        old_slots = {name: var.read_value() for name, var in slots.items()}
    else:
        # The replica's own copies: `tf.gather` on a mirrored variable
        # reads all of it (`_tf_private.replica_local_variable`).
        if rows is None:
            rows = tf.gather(replica_local_variable(table), unique_ids)
        old_slots = {
            name: tf.gather(replica_local_variable(var), unique_ids)
            for name, var in slots.items()
        }
    new_rows, new_slots = rule(
        rows, old_slots, gradient, tf.cast(learning_rate, rows.dtype)
    )
    if optimizer.updates_all_rows():
        ops = [table.assign(new_rows)]
        ops += [slots[name].assign(value) for name, value in new_slots.items()]
        return ops
    return _scatter(table, slots, unique_ids, new_rows, new_slots)


def _rule(
    optimizer: EmbeddingOptimizer,
    rows: Tensor,
    old_slots: Mapping[str, Tensor],
    gradient: Tensor,
    learning_rate: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Steps 2-4 of the module docstring on gathered rows (or all rows)."""
    if optimizer.weight_decay_factor:
        decay = tf.cast(optimizer.weight_decay_factor, rows.dtype)
        if optimizer.multiply_weight_decay_factor_by_learning_rate:
            decay = decay * learning_rate
        rows = rows - decay * rows
    new_rows, new_slots = optimizer.update(
        rows, old_slots, gradient, learning_rate
    )
    new_rows = _clip(
        new_rows, (optimizer.clip_weight_min, optimizer.clip_weight_max)
    )
    return new_rows, new_slots


def _scatter(
    table: tf.Variable,
    slots: Mapping[str, tf.Variable],
    unique_ids: Tensor,
    new_rows: Tensor,
    new_slots: Mapping[str, Tensor],
) -> list[Any]:
    ops = [table.scatter_update(tf.IndexedSlices(new_rows, unique_ids))]
    for name, value in new_slots.items():
        ops.append(
            slots[name].scatter_update(tf.IndexedSlices(value, unique_ids))
        )
    return ops


def refuse_non_finite(
    arguments: dict[str, Any], table_name: str, step: Tensor
) -> dict[str, Any]:
    """`apply_update` arguments that never write a non-finite gradient.

    A NaN or inf in the gradient would make every touched row NaN while
    the loss can stay finite (so `TerminateOnNaN` never fires). The update
    of the table is skipped (the guard, with a zeroed gradient for the
    rules that run regardless of it) and an assertion names the table and
    the step; XLA compiles assertions to nothing, so there the skip is all.
    """
    gradient = arguments["gradient"]
    finite = all_finite(gradient)
    check = tf.debugging.Assert(finite, non_finite_message(table_name, step))
    with tf.control_dependencies([check]):
        guard = tf.identity(finite)
    if arguments.get("guard") is not None:
        guard = tf.logical_and(arguments["guard"], guard)
    # A cond, not an element-wise select: a finite gradient (every step
    # but a broken one) passes through without another pass over it.
    return dict(
        arguments,
        gradient=tf.cond(
            finite, lambda: gradient, lambda: tf.zeros_like(gradient)
        ),
        guard=guard,
    )


def non_finite_message(table_name: str, step: Tensor) -> list[Any]:
    """The assertion data that names a table whose gradient is not finite
    and the embedding step."""
    return [
        f"Embedding table '{table_name}' received a NaN or inf gradient "
        "at embedding step",
        step,
        "; its update was skipped. Find the non-finite operation "
        "(tf.debugging.enable_check_numerics()), or set "
        "EmbeddingConfig(non_finite_updates='allow').",
    ]


def all_finite(values: Tensor) -> Tensor:
    """Whether every element of `values` is finite, in one pass when so.

    A sum is finite only if every term is (NaN and inf carry through any
    addition); only a sum that is not (a non-finite term, or finite terms
    that overflow it) is followed by the element-wise check. Measured on a
    `[60000, 64]` gradient: 0.5 ms against 0.75 for `is_finite` + `all`.
    """
    answer: Tensor = tf.cond(
        tf.math.is_finite(tf.reduce_sum(values)),
        lambda: tf.constant(True),
        lambda: tf.reduce_all(tf.math.is_finite(values)),
    )
    return answer


def _with_done(ops: list[Any]) -> Tensor:
    with tf.control_dependencies(ops):
        return tf.constant(True)


def _zero_gradient_is_noop(optimizer: EmbeddingOptimizer) -> bool:
    """Whether a step with an all-zero gradient leaves rows and slots as is.

    True for SGD and Adagrad (whose accumulator stays > 0) without weight
    decay or weight clipping; momenta, FTRL's linear slot, decay and clipping
    all move a row that receives a zero gradient.
    """
    return (
        optimizer.zero_gradient_is_noop
        and not optimizer.weight_decay_factor
        and optimizer.clip_weight_min is None
        and optimizer.clip_weight_max is None
    )
