"""What the TPU embedding engine would refuse or answer wrongly, said first.

TF's mid-level API fails late and tersely (at the first enqueue, or in a
later layer) on inputs this package can check at build or trace time; each
check here names the feature and says what to do.
"""

from __future__ import annotations

from typing import AbstractSet
from typing import Any
from typing import Collection
from typing import Protocol
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.types import Tensor


class Member(Protocol):
    """A layer registered with the engine, as the checks see it."""

    name: str
    input_keys: frozenset[str] | None
    features: dict[str, tuple[str, str | None]]


def check_every_layer_gets_every_feature(members: Sequence[Member]) -> None:
    """Every layer must receive every engine feature (one enqueue)."""
    needed: dict[str, str] = {}
    for member in members:
        for ids_key, weights_key in member.features.values():
            needed.setdefault(ids_key, member.name)
            if weights_key:
                needed.setdefault(weights_key, member.name)
    for member in members:
        if member.input_keys is None:
            continue
        missing = sorted(set(needed) - member.input_keys)
        if missing:
            readers = sorted({needed[key] for key in missing})
            raise ValueError(
                "The TPU embedding engine enqueues every embedding-core "
                "feature of the model once per step, from the input of "
                f"the first embedding layer called. Layer '{member.name}' "
                f"does not receive {missing} (read by {readers}). Pass the "
                "same feature dict (the FeaturePreprocessor output) to "
                "every embedding layer of the model."
            )


def check_no_sequence_lengths(
    layer: str, columns: Sequence[AnyEmbeddingColumn]
) -> None:
    """Refuses `return_sequence_lengths` for sequence columns on the engine.

    Args:
        layer: The layer's kind and name, for the message.
        columns: The layer's columns on the engine.

    Raises:
        ValueError: naming the sequence columns, with the two fixes.
    """
    sequences = [c.name for c in columns if c.is_sequence]
    if sequences:
        raise ValueError(
            f"{layer}: the TPU embedding "
            "engine returns no sequence lengths, so "
            "`return_sequence_lengths=True` cannot serve the sequence "
            f"columns {sequences} on it. Feed the lengths as a "
            "dense feature, or set embedding_lookup_device="
            "'tpu_tensor_core' on those columns."
        )


def check_enqueue_inputs(
    features: dict[str, Tensor],
    sequence_features: Collection[str],
    made_sparse: Collection[str] = (),
) -> None:
    """Refuses, at trace time, inputs the engine would answer wrongly.

    TF's V1 engine reads a dense input as one id per example and sizes
    the output from the input shape
    (`TPUEmbedding._get_output_shapes_from_input_shapes`): a dense
    sequence feature would come back combined, `[batch, dim]`, not
    `[batch, max_sequence_length, dim]`. Wider dense ids, `[batch, n]`
    with n > 1, TF refuses with a message that names no fix.

    TF's enqueue takes one of sparse or ragged ids per call (its
    docstring, `TPUEmbedding.enqueue`), and one enqueue carries every
    engine feature of a step. The columns' id rules rewrite their
    features as sparse ids on the host (`made_sparse`,
    `engine_host_ids.py`), so only the others may not mix.
    """
    for feature, value in features.items():
        shape = value.shape if isinstance(value, tf.Tensor) else None
        if (
            shape is not None
            and feature not in sequence_features
            and shape.rank is not None
            and shape.rank >= 2
            and shape[-1] != 1
        ):
            raise ValueError(
                f"Feature '{feature}' reaches the TPU embedding engine as "
                f"dense ids of shape {shape}. The engine reads dense ids as "
                "one id per example ([batch] or [batch, 1]); feed several "
                "ids per example as a tf.SparseTensor or tf.RaggedTensor: "
                "kte.distribute_dataset(strategy, dataset, "
                "global_batch_size, preprocessor=kte.FeaturePreprocessor("
                "columns)) turns the raw features into sparse ids on the "
                "host."
            )
        if isinstance(value, tf.Tensor) and feature in sequence_features:
            raise ValueError(
                f"Sequence feature '{feature}' reaches the TPU embedding "
                f"engine as a dense tensor of shape {value.shape}. The "
                "engine reads dense ids as one id per example and would "
                "return [batch, dim], not [batch, max_sequence_length, "
                "dim]. Feed it as a tf.SparseTensor or tf.RaggedTensor "
                "(kte.FeaturePreprocessor outputs sparse ids)."
            )
    as_given = {f: v for f, v in features.items() if f not in made_sparse}
    sparse = sorted(
        f for f, v in as_given.items() if isinstance(v, tf.SparseTensor)
    )
    ragged = sorted(
        f for f, v in as_given.items() if isinstance(v, tf.RaggedTensor)
    )
    if sparse and ragged:
        raise ValueError(
            "The TPU embedding engine takes one step's ids in one enqueue, "
            "either all sparse or all ragged, but its features are sparse "
            f"{sparse} and ragged {ragged}. Feed them one way: e.g. "
            "declare every multivalent input keras.Input(..., sparse=True) "
            "and turn ragged features into tf.SparseTensor in the input "
            "pipeline (ragged.to_sparse()); kte.FeaturePreprocessor "
            "outputs sparse ids for every column."
        )


