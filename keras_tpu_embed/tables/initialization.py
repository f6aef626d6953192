"""Initializing tables one block of rows at a time, whole or per shard.

Measured here: a `[10^7, 64]` float32 table (2.5 GB) initialized with a
truncated normal costs 5.1 GB of resident memory when the initializer runs
in one piece, because its full-size intermediates (the draw, `* stddev`,
`+ mean`) stay in TensorFlow's CPU allocator. Making the table a block of
rows at a time keeps the overhead to one block.

On a TPU pod TensorFlow's mid-level API creates each engine table under
`make_sharded_variable_creator` (`tpu_embedding_v2.py`) and calls its
initializer once per host for that host's rows (`EngineInitializer`). Those
rows are made alone (`table_rows`), a block at a time into the shard's
buffer, so a host holds its shard and one block, never the table. The rows
can be made alone for:

- constants: Keras' `Zeros`, `Ones` and `Constant`, of a scalar or of an
  array such as a pretrained matrix (broadcast to the table, as Keras
  does), and TF's `tf.constant_initializer` (reshaped to the table, as
  TensorFlow does), `tf.zeros_initializer`, `tf.ones_initializer`;
- Keras' `Identity`: row `i` is the `i`-th unit vector times the gain;
- the random draws: Keras' `RandomNormal`, `RandomUniform`,
  `TruncatedNormal` and the `VarianceScaling` family (`GlorotUniform`,
  `HeNormal`, `LecunUniform`, ...; the scale is computed from the whole
  table's shape), TF's `tf.random_normal_initializer` and
  `tf.random_uniform_initializer`. TensorFlow's stateless Philox kernels
  draw each group of 4 values from its own counter, so a block is drawn
  from its own counter (`_Draw`). With an integer seed (Keras gives one to
  every initializer made without a seed) the rows are, bit for bit, those
  of the whole table drawn in one piece on one device. With a
  `keras.random.SeedGenerator` seed, or TF's unseeded initializers, every
  call draws a new table, on one device as well: each call draws its seed
  once (the whole table, or each host's shard, is then one draw), so on a
  pod each host's rows are correctly scaled fresh numbers, and there is no
  one-device table for them to equal (two one-device builds differ too).

An initializer may also answer for its rows itself with a method
`table_rows(shape, start, count, dtype)` (`tables.CheckpointInitializer`
reads only those rows of a checkpoint). Any other initializer (Keras'
`Orthogonal`, whose rows depend on each other through a QR factorization;
a function, lambda, `functools.partial` or object with `__call__`, which
may compute anything from the shape) is called for the whole table, of
which each host keeps its rows. That costs each host the whole table, so
for a sharded table larger than `WHOLE_TABLE_LIMIT_BYTES` it is refused.

The same ops are built eagerly and inside a trace, with no Python decision
on a tensor's value: TensorFlow creates the engine's tables inside the
first step's trace (Keras' train function), and SparseCore initializes
them in a `tf.function` of its own (`tpu_embedding_v3.py`,
`_batch_initialize_tables_fn`). The tables a layer holds itself are filled
eagerly (`create_table`): a `tf.function` made per table is traced once
per table and makes TensorFlow log "triggered tf.function retracing" on
every build with a few tables. Inside Keras' symbolic build of a
subclassed model the variable does not exist yet (Keras creates it later,
outside the trace), so the table is then initialized in one piece by Keras
itself; the block fill needs a real variable to write into.
"""

from __future__ import annotations

import abc
import math
import os
from typing import Any
from typing import Callable
from typing import Sequence
from typing import TypeVar

import numpy as np

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import keras_compute_fans
from keras_tpu_embed._compat import keras_in_stateless_scope
from keras_tpu_embed._compat import keras_random_seed
from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns.embedding import describe
from keras_tpu_embed.parameter_server.sharded_tables import create_sharded_table
from keras_tpu_embed.parameter_server.sharded_tables import on_parameter_servers
from keras_tpu_embed.types import InitializerLike
from keras_tpu_embed.types import KerasConfig
from keras_tpu_embed.types import Tensor

