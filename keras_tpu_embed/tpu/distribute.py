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

On a pod (`H` hosts, `R` replicas each) replica `r` of host `h` gets slice
`r * H + h` of each global batch: `experimental_distribute_dataset`'s
order, which Keras' `predict` undoes on a multi-host `TPUStrategy`
(`_tpu_multi_host_concat` in `keras/src/backend/tensorflow/trainer.py`), so
predictions come back in input order. What each host reads:

- a dataset of single examples of known length (or infinite): each host
  keeps only its per-replica chunks (`dataset.shard`), but iterates the
  examples before them as `dataset.shard` does;
- a dataset of single examples of unknown length, or a batched dataset:
  every host reads the whole stream, to cut each global batch (and to find
  the last full one);
- a function of `tf.distribute.InputContext`: each host reads what the
  function opens (e.g. its own files), and nothing else.

On a TPU with an embedding engine, negative ids are also dealt with here, on
the host: the engine has no rule for them (the host lookups skip them), and
nothing can be computed between the dataset and TF's enqueue, which only
takes direct inputs of the step (`tpu_embedding_v2.py`,
`TPUEmbedding._raise_error_for_non_direct_inputs`). Sparse and ragged ids
lose their negative values (and the matching weights), as the host lookups
skip them; dense engine ids have no padding to drop to, so a negative one is
an error naming the feature.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_data_distribute
from keras_tpu_embed._compat import tf_eager_context
from keras_tpu_embed.columns import to_embedding_column
from keras_tpu_embed.lookup import engine_registry
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    tensor_core_widths,
)
from keras_tpu_embed.preprocessing.ids import PADDING_ID
from keras_tpu_embed.preprocessing.ids import densify
from keras_tpu_embed.tpu import hardware as tpu_hardware

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
    columns: Sequence[Any] | None = None,
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
    tensor-core lookup (`lookup/dense_xla.py`), and each core holds every
    table in full: that is what the tensor-core path is, not something
    input can change. Its ids are made dense here, on the host:
    `[per_replica_batch, width]` with the column's width
    (`tensor_core_shape[1]`, or `max_sequence_length`), padded with -1 and
    weights with 0, all shapes static, so the replica neither densifies
    (no sparse op under XLA) nor recompiles. The columns come from
    `preprocessor.columns` or `columns`; without either, sparse or ragged
    features are an error there.

    Returns:
        A `tf.distribute.DistributedDataset` for `model.fit`, `evaluate` and
        `predict`. Its `cardinality` is its number of steps (global
        batches) when the input's length is known, so that Keras needs no
        `steps_per_epoch` or `steps` for it; an endless or unknown-length
        input still needs them.

    Raises:
        ValueError: a distributed dataset that fetches to device, a batch
            size that is not a positive multiple of the replica count, a
            function without a batch size, a dataset of single examples
            without one, (with an engine) sparse ids with negative
            values whose weight feature cannot be told, or (on a TPU
            without one) sparse or ragged features with no columns known.

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
        make_host_dataset = _host_slices(dataset_or_fn, global_batch_size)
    elif isinstance(dataset_or_fn, tf.data.Dataset):
        make_host_dataset = _sharded(dataset_or_fn, global_batch_size)
    elif callable(dataset_or_fn):
        make_host_dataset = dataset_or_fn
    else:
        raise TypeError(
            "`dataset_or_fn` must be a tf.data.Dataset or a function of "
            "tf.distribute.InputContext. Received: "
            f"{type(dataset_or_fn).__name__}"
        )

    clean_ids = _engine_id_filter(strategy, preprocessor)
    batch_size = global_batch_size
    engine_registry.note_dataset_batch(
        strategy, global_batch_size // strategy.num_replicas_in_sync
    )

    def host_pipeline(context: Any) -> Any:
        dataset = make_host_dataset(context)
        per_replica = context.get_per_replica_batch_size(batch_size)
        dataset = dataset.batch(per_replica, drop_remainder=True)
        pad = _tensor_core_padding(strategy, preprocessor, columns, per_replica)
        for step in (preprocessor, clean_ids, pad):
            if step is not None:
                dataset = dataset.map(
                    _on_features(step), num_parallel_calls=tf.data.AUTOTUNE
                )
        return dataset.prefetch(tf.data.AUTOTUNE)

    replicas_per_host: list[int] = []

    def dataset_fn(context: Any) -> Any:
        replicas_per_host.append(_pod_shape(context)[2])
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
    _count_steps(distributed, replicas_per_host)
    return distributed


