"""`distribute_dataset`: input for the TPU embedding engine and replicas.

Under any strategy (`TPUStrategy`, `MirroredStrategy`,
`MultiWorkerMirroredStrategy`) it turns a batched dataset, or single
examples with a global batch size, into per-replica batches of the global
batch, sharded once across hosts.

The engine reads its ids from the host: `enqueue` rejects tensors that a
distributed dataset has already copied to the TPU. So the dataset is
distributed with `tf.distribute.InputOptions(experimental_fetch_to_device=
False)`, through `distribute_datasets_from_function` so that each host reads
its own share (multi-host) and `model.fit` does not shard it again. Batches
are cut per replica with `drop_remainder=True`: the TPU step needs static
shapes. The batch size a user gives is always the global one.

Each host reads its share of every global batch (`host_shares.py`, which
says in which order, and what each kind of input costs a host), and its
ids are cleaned up on the host before the step (`host_ids.py`).
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_data_distribute
from keras_tpu_embed._compat import tf_eager_context
from keras_tpu_embed._tf_private import batch_arguments
from keras_tpu_embed._tf_private import distributed_dataset_cardinality
from keras_tpu_embed._tf_private import distributed_dataset_options
from keras_tpu_embed._tf_private import set_distributed_dataset_cardinality
from keras_tpu_embed.columns.embedding import EmbeddingColumnLike
from keras_tpu_embed.engines import engine_registry
from keras_tpu_embed.pipelines.host_ids import engine_id_filter
from keras_tpu_embed.pipelines.host_ids import keras_dense_ids
from keras_tpu_embed.pipelines.host_ids import tensor_core_padding
from keras_tpu_embed.pipelines.host_shares import batch_size_of
from keras_tpu_embed.pipelines.host_shares import host_slices
from keras_tpu_embed.pipelines.host_shares import pod_shape
from keras_tpu_embed.pipelines.host_shares import sharded_examples

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
    options = distributed_dataset_options(distributed)
    if options is None:
        return True  # TF's default
    return bool(options.experimental_fetch_to_device)


def distribute_dataset(
    strategy: Any,
    dataset_or_fn: DatasetOrFn,
    global_batch_size: int | None = None,
    preprocessor: Callable[[Any], Any] | None = None,
    columns: Sequence[EmbeddingColumnLike] | None = None,
) -> Any:
    """Distributes examples so that embedding ids stay on the host.

    Args:
        strategy: The `tf.distribute` strategy the model is built under:
            `TPUStrategy`, `MirroredStrategy`,
            `MultiWorkerMirroredStrategy`, or the default one.
        dataset_or_fn: A batched `tf.data.Dataset` (without
            `global_batch_size`): its batches are the global batches, each
            split over the replicas in order; a batch of another size than
            the first (a short last batch) is dropped. Or a
            `tf.data.Dataset` of single examples (features, labels), with
            `global_batch_size`, cut into global batches of consecutive
            examples (a short last one is dropped) and split over the hosts
            as above; or a function of `tf.distribute.InputContext` that
            returns this host's dataset of single examples (it shards
            itself, e.g. by file; on a pod, step `s` of `predict` returns
            host 0's `(s * R + r)`-th per-replica batch, then host 1's, for
            `r = 0, 1, ...`); or a distributed dataset already made with
            `experimental_fetch_to_device=False`, returned as it is.
        global_batch_size: The batch over all replicas, for single
            examples; each replica gets `global_batch_size /
            num_replicas_in_sync` examples, with the last partial batch
            dropped so that shapes are static. `None` for a batched dataset.
        preprocessor: Applied on the host to the features of each
            per-replica batch (the first item of `(features, labels)`
            elements), typically a `kte.FeaturePreprocessor`, so that raw
            strings become ids inside the input pipeline.
        columns: The model's embedding columns, for a TPU without an
            embedding engine when `preprocessor` is not a
            `kte.FeaturePreprocessor` of them (see below).

    On a TPU with an embedding engine, negative ids (the preprocessor's -1
    for out-of-vocabulary values without OOV buckets) are dropped from
    sparse and ragged features with their weights, and are an
    `InvalidArgumentError` in dense features the engine reads. Build the
    model under `strategy.scope()` first, so that the dense features of the
    engine are known. A distributed dataset passed in is not changed.

    On a TPU without an embedding engine (e.g. v5e) every table runs the
    tensor-core lookup (`lookups/dense_xla.py`), and each core holds every
    table in full: that is what the tensor-core path is, not something
    input can change. Its ids are made dense here, on the host:
    `[per_replica_batch, width]` with the column's width
    (`tensor_core_shape[1]`, or `max_sequence_length`), padded with -1 and
    weights with 0, all shapes static, so the replica neither densifies
    (no sparse op under XLA) nor recompiles. The columns come from
    `preprocessor.columns` or `columns`; without either, sparse or ragged
    features are an error there.

    Under `MirroredStrategy` with several replicas, Keras' `model.fit`
    fails on sparse and ragged inputs before its first step, so they are
    made dense here, on the host, with the answer of the sparse ids kept
    (`host_ids.keras_dense_ids`): ids padded with -1 and weights with 0,
    which the layers read as "no id", with one width for the replicas of a
    step. A -1 the sparse ids hold (out of a vocabulary without OOV
    buckets) becomes -2 for the host lookup, which reads -2 as it reads a
    sparse -1 (pruned, or an identity column's default, and counted in a
    sequence's length), where a dense -1 would be padding. The columns
    come from `preprocessor.columns` or `columns`. Under
    `MultiWorkerMirroredStrategy`, where Keras' `fit` does not run, sparse
    ids stay sparse for the custom loop.

    Returns:
        A `tf.distribute.DistributedDataset` for `model.fit`, `evaluate` and
        `predict`. Its `cardinality` is its number of steps (global
        batches) when the input's length is known without reading it
        (`global_steps`: single examples, or a batched dataset whose
        batches have the global size by their static shape, or
        `examples.batch(n)` of known length), so that Keras needs no
        `steps_per_epoch` or `steps` for it; an endless or unknown-length
        input still needs them, and so does a batched dataset of known
        length made otherwise (e.g. a `map` after `batch`, which may change
        the rows of a batch), where Keras warns that the input ran out of
        data at the end of each epoch.

    Raises:
        ValueError: a distributed dataset that fetches to device, a batch
            size that is not a positive multiple of the replica count, a
            function without a batch size, a dataset of single examples
            without one, (with an engine) sparse ids with negative
            values whose weight feature cannot be told, (on a TPU
            without one) sparse or ragged features with no columns known,
            or (under `MirroredStrategy`) sparse or ragged features that
            no known column reads, that a host column and a
            `tpu_tensor_core` column both read, or sequence or
            `default_value` identity features known only by their
            categorical column.

    Example:

    >>> strategy = tf.distribute.get_strategy()
    >>> examples = tf.data.Dataset.from_tensor_slices(
    ...     ({"item": tf.range(10, dtype=tf.int64)}, tf.zeros(10)))
    >>> batches = distribute_dataset(strategy, examples, global_batch_size=4)
    >>> [int(x["item"].shape[0]) for x, _ in batches]
    [4, 4]
    >>> batched = distribute_dataset(strategy, examples.batch(4))
    >>> [x["item"].numpy().tolist() for x, _ in batched]
    [[0, 1, 2, 3], [4, 5, 6, 7]]
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
    batched = global_batch_size is None and isinstance(
        dataset_or_fn, tf.data.Dataset
    )
    if batched:
        global_batch_size = batch_size_of(dataset_or_fn)
    if global_batch_size is None:
        raise ValueError(
            "`global_batch_size` is required with a function of "
            "tf.distribute.InputContext: distribute_dataset batches its "
            "single examples per replica (with drop_remainder=True)."
        )
    _check_global_batch_size(strategy, global_batch_size)
    if batched:
        make_host_dataset = host_slices(dataset_or_fn, global_batch_size)
    elif isinstance(dataset_or_fn, tf.data.Dataset):
        make_host_dataset = sharded_examples(dataset_or_fn, global_batch_size)
    elif callable(dataset_or_fn):
        make_host_dataset = dataset_or_fn
    else:
        raise TypeError(
            "`dataset_or_fn` must be a tf.data.Dataset or a function of "
            "tf.distribute.InputContext. Received: "
            f"{type(dataset_or_fn).__name__}"
        )

    clean_ids = engine_id_filter(strategy, preprocessor)
    dense_ids = keras_dense_ids(strategy, preprocessor, columns)
    batch_size = global_batch_size
    engine_registry.note_dataset_batch(
        strategy, global_batch_size // strategy.num_replicas_in_sync
    )

    def host_pipeline(context: Any) -> Any:
        dataset = make_host_dataset(context)
        per_replica = context.get_per_replica_batch_size(batch_size)
        dataset = dataset.batch(per_replica, drop_remainder=True)
        pad = tensor_core_padding(strategy, preprocessor, columns, per_replica)
        for step in (preprocessor, clean_ids, pad):
            if step is not None:
                dataset = dataset.map(
                    _on_features(step), num_parallel_calls=tf.data.AUTOTUNE
                )
        if dense_ids is not None:
            # One step's per-replica batches together, so that its replicas
            # get one width: Keras averages the first step's over them.
            replicas = pod_shape(context)[2]
            length = dataset.cardinality()
            dataset = (
                dataset.batch(replicas)
                .map(_on_features(dense_ids))
                .unbatch()
                .map(_on_features(_static_batch(per_replica)))
            )
            if tf.get_static_value(length) != tf.data.UNKNOWN_CARDINALITY:
                # The same batches: `unbatch` cannot tell.
                dataset = dataset.apply(
                    tf.data.experimental.assert_cardinality(length)
                )
        return dataset.prefetch(tf.data.AUTOTUNE)

    replicas_per_host: list[int] = []

    def dataset_fn(context: Any) -> Any:
        replicas_per_host.append(pod_shape(context)[2])
        host = _remote_host()
        if host is None:
            return host_pipeline(context)
        # A pod's host that is not this process: the pipeline is built here
        # (where the dataset and the preprocessor's tables are) and sent to
        # the host as its graph, as TF's `experimental_distribute_dataset`
        # sends it. A dataset or a lookup table of this process cannot be
        # reached from another task.
        with tf.device(None):
            dataset = host_pipeline(context)
        return tf_data_distribute.replicate(dataset, [host])[host]

    distributed = strategy.distribute_datasets_from_function(
        dataset_fn,
        options=tf.distribute.InputOptions(experimental_fetch_to_device=False),
    )
    steps = None
    if isinstance(dataset_or_fn, tf.data.Dataset):
        steps = global_steps(dataset_or_fn, batched, global_batch_size)
    _count_steps(distributed, replicas_per_host, steps)
    return distributed


def global_steps(
    dataset: Any, batched: bool, global_batch_size: int
) -> int | None:
    """The number of full global batches of `dataset`, when it is known
    without reading it; else None.

    Single examples of known length `n` make `n // global_batch_size`. A
    batched dataset of known length makes as many when its batches all
    have `global_batch_size` rows by their static shape; or when it is
    `examples.batch(global_batch_size)` (perhaps prefetched or shuffled
    after) of examples of known length, whose short last batch is the one
    dropped. Any other batched dataset may hold short batches anywhere,
    which are dropped too: its count is not known without reading it all.
    """
    length = tf.get_static_value(dataset.cardinality())
    if length is None or length < 0:
        return None  # unknown or infinite
    if not batched:
        return int(length) // global_batch_size
    rows = {spec.shape[0] for spec in tf.nest.flatten(dataset.element_spec)}
    if rows == {global_batch_size}:
        return int(length)
    made = batch_arguments(dataset)
    if made is None:
        return None
    examples, size, _ = made
    count = tf.get_static_value(examples.cardinality())
    if count is None or count < 0:
        return None
    if size == global_batch_size:
        return int(count) // size
    # Fewer examples than one batch: the first batch, short, sets the size.
    return 1 if count == global_batch_size else None


def _count_steps(
    distributed: Any, replicas_per_host: list[int], steps: int | None
) -> None:
    """Makes the distributed dataset's `cardinality` its number of steps.

    Keras takes an epoch's steps from it when `steps_per_epoch` / `steps`
    are not given, and warns that the input ran out of data when it ends
    before them, or when there are none (unknown). `steps` are the input's
    global batches when known (`global_steps`). Else, TF's
    `distribute_datasets_from_function` answers the first host's count of
    per-replica batches (unknown after a `filter`), which that host's
    replicas take in turn, one each per step: Keras expected
    `replicas_per_host` times the steps.
    """
    if not isinstance(distributed, tf.distribute.DistributedDataset):
        return  # The default strategy's plain dataset counts its batches.
    if steps is not None:
        set_distributed_dataset_cardinality(distributed, steps)
        return
    batches = distributed_dataset_cardinality(distributed)
    if batches is None or batches < 0 or not replicas_per_host:
        return  # Infinite or unknown: Keras needs steps_per_epoch then.
    # A last step that only some replicas fill still runs (TF pads it).
    steps = -(-batches // replicas_per_host[0])
    set_distributed_dataset_cardinality(distributed, steps)


def _remote_host() -> str | None:
    """The host whose pipeline `distribute_datasets_from_function` is
    building (its eager device scope), when it is another task than this
    process's; else None."""
    if not tf.executing_eagerly():
        return None
    context = tf_eager_context.context()
    here = tf.DeviceSpec.from_string(context.device_name or "")
    local = tf.DeviceSpec.from_string(context.host_address_space())
    if here.job is None or (here.job, here.replica, here.task) == (
        local.job,
        local.replica,
        local.task,
    ):
        return None
    return str(context.device_name)


def _static_batch(size: int) -> Callable[[Any], Any]:
    """Features with a static batch size (lost in `unbatch`)."""

    def static(features: Any) -> Any:
        def sized(value: Any) -> Any:
            rank = value.shape.rank
            if not isinstance(value, tf.Tensor) or not rank:
                return value
            return tf.ensure_shape(value, [size] + [None] * (rank - 1))

        return tf.nest.map_structure(sized, features)

    return static


def _on_features(preprocessor: Callable[[Any], Any]) -> Callable[..., Any]:
    def apply(*element: Any) -> Any:
        if len(element) == 1:
            return preprocessor(element[0])
        return (preprocessor(element[0]),) + tuple(element[1:])

    return apply