BLOCK_BYTES = 4 * 2**20
"""Size of one block of rows made at a time. TensorFlow's CPU allocator
(with oneDNN on, the x86 default, a pool that never returns memory to the
system) keeps the freed blocks but cannot put a later table in them: W2's
tables and slots (1,001 MiB) took 1,275 MiB of resident memory to build
with 64 MiB blocks, 1,087 MiB with 4 MiB blocks; a [10^6, 64] table took
as long to fill either way (1.5-1.8 s on a loaded 2-core host)."""

WHOLE_TABLE_LIMIT_BYTES = 256 * 2**20
"""The largest sharded table (a float32 `[2^20, 64]`) whose initializer may
be called for the whole table on every host (`EngineInitializer`). Such an
initializer (`Orthogonal`, or any callable other than the kinds listed in
this module's docstring) costs each host the whole table and the
initializer's intermediates besides its own shard; above this size it is
refused when the table is created, naming the table."""

_TableShape = tuple[int, int]
_Function = TypeVar("_Function", bound=Callable[..., Any])


def _plain_ops(function: _Function) -> _Function:
    """Has AutoGraph call `function` as it is, not converted: it builds
    plain ops and decides nothing on a tensor's value, and converting it
    (SparseCore's initializer `tf.function` has AutoGraph on) made a trace
    of five row ranges take 8.7 s instead of 1.6 s (a loaded 2-core
    host)."""
    plain: _Function = tf.autograph.experimental.do_not_convert(function)
    return plain


@_plain_ops
def table_rows(
    initializer: InitializerLike,
    shape: Sequence[int],
    start: int,
    count: int,
    dtype: Any = None,
) -> Tensor:
    """Rows `[start, start + count)` of `initializer(shape, dtype)`.

    Made without the rest of the table where the initializer allows (see
    the module's docstring), a block of rows at a time into one buffer of
    `count` rows; any other initializer is called for the whole table, of
    which a copy of the rows is kept, so that the whole table is freed.
    Builds the same ops eagerly and inside a trace.

    Args:
        initializer: The table's initializer.
        shape: The whole table's shape, `(rows, dimension)`.
        start: The first row.
        count: How many rows.
        dtype: The table's dtype (default: Keras' `floatx`).

    Returns:
        A `[count, dimension]` tensor.

    Raises:
        ValueError: rows outside the table, or an initializer whose
            values do not have the table's shape.

    Example:

    >>> glorot = keras.initializers.GlorotUniform(seed=1)
    >>> rows = table_rows(glorot, (1000, 8), 600, 2)
    >>> bool(tf.reduce_all(rows == glorot((1000, 8))[600:602]))
    True
    """
    dtype = tf.as_dtype(dtype or keras.config.floatx())
    full = _rank_2(shape, initializer)
    if not (0 <= start and 0 <= count and start + count <= full[0]):
        raise ValueError(
            f"Rows [{start}, {start + count}) are not rows of a table of "
            f"shape {full}: ask for 0 <= start and start + count <= "
            f"{full[0]}."
        )
    rows_of = getattr(initializer, "table_rows", None)
    if callable(rows_of):
        return rows_of(full, start, count, dtype)
    make_rows = _row_maker(initializer, dtype)
    if make_rows is None:
        return _rows_of_whole_table(initializer, full, start, count, dtype)
    return _in_blocks(make_rows(full), start, count, full[1], dtype)


