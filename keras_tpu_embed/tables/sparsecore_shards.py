"""A SparseCore table one SparseCore at a time, never whole.

Each SparseCore holds the rows `first, first + n, ...` of a table
(`sparsecore_layout.core_rows`). Everything that fills or reads those rows
goes through a `TableRows` source, which hands out rows a bounded block at
a time, wherever they come from:

- `InitializerRows`: the rows the table's initializer makes on one device
  (`initialization.table_rows`: a seeded Keras draw makes only the block's
  rows, `tables.CheckpointInitializer` reads only them), so SparseCore
  tables start where the same columns' CPU tables start;
- `ArrayRows`: a table in memory (a `.keras` file's, or one written by
  hand);
- `CheckpointRows`: a `[vocabulary_size, dim]` tensor of a checkpoint
  written on CPU or by the V1 engine, read with `RestoreV2` slices;
- `SparseCoreCheckpointRows`: a table written on SparseCore
  (`sparsecore_layout.checkpoint_shape`), each SparseCore's rows one
  contiguous slice.

`SparseCoreInitializer` is the initializer TF's `TPUEmbeddingV2` calls for
each SparseCore's part of a stacked table (`write_table` is the same after
TF created the tables); `read_table` takes one table out of the shards and
`core_slice` is a SparseCore's part of a table as the checkpoint saves it,
without copying it.
"""

from __future__ import annotations

from typing import Any
from typing import Protocol
from typing import Sequence

import numpy as np

from keras_tpu_embed._compat import tf
from keras_tpu_embed.tables import initialization
from keras_tpu_embed.tables import sparsecore_layout
from keras_tpu_embed.tables.sparsecore_layout import TableLayout
from keras_tpu_embed.tables.table_specs import CheckpointInitializer
from keras_tpu_embed.types import InitializerLike
from keras_tpu_embed.types import Tensor


