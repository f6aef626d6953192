"""`distribute_dataset`: input for the TPU embedding engine.

The engine reads its ids from the host: `enqueue` rejects tensors that a
distributed dataset has already copied to the TPU. So the dataset is
distributed with `tf.distribute.InputOptions(experimental_fetch_to_device=
False)`, through `distribute_datasets_from_function` so that each host reads
its own share (multi-host) and `model.fit` does not shard it again. Batches
are cut per replica with `drop_remainder=True`: the TPU step needs static
shapes. The batch size a user gives is always the global one.
"""

from __future__ import annotations

from typing import Any
from typing import Callable

from keras_tpu_embed._compat import tf

# A tf.data.Dataset, or a function of tf.distribute.InputContext to one.
DatasetOrFn = Any


def _check_global_batch_size(strategy: Any, global_batch_size: Any) -> None:
    if (
        isinstance(global_batch_size, bool)
        or not isinstance(global_batch_size, int)
        or global_batch_size <= 0
    ):
        raise ValueError(
            "`global_batch_size` must be a positive int (the batch over all "
            f"replicas). Received: global_batch_size={global_batch_size!r}"
        )
    replicas = strategy.num_replicas_in_sync
    if global_batch_size % replicas:
        raise ValueError(
            f"global_batch_size={global_batch_size} does not split evenly "
            f"over the strategy's {replicas} replicas; use a multiple of "
            f"{replicas}."
        )


def _fetches_to_device(distributed: Any) -> bool:
    options = getattr(distributed, "_options", None)
    if options is None:
        return True  # TF's default
    return bool(options.experimental_fetch_to_device)


def distribute_dataset(
    strategy: Any,
    dataset_or_fn: DatasetOrFn,
    global_batch_size: int | None = None,
    preprocessor: Callable[[Any], Any] | None = None,
) -> Any:
    """Distributes examples so that embedding ids stay on the host.

    Args:
        strategy: The `tf.distribute` strategy the model is built under
            (`TPUStrategy` on TPU; any strategy works).
        dataset_or_fn: A `tf.data.Dataset` of single examples (features,
            labels), which is split over the input hosts; or a function of
            `tf.distribute.InputContext` that returns this host's dataset of
            single examples (it shards itself, e.g. by file); or a
            distributed dataset already made with
            `experimental_fetch_to_device=False`, returned as it is.
        global_batch_size: The batch over all replicas; each replica gets
            `global_batch_size / num_replicas_in_sync` examples, with the
            last partial batch dropped so that shapes are static.
        preprocessor: Applied on the host to the features of each
            per-replica batch (the first item of `(features, labels)`
            elements), typically a `kte.FeaturePreprocessor`, so that raw
            strings become ids inside the input pipeline.

    Returns:
        A `tf.distribute.DistributedDataset` for `model.fit`, `evaluate` and
        `predict`.

    Raises:
        ValueError: a distributed dataset that fetches to device, a batch
            size that is not a positive multiple of the replica count, or a
            missing batch size.

    Example:

    >>> strategy = tf.distribute.get_strategy()
    >>> examples = tf.data.Dataset.from_tensor_slices(
    ...     ({"item": tf.range(10, dtype=tf.int64)}, tf.zeros(10)))
    >>> batches = distribute_dataset(strategy, examples, global_batch_size=4)
    >>> [int(x["item"].shape[0]) for x, _ in batches]
    [4, 4]
    """
    if isinstance(dataset_or_fn, tf.distribute.DistributedDataset):
        if _fetches_to_device(dataset_or_fn):
            raise ValueError(
                "This distributed dataset fetches its tensors to the TPU, but "
                "the TPU embedding engine reads ids on the host. Pass the "
                "tf.data.Dataset itself: kte.distribute_dataset(strategy, "
                "dataset, global_batch_size=...), or distribute it with "
                "options=tf.distribute.InputOptions("
                "experimental_fetch_to_device=False)."
            )
        return dataset_or_fn
    if global_batch_size is None:
        raise ValueError(
            "`global_batch_size` is required: distribute_dataset batches "
            "single examples per replica (with drop_remainder=True)."
        )
    _check_global_batch_size(strategy, global_batch_size)
    if isinstance(dataset_or_fn, tf.data.Dataset):
        make_host_dataset = _sharded(dataset_or_fn)
    elif callable(dataset_or_fn):
        make_host_dataset = dataset_or_fn
    else:
        raise TypeError(
            "`dataset_or_fn` must be a tf.data.Dataset or a function of "
            "tf.distribute.InputContext. Received: "
            f"{type(dataset_or_fn).__name__}"
        )

    def dataset_fn(context: Any) -> Any:
        dataset = make_host_dataset(context)
        per_replica = context.get_per_replica_batch_size(global_batch_size)
        dataset = dataset.batch(per_replica, drop_remainder=True)
        if preprocessor is not None:
            dataset = dataset.map(
                _on_features(preprocessor), num_parallel_calls=tf.data.AUTOTUNE
            )
        return dataset.prefetch(tf.data.AUTOTUNE)

    return strategy.distribute_datasets_from_function(
        dataset_fn,
        options=tf.distribute.InputOptions(experimental_fetch_to_device=False),
    )


def _sharded(dataset: Any) -> Callable[[Any], Any]:
    def host_dataset(context: Any) -> Any:
        if context.num_input_pipelines > 1:
            return dataset.shard(
                context.num_input_pipelines, context.input_pipeline_id
            )
        return dataset

    return host_dataset


def _on_features(preprocessor: Callable[[Any], Any]) -> Callable[..., Any]:
    def apply(*element: Any) -> Any:
        if len(element) == 1:
            return preprocessor(element[0])
        return (preprocessor(element[0]),) + tuple(element[1:])

    return apply