def row_local(initializer: InitializerLike, dtype: Any = tf.float32) -> bool:
    """Whether `initializer`'s rows can be made without the whole table.

    True for the kinds the module's docstring lists, in any dtype for
    constants and `Identity` and in float32 for the random draws (the
    per-block counters are those of float32 draws; tables are float32).
    An initializer with its own `table_rows` method answers for itself
    (`table_rows` uses it) but is not filled by blocks here.
    """
    return _row_maker(initializer, tf.as_dtype(dtype)) is not None


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

    A table whose rows can be made alone (`row_local`) is created with
    zeros and filled by blocks; any other initializer runs in one piece. A
    table larger than the host's available memory is refused first
    (`check_fits_in_memory`).
    """
    if on_parameter_servers():
        # Each shard made on its server; no host holds the whole table.
        rows_of = EngineInitializer(initializer, table=name)
        return create_sharded_table(layer, name, shape, rows_of)
    check_fits_in_memory(name, shape)
    zero = _is_zero(initializer)
    by_blocks = (
        row_local(initializer)
        and not zero
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
        # Keras' `Constant(0.0)` is `0.0 * ones(shape)`: two tables.
        initializer=(
            keras.initializers.Zeros() if by_blocks or zero else initializer
        ),
        dtype="float32",
        trainable=False,
        autocast=False,
    )
    if by_blocks:
        fill_by_blocks(variable, initializer)
    return variable


def fill_by_blocks(variable: Any, initializer: InitializerLike) -> None:
    """Overwrites a rank-2 `variable` block by block with `initializer`.

    Raises:
        ValueError: if the initializer's rows cannot be made alone
            (`row_local`): create the variable with it instead.
    """
    with tf.init_scope():
        target = variable.value if hasattr(variable, "value") else variable
        rows, dim = (int(d) for d in target.shape)
        make_rows = _row_maker(initializer, target.dtype)
        if make_rows is None:
            raise ValueError(
                f"The initializer {describe(initializer)} makes its table "
                "as a whole, not by rows; create the variable with it "
                "instead of filling it by blocks."
            )
        # Made once: a seed generator draws the table's seed here.
        source = make_rows((rows, dim))
        block = _block_rows(dim, target.dtype)
        for start in range(0, rows, block):
            size = min(block, rows - start)
            # A scatter writes in place; a sliced assign copied the table.
            target.scatter_update(
                tf.IndexedSlices(
                    source.rows(start, size), tf.range(start, start + size)
                )
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
    bit for bit (see the module's docstring for the initializers that draw
    a new table per call). SparseCore (`tpu_embedding_v3.py`) rotates each
    table's shards by a few rows: a shard past the last row continues at
    the first.

    Args:
        initializer: The table's initializer (a callable taking `shape` and
            `dtype`).
        table: The table's name, for error messages.
        columns: The names of the columns that read the table, for error
            messages.

    Raises:
        ValueError: when a shard of a table larger than
            `WHOLE_TABLE_LIMIT_BYTES` is asked of an initializer that makes
            its table as a whole (`row_local` is False), naming the table.

    Example:

    >>> from types import SimpleNamespace
    >>> init = EngineInitializer(keras.initializers.RandomNormal(seed=1))
    >>> whole = init((5, 2), dtype="float32")
    >>> shard = SimpleNamespace(shape=(2, 2), offset=(3, 0))
    >>> rows = init((5, 2), dtype="float32", shard_info=shard)
    >>> bool(tf.reduce_all(rows == whole[3:]))
    True
    """

    def __init__(
        self,
        initializer: InitializerLike,
        table: str = "",
        columns: Sequence[str] = (),
    ) -> None:
        self.initializer = initializer
        self.table = table
        self.columns = tuple(columns)

    # Not `_plain_ops`: TF finds `shard_info` in this signature.
    def __call__(
        self, shape: Any, dtype: Any = None, shard_info: Any = None
    ) -> Tensor:
        full = tuple(int(d) for d in shape)
        if shard_info is None:
            if len(full) == 2:
                return table_rows(self.initializer, full, 0, full[0], dtype)
            return self.initializer(shape, dtype=dtype)
        offset = tuple(int(d) for d in shard_info.offset)
        if len(full) != 2 or offset[1:] != (0,):
            raise ValueError(
                f"EngineInitializer shards tables by rows, but was asked for "
                f"the shard at offset {offset} of a table of shape {full}. "
                "Only row shards of rank-2 tables (offset (row, 0)), as "
                "tf.tpu.experimental.embedding makes them, are supported."
            )
        rows, count = full[0], int(shard_info.shape[0])
        if count < rows:
            self._refuse_whole_tables_on_shards(full, dtype)
        start = offset[0] % rows
        head = min(count, rows - start)
        first = table_rows(self.initializer, full, start, head, dtype)
        if head == count:
            return first
        rest = table_rows(self.initializer, full, 0, count - head, dtype)
        return tf.concat([first, rest], axis=0)

    def table_rows(
        self, shape: Any, start: int, count: int, dtype: Any = None
    ) -> Tensor:
        """Rows `[start, start + count)` of the table (`table_rows` of the
        wrapped initializer), for code that holds the engine's
        `TableConfig`: `table_rows(config.initializer, ...)` asks here."""
        return table_rows(self.initializer, shape, start, count, dtype)

    def _refuse_whole_tables_on_shards(
        self, shape: _TableShape, dtype: Any
    ) -> None:
        dtype = tf.as_dtype(dtype or keras.config.floatx())
        if row_local(self.initializer, dtype) or callable(
            getattr(self.initializer, "table_rows", None)
        ):
            return
        size = shape[0] * shape[1] * dtype.size
        if size <= WHOLE_TABLE_LIMIT_BYTES:
            return
        names = ", ".join(self.columns)
        columns = f" (columns {names})" if self.columns else ""
        raise ValueError(
            f"Table '{self.table}'{columns} of shape {shape} ({size} bytes) "
            "is sharded over the TPU hosts, but its initializer "
            f"{describe(self.initializer)} makes the table as a whole: every "
            "host would make all of it to keep its own rows, which is "
            "refused for tables larger than WHOLE_TABLE_LIMIT_BYTES "
            f"({WHOLE_TABLE_LIMIT_BYTES} bytes). Give the column an "
            "initializer whose rows are made alone: a random one "
            "(keras.initializers.TruncatedNormal, RandomUniform, "
            "GlorotUniform, HeNormal, VarianceScaling, ...), "
            "keras.initializers.Constant(matrix) for a pretrained table, or "
            "ckpt_to_load_from / tensor_name_in_ckpt to read it from a "
            "checkpoint."
        )

    def get_config(self) -> dict[str, Any]:
        return {
            "initializer": keras.saving.serialize_keras_object(
                self.initializer
            ),
            "table": self.table,
            "columns": list(self.columns),
        }

    @classmethod
    def from_config(cls, config: KerasConfig) -> EngineInitializer:
        return cls(
            keras.saving.deserialize_keras_object(config["initializer"]),
            table=config.get("table", ""),
            columns=config.get("columns", ()),
        )


