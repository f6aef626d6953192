"""Initializing large tables without a second copy in memory.

Measured here: a `[10^7, 64]` float32 table (2.5 GB) initialized with a
truncated normal costs 5.1 GB of resident memory when the initializer runs
in one piece, because its full-size intermediates (the draw, `* stddev`,
`+ mean`) stay in TensorFlow's CPU allocator. Filling the table a block of
rows at a time keeps the overhead to one block. That is sound for the
element-wise Keras distributions: with an integer seed (which Keras gives
every one made without a seed) each block is drawn from its own Philox
counter (`table_rows`), bit for bit the rows of the one-piece draw; with a
`SeedGenerator` seed, or none, each call draws fresh numbers anyway. Every
other initializer runs in one piece.

Everything here runs eagerly, outside any graph being traced: a
`tf.function` made per table is traced once per table and makes TensorFlow
log "triggered tf.function retracing" on every build with a few tables.
Inside Keras' symbolic build of a subclassed model the variable does not
exist yet (Keras creates it later, outside the trace), so the table is then
initialized in one piece by Keras itself; the block fill needs a real
variable to write into.

On a TPU pod the engine's tables are created by TensorFlow's sharded
variable creator, which calls the initializer once per host with that host's
rows (`EngineInitializer`, `table_rows`).
"""

from __future__ import annotations

import os
from typing import Any

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import keras_in_stateless_scope
from keras_tpu_embed._compat import keras_random_seed
from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import InitializerLike
from keras_tpu_embed.types import KerasConfig
from keras_tpu_embed.types import Tensor

BLOCK_BYTES = 4 * 2**20
"""Size of one block of rows filled at a time. TensorFlow's CPU allocator
(with oneDNN on, the x86 default, a pool that never returns memory to the
system) keeps the freed blocks but cannot put a later table in them: W2's
tables and slots (1,001 MiB) took 1,275 MiB of resident memory to build
with 64 MiB blocks, 1,087 MiB with 4 MiB blocks; a [10^6, 64] table took
as long to fill either way (1.5-1.8 s on a loaded 2-core host)."""

_ELEMENTWISE_RANDOM = (
    keras.initializers.TruncatedNormal,
    keras.initializers.RandomNormal,
    keras.initializers.RandomUniform,
)
_ELEMENTWISE_CONSTANT = (
    keras.initializers.Constant,
    keras.initializers.Ones,
)


def fills_by_blocks(
    initializer: InitializerLike, dtype: Any = tf.float32
) -> bool:
    """Whether `initializer` may be applied one block of rows at a time.

    True for constants, unseeded element-wise draws, and element-wise draws
    with an integer seed in float32 (`_stateless_rows` reproduces their
    rows); an integer seed in another dtype would draw the same numbers
    for every block.
    """
    if type(initializer) in _ELEMENTWISE_CONSTANT:
        return True
    return (
        type(initializer) in _ELEMENTWISE_RANDOM
        and getattr(initializer, "seed", None) is None
    ) or _draws_statelessly(initializer, tf.as_dtype(dtype))