def block_rows(dimension: int) -> int:
    """Rows of float32 in one block (`initialization.BLOCK_BYTES`)."""
    return max(1, initialization.BLOCK_BYTES // (4 * max(dimension, 1)))


class TableRows(Protocol):
    """Rows of one table, `[vocabulary_size, dim]` in the CPU layout."""

    @property
    def shape(self) -> tuple[int, int]: ...

    def strided(self, first: int, step: int, count: int) -> Tensor:
        """Rows `first + i * step` for `i < count` (all in the table)."""
        ...


class _ByBlocks:
    """`strided` made of contiguous blocks of rows (`block`)."""

    def __init__(self, shape: Sequence[int]) -> None:
        self.shape = (int(shape[0]), int(shape[1]))

    def block(self, start: int, count: int) -> Tensor:
        """Rows `[start, start + count)`."""
        raise NotImplementedError

    def strided(self, first: int, step: int, count: int) -> Tensor:
        picked = max(1, block_rows(self.shape[1]) // step)
        pieces = []
        for done in range(0, count, picked):
            take = min(picked, count - done)
            start = first + done * step
            rows = self.block(start, (take - 1) * step + 1)
            pieces.append(rows[::step])
        return _concat(pieces, self.shape[1])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """The whole table (what `read_tables` gives before TF made it)."""
        whole = np.asarray(self.strided(0, 1, self.shape[0]))
        return whole if dtype is None else whole.astype(dtype)


def _concat(pieces: list[Tensor], dimension: int) -> Tensor:
    if not pieces:
        return tf.zeros([0, dimension], tf.float32)
    return pieces[0] if len(pieces) == 1 else tf.concat(pieces, 0)


def makes_rows_alone(initializer: InitializerLike) -> bool:
    """Whether `initialization.table_rows` makes a block of rows without
    making the whole table."""
    return hasattr(initializer, "table_rows") or initialization.row_local(
        initializer
    )


class InitializerRows(_ByBlocks):
    """The rows `initializer(shape)` makes on one device.

    Args:
        initializer: The table's initializer.
        shape: The table's `[vocabulary_size, dim]`.
    """

    def __init__(
        self, initializer: InitializerLike, shape: Sequence[int]
    ) -> None:
        super().__init__(shape)
        self.initializer = initializer
        self._alone = makes_rows_alone(initializer)

    def block(self, start: int, count: int) -> Tensor:
        return initialization.table_rows(
            self.initializer, self.shape, start, count, tf.float32
        )

    def strided(self, first: int, step: int, count: int) -> Tensor:
        if self._alone:
            return super().strided(first, step, count)
        # Orthogonal, Identity, a constant matrix...: only the whole table
        # has these rows, so it is made (once per call) and left.
        whole = tf.convert_to_tensor(
            self.initializer(self.shape, dtype=tf.float32), tf.float32
        )
        return whole[first : first + (count - 1) * step + 1 : step]


class ArrayRows(_ByBlocks):
    """A table in memory."""

    def __init__(self, value: Any) -> None:
        self.value = np.asarray(value, dtype=np.float32)
        super().__init__(self.value.shape)

    def block(self, start: int, count: int) -> Tensor:
        return tf.constant(self.value[start : start + count])

    def strided(self, first: int, step: int, count: int) -> Tensor:
        stop = first + (count - 1) * step + 1
        return tf.constant(self.value[first:stop:step])


def _prefix(path: str) -> str:
    if tf.io.gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise ValueError(f"No checkpoint in the directory {path}.")
        return str(latest)
    return path


def _restore(path: str, key: str, slice_spec: str, dtype: Any) -> Tensor:
    (value,) = tf.raw_ops.RestoreV2(
        prefix=_prefix(path),
        tensor_names=[key],
        shape_and_slices=[slice_spec],
        dtypes=[dtype],
    )
    return tf.cast(value, tf.float32)


class _ReadOnce(_ByBlocks):
    """A checkpoint tensor that is read whole, once, when a part of it
    needs the whole: TF's bundle reader reads a whole stored tensor (or
    stored slice) for any slice of it (measured: a 16384-row slice of a
    `[2**20, 64]` tensor cost a whole read, 1.3 s and 256 MiB, each time),
    so reading a block at a time would read the table once per block.
    `release` frees it when the rows are written."""

    def __init__(self, shape: Sequence[int]) -> None:
        super().__init__(shape)
        self._whole: Tensor | None = None

    def _read_whole(self) -> Tensor:
        raise NotImplementedError

    def whole(self) -> Tensor:
        """The table, read once."""
        if self._whole is None:
            self._whole = self._read_whole()
        return self._whole

    def block(self, start: int, count: int) -> Tensor:
        return self.whole()[start : start + count]

    def strided(self, first: int, step: int, count: int) -> Tensor:
        return self.whole()[first : first + (count - 1) * step + 1 : step]

    def release(self) -> None:
        """Frees the table read whole."""
        self._whole = None


class CheckpointRows(_ReadOnce):
    """A `[vocabulary_size, dim]` tensor of a checkpoint, saved whole (on
    CPU, by the V1 engine or by an older version): read whole, once.

    Args:
        path: The checkpoint's path or prefix.
        key: The tensor's key.
        shape: Its shape.
        dtype: Its dtype in the checkpoint.
    """

    def __init__(
        self, path: str, key: str, shape: Sequence[int], dtype: Any
    ) -> None:
        super().__init__(shape)
        self.path, self.key, self.dtype = path, key, dtype

    def _read_whole(self) -> Tensor:
        return _restore(self.path, self.key, "", self.dtype)


class SparseCoreCheckpointRows(_ReadOnce):
    """A table saved on SparseCore (`sparsecore_layout.checkpoint_shape`),
    one slice per SparseCore: `stored[c, i]` is row `c + i * n` of the
    padded table. The rows of one SparseCore of the same count (`strided`
    with step `n`) are one slice, read alone; other rows need the table,
    read whole once.

    Args:
        path: The checkpoint's path or prefix.
        key: The tensor's key.
        shape: The table's `[vocabulary_size, dim]`.
        stored: The tensor's `[n, rows per core, padded width]`.
        dtype: Its dtype in the checkpoint.
    """

    def __init__(
        self,
        path: str,
        key: str,
        shape: Sequence[int],
        stored: Sequence[int],
        dtype: Any,
    ) -> None:
        super().__init__(shape)
        self.path, self.key, self.dtype = path, key, dtype
        self.stored = [int(d) for d in stored]
        cores, per_core, width = self.stored
        if cores * per_core < self.shape[0] or width < self.shape[1]:
            raise ValueError(
                f"Tensor '{key}' of checkpoint {path} holds a SparseCore "
                f"table of at most {cores * per_core} rows of width {width}, "
                f"which cannot hold a table of shape {list(self.shape)}."
            )

    @property
    def cores(self) -> int:
        """How many SparseCores the table was saved from."""
        return self.stored[0]

    def _slice(self, cores: tuple[int, int], rows: tuple[int, int]) -> Tensor:
        n, per_core, width = self.stored
        spec = (
            f"{n} {per_core} {width} {cores[0]},{cores[1]}:"
            f"{rows[0]},{rows[1]}:0,{self.shape[1]}"
        )
        return _restore(self.path, self.key, spec, self.dtype)

    def _read_whole(self) -> Tensor:
        n, per_core, _ = self.stored
        cores = self._slice((0, n), (0, per_core))
        rows = tf.reshape(tf.transpose(cores, [1, 0, 2]), [-1, self.shape[1]])
        return rows[: self.shape[0]]

    def strided(self, first: int, step: int, count: int) -> Tensor:
        n = self.stored[0]
        if step != n or self._whole is not None:
            return super().strided(first, step, count)
        return self._slice((first % n, 1), (first // n, count))[0]


def initializer_rows(
    initializer: InitializerLike, shape: Sequence[int]
) -> TableRows:
    """The rows `initializer` makes for a table of `shape` on one device; a
    `tables.CheckpointInitializer` (`ckpt_to_load_from`) is its checkpoint's
    tensor, read whole once (see `_ReadOnce`)."""
    if isinstance(initializer, CheckpointInitializer):
        path, key = initializer.checkpoint, initializer.tensor_name
        reader = tf.train.load_checkpoint(path)
        stored = reader.get_variable_to_shape_map().get(key)
        if stored is None or list(stored) != [int(d) for d in shape]:
            raise ValueError(
                f"Tensor '{key}' of checkpoint {path} has shape {stored}, but "
                f"table '{initializer.table}' (ckpt_to_load_from) has shape "
                f"{[int(d) for d in shape]}. Point tensor_name_in_ckpt at the "
                "table's tensor, or give the column the checkpoint's "
                "vocabulary and dimension."
            )
        dtype = reader.get_variable_to_dtype_map()[key]
        return CheckpointRows(path, key, shape, dtype)
    return InitializerRows(initializer, shape)


def as_rows(value: Any) -> TableRows:
    """`value` as a `TableRows`: itself, or an array in memory."""
    if hasattr(value, "strided"):
        return value  # type: ignore[no-any-return]
    return ArrayRows(value)


def _core_values(
    source: TableRows,
    core: sparsecore_layout.CoreRows,
    width: int,
    layout: TableLayout,
) -> Tensor:
    """The rows one SparseCore holds, `[count, padded width]`: the table's
    rows, then zero rows and columns where TF pads it (as TF's checkpoint
    adapter pads a CPU table, `_shard_from_cpu_to_sc`)."""
    rows, dimension = source.shape
    if list(source.shape) != [int(d) for d in layout.unsharded_shape]:
        raise ValueError(
            f"Cannot put rows of shape {list(source.shape)} into the "
            f"SparseCore table '{layout.table_name}' of shape "
            f"{list(layout.unsharded_shape)}."
        )
    n = layout.num_sparse_cores
    real = max(0, min(core.count, -(-(rows - core.first) // n)))
    values = source.strided(core.first, n, real) if real else None
    if values is None:
        return tf.zeros([core.count, width], tf.float32)
    return tf.pad(
        tf.cast(values, tf.float32),
        [[0, core.count - real], [0, width - dimension]],
    )


class SparseCoreInitializer:
    """What `TPUEmbeddingV2` calls to initialize one SparseCore's rows of
    one table (`tpu_embedding_v3.py`, `_create_variables`,
    `table_initialize_fn_non_batch`).

    TF calls it with the padded table's shape and the SparseCore's
    `shard_info` (`shape=[rows per core, padded width]`, `offset=[core *
    rows per core, 0]`, `_compute_sc_shard_info`) once per SparseCore and
    table; the answer is that SparseCore's rows of the table, from
    `rows` (the table's initializer, or a value restored before TF created
    the tables). Bound (`bind`) once TF decided the layout.

    Args:
        table: The table's name, for errors.
    """

    def __init__(self, table: str) -> None:
        self.table = table
        self.layout: TableLayout | None = None
        self.rows: TableRows | None = None

    def bind(self, layout: TableLayout, rows: TableRows) -> None:
        """Where the table lives and where its rows come from."""
        self.layout, self.rows = layout, rows
        self._asked: set[int] = set()

    def __call__(
        self, shape: Any, dtype: Any = None, shard_info: Any = None
    ) -> Tensor:
        layout, rows = self.layout, self.rows
        if layout is None or rows is None:
            raise RuntimeError(
                f"The SparseCore initializer of table '{self.table}' was "
                "called before the engine knew the table's layout."
            )
        per_core = sparsecore_layout.rows_per_core(layout)
        if shard_info is None or int(shard_info.shape[0]) != per_core:
            raise RuntimeError(
                f"TPUEmbeddingV2 asked for rows of table '{self.table}' "
                f"with shard_info={shard_info} for shape {list(shape)}; "
                "keras_tpu_embed initializes one SparseCore's rows "
                f"({per_core}) at a time. This TensorFlow version calls "
                "table initializers differently: please report it."
            )
        core = int(shard_info.offset[0]) // per_core
        width = int(layout.unsharded_padded_shape[1])
        value = _core_values(
            rows, sparsecore_layout.core_rows(layout)[core], width, layout
        )
        self._asked.add(core)
        if len(self._asked) == layout.num_sparse_cores:
            _release(rows)  # TF asks for each SparseCore once.
        return tf.cast(value, dtype or tf.float32)


def _shards_of(variable: Any, layout: TableLayout) -> list[Any]:
    shards = list(variable.values)
    if len(shards) != layout.num_partitions:
        raise RuntimeError(
            f"The stacked table '{layout.stacked_table_name}' has "
            f"{len(shards)} shards but its layout {layout.num_partitions} "
            "partitions."
        )
    return shards


def _release(rows: TableRows) -> None:
    release = getattr(rows, "release", None)
    if release is not None:
        release()


def write_table(variable: Any, layout: TableLayout, rows: TableRows) -> None:
    """Writes a table (or slot) into its rows of a stacked variable, one
    SparseCore's rows at a time, in place; the other tables of the stack
    are left as they are, the padding is zero."""
    shards = _shards_of(variable, layout)
    width = int(layout.unsharded_padded_shape[1])
    with tf.init_scope():
        for core in sparsecore_layout.core_rows(layout):
            shards[core.shard].scatter_update(
                tf.IndexedSlices(
                    _core_values(rows, core, width, layout),
                    tf.range(core.shard_row, core.shard_row + core.count),
                )
            )
    _release(rows)


def read_table(variable: Any, layout: TableLayout) -> np.ndarray:
    """One table (or slot), `[vocabulary_size, dim]`, out of a stacked
    variable, one SparseCore's rows at a time (no copy of the stack)."""
    shards = _shards_of(variable, layout)
    rows, dimension = (int(d) for d in layout.unsharded_shape)
    n = layout.num_sparse_cores
    table = np.empty([rows, dimension], np.float32)
    for core in sparsecore_layout.core_rows(layout):
        real = max(0, min(core.count, -(-(rows - core.first) // n)))
        if not real:
            continue
        part = shards[core.shard][core.shard_row : core.shard_row + real]
        table[core.first : core.first + (real - 1) * n + 1 : n] = np.asarray(
            part[:, :dimension]
        )
    return table


def read_rows(
    variable: Any, layout: TableLayout, start: int, stop: int
) -> np.ndarray:
    """Rows `[start, stop)` of one table (or slot) out of a stacked
    variable: each SparseCore's share of them gathered from its shard."""
    shards = _shards_of(variable, layout)
    dimension = int(layout.unsharded_shape[1])
    n = layout.num_sparse_cores
    block = np.empty([stop - start, dimension], np.float32)
    for core in sparsecore_layout.core_rows(layout):
        # The table rows this SparseCore holds: first, first + n, ...
        first = start + (core.first - start) % n
        if first >= stop:
            continue
        rows = np.arange(first, stop, n)
        positions = core.shard_row + (rows - core.first) // n
        part = tf.gather(shards[core.shard], positions)
        block[rows - start] = np.asarray(part[:, :dimension])
    return block


def core_slice(variable: Any, layout: TableLayout, core: int) -> Tensor:
    """SparseCore `core`'s rows of a table, `[1, rows per core, padded
    width]`: a slice of its shard's buffer, not a copy (what a checkpoint
    saves of it)."""
    place = sparsecore_layout.core_rows(layout)[core]
    shard = _shards_of(variable, layout)[place.shard]
    value = shard.read_value()[place.shard_row : place.shard_row + place.count]
    return tf.expand_dims(value, 0)


def write_core(
    variable: Any, layout: TableLayout, core: int, value: Tensor
) -> None:
    """Writes `[1, rows per core, padded width]` into SparseCore `core`'s
    rows of a table (a checkpoint's slice back where it was saved)."""
    place = sparsecore_layout.core_rows(layout)[core]
    shard = _shards_of(variable, layout)[place.shard]
    shard.scatter_update(
        tf.IndexedSlices(
            tf.cast(value[0], tf.float32),
            tf.range(place.shard_row, place.shard_row + place.count),
        )
    )


def fill_variable(variable: Any, rows: TableRows) -> None:
    """Writes a whole `[vocabulary_size, dim]` variable (a CPU table) from
    `rows` in place: one SparseCore's rows at a time from a SparseCore
    checkpoint, else one block at a time."""
    target = variable if isinstance(variable, tf.Variable) else variable.value
    count, dimension = rows.shape
    if [int(d) for d in target.shape] != [count, dimension]:
        raise ValueError(
            f"Cannot fill the variable '{target.name}' of shape "
            f"{target.shape.as_list()} with rows of shape {[count, dimension]}."
        )
    if isinstance(rows, SparseCoreCheckpointRows):
        n = rows.cores
        parts = [
            (first, tf.range(first, count, n)) for first in range(min(n, count))
        ]
    else:
        step = block_rows(dimension)
        parts = [
            (start, tf.range(start, min(start + step, count)))
            for start in range(0, count, step)
        ]
    with tf.init_scope():
        for first, indices in parts:
            size = int(indices.shape[0])
            values = (
                rows.strided(first, rows.cores, size)
                if isinstance(rows, SparseCoreCheckpointRows)
                else rows.strided(first, 1, size)
            )
            target.scatter_update(
                tf.IndexedSlices(tf.cast(values, target.dtype), indices)
            )
    _release(rows)