# --------------------------------------------------------------- internals


class _Rows(abc.ABC):
    """Rows of one table's value, made without the rest of it."""

    # Whether making the rows a block at a time saves memory: not for a
    # constant array, whose rows are a view of a value held anyway.
    by_blocks = True

    @abc.abstractmethod
    def rows(self, start: Any, count: int) -> Tensor:
        """Rows `[start, start + count)`; `start` is an int, or an int64
        scalar tensor where `by_blocks` is True."""


class _Constant(_Rows):
    """A constant's rows: the rows of its value in the table's shape."""

    by_blocks = False

    def __init__(self, value: np.ndarray, dimension: int, dtype: Any) -> None:
        # `value` is a scalar, or a (read-only, broadcast) view of the
        # table's shape: slicing it copies no more than the rows asked for.
        self.value = value
        self.dimension = dimension
        self.dtype = dtype

    def rows(self, start: Any, count: int) -> Tensor:
        if self.value.ndim == 0:
            return tf.fill(
                [count, self.dimension], tf.cast(self.value, self.dtype)
            )
        rows = np.ascontiguousarray(self.value[start : start + count])
        # Inside a trace, a captured tensor rather than a graph constant: a
        # GraphDef holds at most 2 GB. Cast by TensorFlow, as Keras casts.
        with tf.init_scope():
            return tf.cast(tf.convert_to_tensor(rows), self.dtype)


class _Identity(_Rows):
    """Keras' `Identity`: `gain * eye(rows, dimension)`, row by row."""

    def __init__(self, gain: float, dimension: int, dtype: Any) -> None:
        self.gain = gain
        self.dimension = dimension
        self.dtype = dtype

    def rows(self, start: Any, count: int) -> Tensor:
        first = tf.cast(start, tf.int64)
        ids = tf.range(first, first + count)
        unit = tf.one_hot(ids, self.dimension, dtype=self.dtype)
        return tf.constant(self.gain, self.dtype) * unit