def available_memory_bytes() -> int | None:
    """The host's available memory (Linux `MemAvailable`), if known."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def check_fits_in_memory(name: str, shape: tuple[int, int]) -> None:
    """Refuses, before allocating, a float32 table larger than the memory.

    Without it, `hash_bucket_size=2**40` ran out of memory after a long
    allocation and `num_buckets=2**63` overflowed an integer, naming no
    table. The host's memory is the bound for tables the layer holds; it
    is checked per variable (a slot is as large as its table).

    Raises:
        ValueError: naming the table, its rows, the bytes it needs and the
            bytes available.
    """
    rows, dimension = shape
    needed = rows * dimension * 4
    available = available_memory_bytes()
    if rows >= 2**63 or (available is not None and needed > available):
        raise ValueError(
            f"Table '{name}' has {rows} rows of dimension {dimension}: it "
            f"needs {needed} bytes (float32), but {available} bytes are "
            "available on this host. Lower the column's hash_bucket_size / "
            "num_buckets / vocabulary, or its dimension."
        )


def create_table(
    layer: keras.layers.Layer,
    name: str,
    shape: tuple[int, int],
    initializer: InitializerLike,
) -> Any:
    """`layer.add_weight` for a non-trainable float32 table, filled cheaply.

    Element-wise initializers fill the table by blocks after it is created
    with zeros; any other initializer runs in one piece. A table larger
    than the host's available memory is refused first
    (`check_fits_in_memory`).
    """
    check_fits_in_memory(name, shape)
    by_blocks = (
        fills_by_blocks(initializer)
        and not _is_zero(initializer)
        # In Keras' symbolic build the variable is only created after the
        # trace, by Keras, from the initializer it is given.
        and not keras_in_stateless_scope()
        # A layer first built inside a `tf.function` trace: Keras hands back
        # a variable whose buffer is not there yet ("params.shape [0]" at
        # the first scatter), so it takes its initializer in one piece.
        and tf.executing_eagerly()
    )
    variable = layer.add_weight(
        name=name,
        shape=shape,
        initializer=keras.initializers.Zeros() if by_blocks else initializer,
        dtype="float32",
        trainable=False,
        autocast=False,
    )
    if by_blocks:
        fill_by_blocks(variable, initializer)
    return variable


def _is_zero(initializer: InitializerLike) -> bool:
    return type(initializer) is keras.initializers.Zeros or (
        type(initializer) is keras.initializers.Constant
        and getattr(initializer, "value", None) == 0
    )


def fill_by_blocks(variable: Any, initializer: InitializerLike) -> None:
    """Overwrites a rank-2 `variable` block by block with `initializer`."""
    with tf.init_scope():
        target = variable.value if hasattr(variable, "value") else variable
        rows, dim = (int(d) for d in target.shape)
        block = max(1, BLOCK_BYTES // (max(dim, 1) * target.dtype.size))
        stateless = _draws_statelessly(initializer, target.dtype)
        for start in range(0, rows, block):
            size = min(block, rows - start)
            if stateless:
                # Its rows of the one-piece draw: a seeded initializer
                # called per block would repeat its first block.
                values = _stateless_rows(
                    initializer, dim, start, size, target.dtype
                )
            else:
                values = initializer((size, dim), dtype=target.dtype.name)
            # A scatter writes in place; a sliced assign copied the table.
            target.scatter_update(
                tf.IndexedSlices(values, tf.range(start, start + size))
            )


class EngineInitializer(keras.initializers.Initializer):  # type: ignore[misc]
    """A table's initializer as the TPU engine's `TableConfig` receives it.

    On a pod TensorFlow's mid-level API creates each table under
    `make_sharded_variable_creator` (`tpu_embedding_v2.py`): one shard of
    rows per host, contiguous, the first `vocabulary % hosts` hosts one row
    more. It calls an initializer whose signature has `shard_info` once per
    host as `initializer(full_shape, dtype=..., shard_info=ShardInfo(
    shape=(rows, dim), offset=(first_row, 0)))`; any other initializer is
    called with the shard's shape alone, so a Keras initializer (whose
    values depend on the shape and its seed only) gave every host the same
    rows. This one answers each shard with its rows of the table that
    `initializer(full_shape)` makes on one device (`table_rows`), so an
    engine table on a pod starts where the same column's table on CPU does,
    bit for bit.

    Args:
        initializer: The table's initializer (a callable taking `shape` and
            `dtype`).

    Example:

    >>> from types import SimpleNamespace
    >>> init = EngineInitializer(keras.initializers.RandomNormal(seed=1))
    >>> whole = init((5, 2), dtype="float32")
    >>> shard = SimpleNamespace(shape=(2, 2), offset=(3, 0))
    >>> rows = init((5, 2), dtype="float32", shard_info=shard)
    >>> bool(tf.reduce_all(rows == whole[3:]))
    True
    """

    def __init__(self, initializer: InitializerLike) -> None:
        self.initializer = initializer

    def __call__(
        self, shape: Any, dtype: Any = None, shard_info: Any = None
    ) -> Tensor:
        if shard_info is None:
            return self.initializer(shape, dtype=dtype)
        full = tuple(int(d) for d in shape)
        if len(full) != 2 or tuple(int(d) for d in shard_info.offset)[1:] != (
            0,
        ):
            raise ValueError(
                f"EngineInitializer shards tables by rows, but was asked for "
                f"the shard at offset {tuple(shard_info.offset)} of a table "
                f"of shape {full}. Only row shards of rank-2 tables (offset "
                "(row, 0)), as tf.tpu.experimental.embedding makes them, "
                "are supported."
            )
        return table_rows(
            self.initializer,
            full,
            int(shard_info.offset[0]),
            int(shard_info.shape[0]),
            dtype,
        )

    def get_config(self) -> dict[str, Any]:
        return {
            "initializer": keras.saving.serialize_keras_object(self.initializer)
        }

    @classmethod
    def from_config(cls, config: KerasConfig) -> EngineInitializer:
        return cls(keras.saving.deserialize_keras_object(config["initializer"]))


def table_rows(
    initializer: InitializerLike,
    shape: tuple[int, int],
    start: int,
    count: int,
    dtype: Any = None,
) -> Tensor:
    """Rows `[start, start + count)` of `initializer(shape, dtype)`.

    Made without the whole table where the initializer allows:

    - an initializer with a `table_rows(shape, start, count, dtype)`
      method (`tables.CheckpointInitializer` reads only those rows);
    - `Zeros`, `Ones`, `Constant` (a scalar): the same at every row;
    - `TruncatedNormal`, `RandomNormal`, `RandomUniform` with an integer
      seed (Keras gives an unseeded one a random integer seed at
      construction), in float32: TensorFlow's stateless Philox kernels
      draw each group of 4 elements from the counter `group * skip`, so
      the rows are drawn from their own counter (`_stateless_rows`).

    Any other initializer (e.g. `GlorotUniform`, whose scale depends on
    the whole shape) makes the whole table on each host, which is then
    sliced. One that draws a new table per call (a `SeedGenerator` seed, an
    unseeded `tf.random` or TF1 initializer) has no one table to agree
    with: its hosts' rows then come from different draws, so they do not
    repeat, but no two calls give the same table on any device.
    """
    dtype = tf.as_dtype(dtype or keras.config.floatx())
    rows_of = getattr(initializer, "table_rows", None)
    if rows_of is not None:
        return rows_of(shape, start, count, dtype)
    dimension = shape[1]
    if _row_independent(initializer):
        return initializer((count, dimension), dtype=dtype)
    if _draws_statelessly(initializer, dtype):
        return _stateless_rows(initializer, dimension, start, count, dtype)
    return initializer(shape, dtype=dtype)[start : start + count]


def _row_independent(initializer: InitializerLike) -> bool:
    if type(initializer) in _ELEMENTWISE_CONSTANT + (keras.initializers.Zeros,):
        value = getattr(initializer, "value", 0.0)
        return bool(tf.rank(value) == 0)
    return False


def _draws_statelessly(initializer: InitializerLike, dtype: Any) -> bool:
    return (
        type(initializer) in _ELEMENTWISE_RANDOM
        and type(getattr(initializer, "seed", None)) is int
        and dtype == tf.float32
    )


# Philox counter steps per group of 4 float32 outputs, per raw kernel: one
# for uniform and normal; the truncated normal reserves 256 (its rejection
# sampler may use that many draws per group).
_RAW_KERNELS = {
    keras.initializers.TruncatedNormal: (
        tf.raw_ops.StatelessTruncatedNormalV2,
        256,
    ),
    keras.initializers.RandomNormal: (tf.raw_ops.StatelessRandomNormalV2, 1),
    keras.initializers.RandomUniform: (
        tf.raw_ops.StatelessRandomUniformV2,
        1,
    ),
}
_GROUP = 4


def _stateless_rows(
    # One of `_RAW_KERNELS`' Keras initializers (`_draws_statelessly`).
    initializer: keras.initializers.Initializer,
    dimension: int,
    start: int,
    count: int,
    dtype: Any,
) -> Tensor:
    """The rows Keras' stateless draw of the whole table has there.

    Keras' TF backend draws `tf.random.stateless_*(shape, seed)` with the
    auto-selected algorithm (Philox on the CPU hosts that initialize engine
    tables). The value at flat index `i` depends on the seed and `i` only:
    group `i // 4` comes from the counter advanced by `group * skip`. So
    these rows are the draw of `count * dimension` (plus the leading part
    of the first group) from the advanced counter, scaled as TF scales it.
    """
    kernel, skip = _RAW_KERNELS[type(initializer)]
    first = start * dimension
    group = first // _GROUP
    lead = first - group * _GROUP
    key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(
        seed=keras_random_seed(initializer.seed)
    )
    counter = _advance(counter, group * skip)
    raw = kernel(
        shape=[lead + count * dimension],
        key=key,
        counter=counter,
        alg=3,  # AUTO_SELECT, as tf.random.stateless_* passes it
        dtype=dtype,
    )
    raw = tf.reshape(raw[lead:], [count, dimension])
    if type(initializer) is keras.initializers.RandomUniform:
        low = tf.cast(initializer.minval, dtype)
        high = tf.cast(initializer.maxval, dtype)
        return raw * (high - low) + low
    stddev = tf.constant(initializer.stddev, dtype)
    mean = tf.constant(initializer.mean, dtype)
    return raw * stddev + mean


def _advance(counter: Tensor, steps: int) -> Tensor:
    """A 128-bit Philox counter (`[2]` uint64, low word first) + `steps`."""
    low = counter[0] + tf.constant(steps, tf.uint64)
    carry = tf.cast(low < counter[0], tf.uint64)
    return tf.stack([low, counter[1] + carry])