def non_direct_inputs_message(
    error: Exception, features: dict[str, Any]
) -> str:
    """TF's refusal of ids that are not direct inputs, with the fix.

    TF's enqueue takes only inputs that `tpu.replicate` marked as the
    step's own (`tpu_embedding_v2.py`,
    `TPUEmbedding._raise_error_for_non_direct_inputs`), and under
    TPUStrategy's dynamic padding, on by default and not switched off by
    Keras, it marks no dense input once any dense input of the step has a
    dimension of unknown size (`tensorflow/python/tpu/tpu.py`,
    `split_compile_and_replicate` after `_pad_all_input`); the components
    of sparse and ragged inputs, never padded, keep the mark.
    """

    def is_direct(value: Any) -> bool:
        try:
            return bool(value.op.get_attr("_tpu_input_identity"))
        except ValueError:
            return False

    dense = sorted(
        feature
        for feature, value in features.items()
        if isinstance(value, tf.Tensor) and not is_direct(value)
    )
    return (
        f"{error}\nThe TPU embedding engine takes only the step's direct "
        f"inputs, and the dense ids of {dense} are not. The usual cause "
        "is TPUStrategy's dynamic padding, which Keras leaves on: as soon "
        "as one dense input of the step (ids, features, labels) has a "
        "dimension of unknown size, e.g. the unknown batch that "
        "model.compile(steps_per_execution > 1) gives the step, or a "
        "dense feature of variable width, every dense input is padded and "
        "none is a direct input any more; sparse and ragged ids never "
        "are. Feed these ids as sparse ids (keras.Input(..., sparse=True), "
        "or kte.distribute_dataset(..., preprocessor=kte."
        "FeaturePreprocessor(columns))), or give every dense input of the "
        "step a static shape and compile with steps_per_execution=1. Ids "
        "computed inside the model (a cast, a reshape) are not direct "
        "inputs either: feed them as the model's inputs are declared."
    )


def set_static_batch(values: dict[str, Any], batch: int | None) -> list[Any]:
    """Gives `values` with an unknown batch dimension the static `batch`.

    Under `model.compile(steps_per_execution=N > 1)` Keras feeds the step
    from `get_next_as_optional` inside a `tf.while_loop`
    (`keras/src/backend/tensorflow/trainer.py`, `multi_step_on_iterator`).
    For a finite dataset TF's distributed iterator then pairs each
    replica's batch with an empty dummy in a `tf.cond`
    (`tensorflow/python/distribute/input_lib.py`, `_get_value_or_dummy`),
    which drops the static batch dimension that `drop_remainder=True` gave
    the dataset, and TF's engine cannot be sized without it.

    The shape is set in place (`set_shape`): TF's enqueue takes only the
    step's direct inputs, so no op may come between. Returns the checks
    that the batch is that size when the step runs (an
    `InvalidArgumentError` otherwise, never a silent reshape), for the
    caller to make its outputs depend on. `None` values (no weights) and
    known batches are left as they are.

    The checks run where the step runs on CPU (the emulation, tests). XLA
    drops `Assert` ops (`tf2xla/kernels/assert_op.cc`), so on a TPU they
    are not evaluated: there a batch of another size than the static one
    meets the TPU program compiled for that shape, which has not been run
    on a TPU with this package.
    """
    checks: list[Any] = []
    if batch is None:
        return checks
    for value in values.values():
        if value is None or value.shape.rank is None:
            continue
        if value.shape[0] is not None:
            continue
        if isinstance(value, tf.RaggedTensor):
            rows = tf.shape(value.row_splits, out_type=tf.int64)[0] - 1
            value.row_splits.set_shape([batch + 1])
        elif isinstance(value, tf.SparseTensor):
            rows = tf.cast(value.dense_shape[0], tf.int64)
            value.set_shape([batch, *value.shape[1:]])
        else:
            rows = tf.shape(value, out_type=tf.int64)[0]
            value.set_shape([batch, *value.shape[1:]])
        checks.append(
            tf.debugging.assert_equal(
                rows,
                tf.constant(batch, tf.int64),
                message=(
                    "The per-replica batch differs from the one the TPU "
                    "embedding engine was given (kte.distribute_dataset's)"
                ),
            )
        )
    return checks