class _Fresh(_Rows):
    """An unseeded TF draw without a shape-dependent scale: each block is a
    fresh call of its own shape (TF's stateful random ops)."""

    def __init__(
        self, initializer: InitializerLike, dimension: int, dtype: Any
    ) -> None:
        self.initializer = initializer
        self.dimension = dimension
        self.dtype = dtype

    def rows(self, start: Any, count: int) -> Tensor:
        return self.initializer((count, self.dimension), dtype=self.dtype)


# Philox counter steps per group of 4 float32 outputs, per raw kernel: one
# for uniform and normal; the truncated normal reserves 256 (its rejection
# sampler may use that many draws per group).
_KERNELS = {
    "truncated_normal": (tf.raw_ops.StatelessTruncatedNormalV2, 256),
    "normal": (tf.raw_ops.StatelessRandomNormalV2, 1),
    "uniform": (tf.raw_ops.StatelessRandomUniformV2, 1),
}
_GROUP = 4


class _Draw(_Rows):
    """The rows a stateless draw of the whole table has there.

    Keras' TF backend and TF's seeded initializers draw
    `tf.random.stateless_*(shape, seed)` with the auto-selected algorithm
    (Philox on the CPU hosts that initialize tables). The value at flat
    index `i` depends on the seed and `i` only: group `i // 4` comes from
    the counter advanced by `group * skip`. So these rows are the draw of
    `count * dimension` values (plus the leading part of the first group)
    from the advanced counter, scaled as `tf.random.stateless_*` scales it.

    Args:
        distribution: A key of `_KERNELS`.
        low: The mean, or the uniform draw's lower bound.
        high: The standard deviation, or the uniform draw's upper bound.
        seed: The `[2]` integer seed tensor of the whole draw.
        dimension: The table's dimension.
        dtype: float32.
    """

    def __init__(
        self,
        distribution: str,
        low: float,
        high: float,
        seed: Tensor,
        dimension: int,
        dtype: Any,
    ) -> None:
        self.distribution = distribution
        self.kernel, self.skip = _KERNELS[distribution]
        self.low = tf.cast(low, dtype)
        self.high = tf.cast(high, dtype)
        self.dimension = dimension
        self.dtype = dtype
        self.key, self.counter = tf.raw_ops.StatelessRandomGetKeyCounter(
            seed=seed
        )

    def rows(self, start: Any, count: int) -> Tensor:
        # Python integers for an int `start`: static shapes.
        first = (
            start if isinstance(start, int) else tf.cast(start, tf.int64)
        ) * self.dimension
        group = first // _GROUP
        lead = first - group * _GROUP
        raw = self.kernel(
            shape=tf.reshape(lead + count * self.dimension, [1]),
            key=self.key,
            counter=_advance(self.counter, group * self.skip),
            alg=3,  # AUTO_SELECT, as tf.random.stateless_* passes it
            dtype=self.dtype,
        )
        raw = tf.reshape(raw[lead:], [count, self.dimension])
        if self.distribution == "uniform":
            return raw * (self.high - self.low) + self.low
        return raw * self.high + self.low


def _advance(counter: Tensor, steps: Any) -> Tensor:
    """A 128-bit Philox counter (`[2]` uint64, low word first) + `steps`."""
    if isinstance(steps, int):
        steps = tf.constant(steps, tf.uint64)
    low = counter[0] + tf.cast(steps, tf.uint64)
    carry = tf.cast(low < counter[0], tf.uint64)
    return tf.stack([low, counter[1] + carry])


def _calls_as(initializer: InitializerLike, cls: type) -> bool:
    """Whether `initializer` makes its values as `cls` does (an instance
    that does not override `__call__`)."""
    return isinstance(initializer, cls) and (
        type(initializer).__call__ is cls.__call__
    )


def _constant_value(initializer: InitializerLike) -> np.ndarray | None:
    """A constant initializer's value, when known without running a graph."""
    if _calls_as(initializer, keras.initializers.Zeros) or _calls_as(
        initializer, tf.zeros_initializer
    ):
        return np.zeros(())
    if _calls_as(initializer, keras.initializers.Ones) or _calls_as(
        initializer, tf.ones_initializer
    ):
        return np.ones(())
    if _calls_as(initializer, keras.initializers.Constant) or _calls_as(
        initializer, tf.constant_initializer
    ):
        value = initializer.value  # type: ignore[attr-defined]
        if isinstance(value, tf.Variable):
            return None
        if tf.is_tensor(value):
            # A symbolic tensor's value is not known while tracing.
            value = tf.get_static_value(value)
        return None if value is None else np.asarray(value)
    return None


