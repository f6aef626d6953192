"""Each host's share of the global batches, on one host or a pod.

On a pod (`H` hosts, `R` replicas each) replica `r` of host `h` gets slice
`r * H + h` of each global batch: `experimental_distribute_dataset`'s
order, which Keras' `predict` undoes on a multi-host `TPUStrategy`
(`_tpu_multi_host_concat` in `keras/src/backend/tensorflow/trainer.py`), so
predictions come back in input order. What each host reads:

- a dataset of single examples of known length (or infinite): each host
  keeps only its per-replica chunks (`dataset.shard`), but iterates the
  examples before them as `dataset.shard` does (`sharded_examples`);
- a dataset of single examples of unknown length, or a batched dataset:
  every host reads the whole stream, to cut each global batch (and to find
  the last full one) (`host_slices`);
- a function of `tf.distribute.InputContext`: each host reads what the
  function opens (e.g. its own files), and nothing else.
"""

from __future__ import annotations

from typing import Any
from typing import Callable

from keras_tpu_embed._compat import tf


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
        return int(rows_of(tf.nest.flatten(first)[0]))
    raise ValueError("distribute_dataset got an empty batched dataset.")


def rows_of(value: Any) -> Any:
    if isinstance(value, tf.SparseTensor):
        return value.dense_shape[0]
    if isinstance(value, tf.RaggedTensor):
        return value.nrows()
    return tf.shape(value)[0]


def pod_shape(context: Any) -> tuple[int, int, int]:
    """(hosts, this host, replicas per host) of an `InputContext`."""
    hosts, host = context.num_input_pipelines, context.input_pipeline_id
    return hosts, host, max(1, context.num_replicas_in_sync // hosts)


def host_slices(dataset: Any, global_batch_size: int) -> Callable[[Any], Any]:
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
        hosts, host, replicas = pod_shape(context)
        share = global_batch_size // (hosts * replicas)
        starts = [(r * hosts + host) * share for r in range(replicas)]
        full = dataset.filter(
            lambda *batch: tf.equal(
                rows_of(tf.nest.flatten(batch)[0]), global_batch_size
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


def sharded_examples(
    dataset: Any, global_batch_size: int
) -> Callable[[Any], Any]:
    """Each host's share of a dataset of single examples, in the layout of
    `host_slices`, with only full global batches.

    With a known length, the examples of the full global batches are cut
    into per-replica chunks and host `h` keeps chunks `h, H + h, ...`
    (`dataset.shard`; a global batch is `H * R` chunks, so that is slice
    `r * H + h` of every global batch). With an unknown length, every host
    must read the whole stream to know where the last full global batch
    ends: the examples are batched into global batches and sliced.
    """
    cardinality = tf.get_static_value(dataset.cardinality())
    if cardinality is None or cardinality == tf.data.UNKNOWN_CARDINALITY:
        return host_slices(
            dataset.batch(global_batch_size, drop_remainder=True),
            global_batch_size,
        )

    def host_dataset(context: Any) -> Any:
        hosts, host, replicas = pod_shape(context)
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