def check_batch_size(
    features: dict[str, Tensor], first_batch_size: int | None
) -> int:
    """One static per-replica batch size for the engine's lifetime.

    Returns the batch of this step; `first_batch_size` is the first step's.

    TF's V1 engine sizes its outputs at the first enqueue and checks
    every later enqueue against them (`tpu_embedding_v2.py`,
    `TPUEmbedding.enqueue` -> `_check_output_shapes`: "Inconsistent
    shape"); an unknown batch cannot build it ("not fully defined").
    Both are said here first, with the fix.
    """
    sizes = {name: value.shape[0] for name, value in features.items()}
    unknown = sorted(name for name, size in sizes.items() if size is None)
    if unknown:
        raise ValueError(
            f"The features {unknown} reach the TPU embedding engine with "
            "an unknown batch size. The engine needs a static batch: "
            "feed the model with kte.distribute_dataset(strategy, "
            "dataset, global_batch_size=...), which batches with "
            "drop_remainder=True. Under model.compile("
            "steps_per_execution > 1) Keras' multi-step loop loses the "
            "batch dimension (TF's partial-batch handling) and the engine "
            "takes it from kte.distribute_dataset: use it, with one "
            "global_batch_size per strategy (or a first step with "
            "steps_per_execution=1), or compile with "
            "steps_per_execution=1."
        )
    batches = sorted(set(sizes.values()))
    if len(batches) > 1:
        raise ValueError(
            "The features of one step reach the TPU embedding engine "
            f"with different batch sizes: {sizes}. Batch them together."
        )
    batch = int(batches[0])
    if first_batch_size is None:
        return batch
    if batch != first_batch_size:
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        raise ValueError(
            "The TPU embedding engine was built for a per-replica batch "
            f"of {first_batch_size} (global {first_batch_size * replicas}"
            f" over {replicas} replicas) by its first step, and this step "
            f"feeds {batch}; TF fixes the batch at the first step "
            f"('Inconsistent shape'). {SAME_BATCH_ADVICE}"
        )
    return batch


SAME_BATCH_ADVICE = (
    "Use the same global_batch_size in kte.distribute_dataset for fit, "
    "evaluate and predict (the last partial batch is dropped)."
)


def another_batch_message(
    first_batch_size: int | None, dataset_batches: AbstractSet[int]
) -> str | None:
    """Why a step after the first arrives with an unknown batch, if the
    strategy's datasets say: None when they have no batch but the engine's.

    Keras traces its step again, with the batch dimension unknown
    (`tf.function(reduce_retracing=True)`), when a dataset of another
    batch feeds it. TPUStrategy's dynamic padding then pads the dense ids,
    and TF's enqueue refuses them as no direct input of the step
    (`non_direct_inputs_message`) before any batch can be compared: this
    names the cause the user can act on.
    """
    if first_batch_size is None or not set(dataset_batches) - {
        first_batch_size
    }:
        return None
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return (
        "This step's batch is unknown: Keras traces its step again, with "
        "the batch unknown, when a dataset of another batch size feeds it. "
        "The TPU embedding engine was built for a per-replica batch of "
        f"{first_batch_size} (global {first_batch_size * replicas} over "
        f"{replicas} replicas) by its first step, and kte.distribute_dataset "
        "has made datasets of per-replica batches "
        f"{sorted(dataset_batches)} on this strategy; TF fixes the batch at "
        f"the first step. {SAME_BATCH_ADVICE}"
    )


def check_activation_shapes(
    activations: dict[str, Tensor], feature_configs: dict[str, Any]
) -> None:
    """The engine's activations have the shapes the layers declare.

    TF's `TPUEmbedding.dequeue` returns `(*output_shape, dim)` with the
    output shape read from the input (`tpu_embedding_v2.py`,
    `_get_output_shapes_from_input_shapes`): `[batch, dim]` for dense
    `[batch]` / `[batch, 1]` and for sparse or ragged ids,
    `[batch, max_sequence_length, dim]` for sparse or ragged sequence
    ids. Anything else (e.g. an `output_shape` in a user's
    `FeatureConfig`) fails here, at trace time, not in a later layer.
    """
    for feature, value in activations.items():
        config = feature_configs[feature]
        tail = [config.table.dim]
        if config.max_sequence_length > 0:
            tail.insert(0, config.max_sequence_length)
        shape = value.shape
        if shape.rank != len(tail) + 1 or shape.as_list()[1:] != tail:
            raise ValueError(
                f"The TPU embedding engine returned shape {shape} for "
                f"feature '{feature}'; the layer declares "
                f"[batch, {', '.join(map(str, tail))}]. Feed its ids as "
                "dense [batch] / [batch, 1] or as a rank-2 "
                "tf.SparseTensor / tf.RaggedTensor, and leave "
                "FeatureConfig.output_shape unset."
            )