def _is_zero(initializer: InitializerLike) -> bool:
    value = _constant_value(initializer)
    return value is not None and value.ndim == 0 and bool(value == 0)


def _table_value(
    initializer: InitializerLike, value: np.ndarray, shape: _TableShape
) -> np.ndarray:
    """`value` in the table's shape: broadcast as Keras' `Constant` does
    (`value * ones(shape)`), reshaped as TF's `constant(value, shape=...)`
    does for `tf.constant_initializer`. A view: nothing is copied."""
    if value.ndim == 0:
        return value
    if _calls_as(initializer, tf.constant_initializer):
        if value.size != shape[0] * shape[1]:
            raise ValueError(
                f"tf.constant_initializer's value has shape {value.shape} "
                f"({value.size} values), but the table has shape {shape} "
                f"({shape[0] * shape[1]} values): give it a scalar or an "
                "array of the table's size."
            )
        return value.reshape(shape)
    try:
        return np.broadcast_to(value, shape)
    except ValueError:
        raise ValueError(
            f"keras.initializers.Constant's value has shape {value.shape}, "
            f"which does not broadcast to the table's shape {shape}: give "
            "it a scalar, a row of the table's dimension or a matrix of "
            "the table's shape."
        ) from None


def _draw_spec(
    initializer: InitializerLike, shape: _TableShape
) -> tuple[str, float, float] | None:
    """(distribution, low, high) of a random initializer's whole draw."""
    init: Any = initializer
    if _calls_as(init, keras.initializers.VarianceScaling):
        return _variance_scaling_spec(init, shape)
    if _calls_as(init, keras.initializers.TruncatedNormal):
        return ("truncated_normal", init.mean, init.stddev)
    if _calls_as(init, keras.initializers.RandomNormal) or _calls_as(
        init, tf.random_normal_initializer
    ):
        return ("normal", init.mean, init.stddev)
    if _calls_as(init, keras.initializers.RandomUniform) or _calls_as(
        init, tf.random_uniform_initializer
    ):
        return ("uniform", init.minval, init.maxval)
    return None


def _variance_scaling_spec(
    initializer: keras.initializers.VarianceScaling, shape: _TableShape
) -> tuple[str, float, float]:
    """What Keras' `VarianceScaling.__call__` draws for the whole table
    (`keras/src/initializers/random_initializers.py`): its scale comes from
    the whole shape's fans, never from a shard's or a block's."""
    scale = initializer.scale
    fan_in, fan_out = keras_compute_fans(
        shape,
        input_axes=getattr(initializer, "input_axes", None),
        output_axes=getattr(initializer, "output_axes", None),
    )
    if initializer.mode == "fan_in":
        scale /= max(1.0, fan_in)
    elif initializer.mode == "fan_out":
        scale /= max(1.0, fan_out)
    else:
        scale /= max(1.0, (fan_in + fan_out) / 2.0)
    if initializer.distribution == "truncated_normal":
        return ("truncated_normal", 0.0, math.sqrt(scale) / 0.87962566103423978)
    if initializer.distribution == "untruncated_normal":
        return ("normal", 0.0, math.sqrt(scale))
    limit = math.sqrt(3.0 * scale)
    return ("uniform", -limit, limit)


def _seed_of(initializer: InitializerLike) -> Callable[[], Tensor] | None:
    """How the draw gets its `[2]` seed tensor: Keras' seed (an integer, or
    a `SeedGenerator` that advances at each call), or TF's `[seed, 0]`;
    None for TF's unseeded (stateful) initializers."""
    seed: Any = getattr(initializer, "seed", None)
    if isinstance(initializer, keras.initializers.Initializer):
        return lambda: keras_random_seed(seed)
    if seed is None:
        return None
    return lambda: tf.constant([seed, 0])