def _count_steps(distributed: Any, replicas_per_host: list[int]) -> None:
    """Makes the distributed dataset's `cardinality` its number of steps.

    Keras takes an epoch's steps from it when `steps_per_epoch` / `steps`
    are not given. TF's `distribute_datasets_from_function` answers the
    first host's count of per-replica batches, which that host's replicas
    take in turn, one each per step: Keras expected `replicas_per_host`
    times the steps and warned that the input ran out.
    """
    if not isinstance(distributed, tf.distribute.DistributedDataset):
        return  # The default strategy's plain dataset counts its batches.
    batches = getattr(distributed, "_cardinality", None)
    if batches is None or batches < 0 or not replicas_per_host:
        return  # Infinite or unknown: Keras needs steps_per_epoch then.
    # A last step that only some replicas fill still runs (TF pads it).
    distributed._cardinality = -(-int(batches) // replicas_per_host[0])


def batch_size_of(dataset: Any) -> int:
    """The size of a batched dataset's batches: static, else its first.

    Raises:
        ValueError: the dataset has a scalar component (it holds single
            examples: pass `global_batch_size`), or it is empty.
    """
    specs = tf.nest.flatten(dataset.element_spec)
    scalars = [spec for spec in specs if spec.shape.rank == 0]
    if scalars:
        raise ValueError(
            "distribute_dataset got a tf.data.Dataset without "
            "`global_batch_size`, so it takes it as batched, but its elements "
            f"have scalar components ({scalars[0]}): it holds single "
            "examples. Pass global_batch_size=..., or batch it with "
            "dataset.batch(global_batch_size) first."
        )
    static = {int(s.shape[0]) for s in specs if s.shape[0] is not None}
    if len(static) == 1:
        return static.pop()
    for first in dataset.take(1):
        return int(_rows(tf.nest.flatten(first)[0]))
    raise ValueError("distribute_dataset got an empty batched dataset.")


def _rows(value: Any) -> Any:
    if isinstance(value, tf.SparseTensor):
        return value.dense_shape[0]
    if isinstance(value, tf.RaggedTensor):
        return value.nrows()
    return tf.shape(value)[0]


def _pod_shape(context: Any) -> tuple[int, int, int]:
    """(hosts, this host, replicas per host) of an `InputContext`."""
    hosts, host = context.num_input_pipelines, context.input_pipeline_id
    return hosts, host, max(1, context.num_replicas_in_sync // hosts)


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


def _host_slices(dataset: Any, global_batch_size: int) -> Callable[[Any], Any]:
    """Each host's slices of every full global batch, as single examples.

    Replica `r` of host `h` (of `H` hosts with `R` replicas each) gets
    slice `r * H + h` of each global batch (`global_batch_size / (H * R)`
    examples): the order `experimental_distribute_dataset` gives a
    `TPUStrategy`, which Keras undoes to put `predict`'s outputs back in
    input order (`_tpu_multi_host_concat` in
    `keras/src/backend/tensorflow/trainer.py`). A host's replicas take its
    per-replica batches in turn, so host `h` yields slices `h, H + h, ...,
    (R - 1) * H + h` of each global batch, in that order.

    A batch of another size (the short last one) is dropped: a step needs
    the same global batch everywhere, and static shapes on a TPU. Each
    host reads every batch and keeps its own slices, so the data is
    sharded once, here (`distribute_datasets_from_function` shards none).
    """

    def host_dataset(context: Any) -> Any:
        hosts, host, replicas = _pod_shape(context)
        share = global_batch_size // (hosts * replicas)
        starts = [(r * hosts + host) * share for r in range(replicas)]
        full = dataset.filter(
            lambda *batch: tf.equal(
                _rows(tf.nest.flatten(batch)[0]), global_batch_size
            )
        )
        if hosts > 1:
            full = full.map(lambda *batch: _sliced(batch, starts, share))
        return full.unbatch()

    return host_dataset


def _sliced(batch: tuple[Any, ...], starts: list[int], size: int) -> Any:
    """The rows `[start, start + size)` of `batch`, for each start, in
    order."""

    def cut(value: Any) -> Any:
        if isinstance(value, tf.SparseTensor):
            shape = tf.unstack(value.dense_shape)
            parts = [
                tf.sparse.slice(
                    value,
                    [start] + [0] * (len(shape) - 1),
                    [size] + shape[1:],
                )
                for start in starts
            ]
            return parts[0] if len(parts) == 1 else tf.sparse.concat(0, parts)
        parts = [value[start : start + size] for start in starts]
        return parts[0] if len(parts) == 1 else tf.concat(parts, 0)

    sliced = tf.nest.map_structure(cut, batch)
    return sliced[0] if len(sliced) == 1 else sliced


def _sharded(dataset: Any, global_batch_size: int) -> Callable[[Any], Any]:
    """Each host's share of a dataset of single examples, in the layout of
    `_host_slices`, with only full global batches.

    With a known length, the examples of the full global batches are cut
    into per-replica chunks and host `h` keeps chunks `h, H + h, ...`
    (`dataset.shard`; a global batch is `H * R` chunks, so that is slice
    `r * H + h` of every global batch). With an unknown length, every host
    must read the whole stream to know where the last full global batch
    ends: the examples are batched into global batches and sliced.
    """
    cardinality = tf.get_static_value(dataset.cardinality())
    if cardinality is None or cardinality == tf.data.UNKNOWN_CARDINALITY:
        return _host_slices(
            dataset.batch(global_batch_size, drop_remainder=True),
            global_batch_size,
        )

    def host_dataset(context: Any) -> Any:
        hosts, host, replicas = _pod_shape(context)
        share = global_batch_size // (hosts * replicas)
        examples = dataset
        if cardinality != tf.data.INFINITE_CARDINALITY:
            full = int(cardinality) // global_batch_size * global_batch_size
            examples = examples.take(full)
        if hosts == 1:
            return examples
        chunks = examples.batch(share, drop_remainder=True)
        return chunks.shard(hosts, host).unbatch()

    return host_dataset


def _on_features(preprocessor: Callable[[Any], Any]) -> Callable[..., Any]:
    def apply(*element: Any) -> Any:
        if len(element) == 1:
            return preprocessor(element[0])
        return (preprocessor(element[0]),) + tuple(element[1:])

    return apply


def _engine_id_filter(
    strategy: Any, preprocessor: Any
) -> Callable[[Any], Any] | None:
    """The host-side clean-up of negative ids, on engine hardware only."""
    if not tpu_hardware.embedding_hardware(strategy).has_engine:
        return None
    weight_of: dict[str, str | None] = {}
    for column in getattr(preprocessor, "categorical_columns", None) or []:
        weight_of[column.feature_key] = column.weight_feature_key or None
    engine = engine_registry.registered_engine(strategy)
    dense_engine_keys: set[str] = set()
    if engine is not None:
        weight_of.update(engine.input_features)
        dense_engine_keys = set(engine.input_features)
    known = engine is not None or bool(weight_of)

    def clean(features: Any) -> Any:
        if not isinstance(features, dict):
            return features
        return drop_negative_ids(
            features, weight_of, dense_engine_keys, pairing_known=known
        )

    return clean


def _tensor_core_padding(
    strategy: Any,
    preprocessor: Any,
    columns: Sequence[Any] | None,
    per_replica: int,
) -> Callable[[Any], Any] | None:
    """On a TPU without an engine: tensor-core ids dense and static."""
    hardware = tpu_hardware.embedding_hardware(strategy)
    if hardware is not tpu_hardware.EmbeddingHardware.NO_ENGINE:
        return None
    known = list(columns or []) + list(
        getattr(preprocessor, "columns", None) or []
    )
    widths = tensor_core_widths(known, engine_falls_back=True)
    weight_of: dict[str, str] = {}
    for column in known:
        try:
            column = to_embedding_column(column)
        except TypeError:
            continue
        if column.feature_key in widths and column.weight_feature_key:
            weight_of[column.feature_key] = column.weight_feature_key

    def padded(value: Any, width: int, pad: Any) -> Any:
        # The same densify the replica would run (`DenseTableLookup`), with
        # the batch size it cannot see made static.
        return tf.ensure_shape(densify(value, width, pad), [per_replica, width])

    def pad(features: Any) -> Any:
        if not isinstance(features, dict):
            return features
        if not widths:
            unknown = sorted(
                key
                for key, value in features.items()
                if isinstance(value, (tf.SparseTensor, tf.RaggedTensor))
            )
            if unknown:
                raise ValueError(
                    "This TPU has no embedding engine, so its lookups run "
                    "on the tensor core, which needs dense ids of static "
                    f"shape; the features {unknown} are sparse or ragged, "
                    "and distribute_dataset knows no columns to pad them "
                    "to. Pass preprocessor=kte.FeaturePreprocessor(columns) "
                    "or columns=[...] (the model's embedding columns)."
                )
            return features
        out = dict(features)
        for key, width in widths.items():
            if key in features:
                out[key] = padded(features[key], width, PADDING_ID)
            weights_key = weight_of.get(key)
            if weights_key and weights_key in features:
                out[weights_key] = padded(features[weights_key], width, 0.0)
        return out

    return pad


def drop_negative_ids(
    features: dict[str, Any],
    weight_of: dict[str, str | None],
    dense_keys: set[str],
    pairing_known: bool = True,
) -> dict[str, Any]:
    """Drops negative sparse/ragged ids; checks dense ones. Host side.

    Args:
        features: A batch of features keyed by input key.
        weight_of: Ids key -> the key of its weights (or None).
        dense_keys: Dense features that must not hold negative ids.
        pairing_known: Whether `weight_of` lists every weighted feature;
            when not, float sparse/ragged features that no ids key claims
            are an error, since their ids cannot be told.

    Returns:
        The features with negative ids (and their weights) removed.

    Raises:
        ValueError: unclaimed float sparse/ragged features, with
            `pairing_known=False`.
    """
    weight_keys = {w for w in weight_of.values() if w}
    if not pairing_known:
        orphans = sorted(
            key
            for key, value in features.items()
            if isinstance(value, (tf.SparseTensor, tf.RaggedTensor))
            and value.dtype.is_floating
            and key not in weight_keys
        )
        if orphans:
            raise ValueError(
                f"The features {orphans} look like weights, but "
                "distribute_dataset cannot tell their ids, so it cannot drop "
                "negative ids together with their weights before the TPU "
                "embedding engine. Pass preprocessor=kte.FeaturePreprocessor"
                "(columns), or build the model under strategy.scope() before "
                "calling distribute_dataset."
            )
    cleaned = dict(features)
    for key, value in features.items():
        if key in weight_keys or not value.dtype.is_integer:
            continue
        weights_key = weight_of.get(key) or ""
        weights = features.get(weights_key)
        if isinstance(value, tf.SparseTensor):
            keep = value.values >= 0
            cleaned[key] = tf.sparse.retain(value, keep)
            if weights is not None:
                cleaned[weights_key] = tf.sparse.retain(weights, keep)
        elif isinstance(value, tf.RaggedTensor):
            keep = value >= 0
            cleaned[key] = tf.ragged.boolean_mask(value, keep)
            if weights is not None:
                cleaned[weights_key] = tf.ragged.boolean_mask(weights, keep)
        elif key in dense_keys:
            check = tf.debugging.assert_non_negative(
                value,
                message=(
                    f"Feature '{key}' has negative ids, which the TPU "
                    "embedding engine cannot skip in dense ids (the host "
                    "lookups treat -1 as padding). Feed it as a "
                    "tf.SparseTensor or tf.RaggedTensor without the "
                    "padding, or give its vocabulary column num_oov_buckets "
                    "or default_value"
                ),
            )
            with tf.control_dependencies([check]):
                cleaned[key] = tf.identity(value)
    return cleaned