def _row_maker(
    initializer: InitializerLike, dtype: Any
) -> Callable[[_TableShape], _Rows] | None:
    """What makes `initializer`'s rows for a table's shape, or None if the
    rows need the whole table. Decides from the initializer alone; calling
    the result draws a seed generator's seed (once per table or shard)."""
    dtype = tf.as_dtype(dtype)
    value = _constant_value(initializer)
    if value is not None:
        return lambda shape: _Constant(
            _table_value(initializer, value, shape), shape[1], dtype
        )
    if _calls_as(initializer, keras.initializers.Identity):
        gain = float(initializer.gain)  # type: ignore[attr-defined]
        return lambda shape: _Identity(gain, shape[1], dtype)
    if dtype != tf.float32 or _draw_spec(initializer, (1, 1)) is None:
        return None
    seed = _seed_of(initializer)
    if seed is None:
        return lambda shape: _Fresh(initializer, shape[1], dtype)
    draw_seed = seed

    def make(shape: _TableShape) -> _Rows:
        spec = _draw_spec(initializer, shape)
        assert spec is not None
        return _Draw(*spec, seed=draw_seed(), dimension=shape[1], dtype=dtype)

    return make


def _block_rows(dimension: int, dtype: Any) -> int:
    size = int(tf.as_dtype(dtype).size)
    return max(1, BLOCK_BYTES // (max(dimension, 1) * size))


def _in_blocks(
    source: _Rows, start: int, count: int, dimension: int, dtype: Any
) -> Tensor:
    """`source`'s rows `[start, start + count)`, one block at a time.

    The blocks are written in place (`InplaceUpdate`, which aliases its
    input) into one uninitialized buffer of `count` rows, in a
    `tf.while_loop` of one block per iteration: a graph stays one block's
    ops large whatever the shard's size, and holds the shard and one block.
    """
    block = _block_rows(dimension, dtype)
    if not source.by_blocks or count <= block:
        return source.rows(start, count)
    full, tail = divmod(count, block)
    buffer = tf.raw_ops.Empty(shape=[count, dimension], dtype=dtype)

    def fill(i: Tensor, buffer: Tensor) -> tuple[Tensor, Tensor]:
        offset = i * block
        values = source.rows(tf.cast(offset, tf.int64) + start, block)
        buffer = tf.raw_ops.InplaceUpdate(
            x=buffer, i=tf.range(offset, offset + block), v=values
        )
        return i + 1, buffer

    _, buffer = tf.while_loop(
        lambda i, _: i < full,
        fill,
        (tf.constant(0), buffer),
        parallel_iterations=1,
    )
    if tail:
        buffer = tf.raw_ops.InplaceUpdate(
            x=buffer,
            i=tf.range(full * block, count),
            v=source.rows(start + full * block, tail),
        )
    return buffer


def _rows_of_whole_table(
    initializer: InitializerLike,
    shape: _TableShape,
    start: int,
    count: int,
    dtype: Any,
) -> Tensor:
    """The rows of the whole table, copied: a slice would share (and so
    keep) the whole table's buffer."""
    value = initializer(shape, dtype=dtype)
    if not tf.is_tensor(value):
        array = np.asarray(value)
        _check_values_shape(initializer, array.shape, shape)
        rows = np.ascontiguousarray(array[start : start + count])
        with tf.init_scope():  # captured, not a graph constant (2 GB)
            return tf.cast(tf.convert_to_tensor(rows), dtype)
    _check_values_shape(initializer, value.shape, shape)
    value = tf.cast(value, dtype)
    if count == shape[0]:
        return value
    return tf.gather(value, tf.range(start, start + count))


def _check_values_shape(
    initializer: InitializerLike, got: Any, want: _TableShape
) -> None:
    if not tf.TensorShape(got).is_compatible_with(want):
        raise ValueError(
            f"The initializer {describe(initializer)} returned values of "
            f"shape {tuple(got)} for a table of shape {want}: it must "
            "return the whole table, [vocabulary_size, dimension]."
        )


def _rank_2(shape: Sequence[int], initializer: InitializerLike) -> _TableShape:
    full = tuple(int(d) for d in shape)
    if len(full) != 2:
        raise ValueError(
            f"Tables have shape (rows, dimension); {describe(initializer)} "
            f"was asked for rows of shape {full}."
        )
    return full[0], full[1]
