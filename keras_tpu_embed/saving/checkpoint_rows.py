"""A legacy checkpoint's table, read a stored piece at a time, in new ids.

`CheckpointRows` gives the rows of one checkpoint tensor (a table or an
optimizer slot) under the ids of the table that loads it: a TPUEstimator
run's "mod" layout undone, and with a vocabulary change each token's row
moved to its new position. It reads with `RestoreV2` and a slice spec, one
range of stored rows at a time.

TensorFlow's reader reads a whole stored tensor or slice whenever any part
of it is asked for (`BundleReader::GetSliceValue`, `tensor_bundle.cc`: a
slice that is not a stored one is copied out of the stored slice, read
whole into a temporary), so asking for small blocks would not hold less:
each request would read its stored piece again. A request here therefore
never spans two stored pieces, and the rows come out in blocks of
`initialization.BLOCK_BYTES`. A stored piece is one of the `num_shards`
slices that `fixed_size_partitioner` cut (a TPUEstimator run's tables, one
per host) or, without `num_shards`, the whole tensor. If the checkpoint
was cut otherwise, the rows are still right; each request then reads the
stored slices it touches.
"""

from __future__ import annotations

from typing import Any
from typing import Iterator
from typing import Sequence

import numpy as np

from keras_tpu_embed._compat import tf
from keras_tpu_embed.tables import initialization
from keras_tpu_embed.types import Tensor

IdsAndRows = tuple[np.ndarray, Tensor]
"""`(new ids, their float32 rows)`: one block of a `CheckpointRows` read."""


def stored_pieces(rows: int, num_shards: int) -> list[tuple[int, int]]:
    """`(first row, rows)` of each slice `fixed_size_partitioner(n)` saves.

    TF 1.x partitioned variables (`variable_scope._get_partitioned_variable`)
    give the first `rows % n` slices one row more, in order.

    Example:

    >>> stored_pieces(7, 3)
    [(0, 3), (3, 2), (5, 2)]
    """
    base, extra = divmod(rows, num_shards)
    pieces = []
    start = 0
    for index in range(num_shards):
        size = base + (1 if index < extra else 0)
        pieces.append((start, size))
        start += size
    return pieces


def vocabulary_positions(
    old: Sequence[Any], new: Sequence[Any], old_rows: int, new_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """`(old_to_new, new_to_old)`: where each token's row moves.

    `old_to_new[p]` is the new id of the token at old position `p` (-1 when
    the new vocabulary lacks it), `new_to_old[i]` the old position of new
    id `i` (-1 for new tokens and rows past the vocabulary, such as OOV
    buckets, which keep their values).

    Example:

    >>> old_to_new, new_to_old = vocabulary_positions(
    ...     ["a", "b", "c"], ["c", "x", "a"], 3, 4)
    >>> old_to_new.tolist(), new_to_old.tolist()
    ([2, -1, 0], [2, -1, 0, -1])
    """
    old_to_new = np.full(old_rows, -1, np.int64)
    new_to_old = np.full(new_rows, -1, np.int64)
    position = {token: index for index, token in enumerate(old)}
    for index, token in enumerate(new):
        source = position.get(token)
        if source is not None and source < old_rows:
            old_to_new[source] = index
            new_to_old[index] = source
    return old_to_new, new_to_old


class CheckpointRows:
    """One table or slot of a checkpoint, as rows of the table it loads.

    Args:
        prefix: The checkpoint's prefix (what `RestoreV2` reads).
        key: The tensor's key in the checkpoint.
        stored_shape: Its shape there, `(rows, dimension)`.
        dtype: Its dtype there (a float dtype).
        rows: The rows of the table it loads.
        num_shards: The stored pieces: how many slices the run saved the
            tensor in (see the module docstring), 1 for a whole tensor.
        mod: Whether the run sharded ids "mod": piece `i` holds the ids
            `i, i + num_shards, ...` (else "div": rows in id order).
        remap: `(old_to_new, new_to_old)` from `vocabulary_positions` to
            move rows by token, or None: new id = old id.

    Attributes:
        shape: `(rows, dimension)` of the table it loads.
    """

    def __init__(
        self,
        prefix: str,
        key: str,
        stored_shape: tuple[int, int],
        dtype: tf.DType,
        *,
        rows: int,
        num_shards: int,
        mod: bool,
        remap: tuple[np.ndarray, np.ndarray] | None,
    ) -> None:
        self._prefix = prefix
        self._key = key
        self._stored_shape = stored_shape
        self._dtype = dtype
        self._mod = mod
        self._remap = remap
        self._num_shards = num_shards
        self._pieces = stored_pieces(stored_shape[0], num_shards)
        self.shape = (rows, stored_shape[1])
        self._block = max(
            1, initialization.BLOCK_BYTES // (max(stored_shape[1], 1) * 4)
        )

    def blocks(
        self, start: int, stop: int, device: str | None = None
    ) -> Iterator[IdsAndRows]:
        """The checkpoint's rows for the new ids in `[start, stop)`.

        Reads one range of one stored piece at a time (the rows these ids
        need in it), with `device` running the read when given; yields
        `(new ids, float32 rows)` (a numpy array, a tensor) in blocks of
        at most `initialization.BLOCK_BYTES`. New ids the checkpoint has no
        row for (a remap's new tokens) are not yielded.
        """
        for index, (first, size) in enumerate(self._pieces):
            span = self._span(index, first, size, start, stop)
            if span is None:
                continue
            low, high = span
            values = self._restore(low, high, device)
            for begin in range(low, high, self._block):
                end = min(begin + self._block, high)
                ids = self._new_ids(index, first, begin, end)
                keep = (ids >= start) & (ids < stop)
                if not keep.any():
                    continue
                # Sliced where it was read (a slice elsewhere would copy
                # the whole read there first).
                with tf.device(device or ""):
                    block = values[begin - low : end - low]
                    if not keep.all():
                        block = tf.gather(block, np.flatnonzero(keep))
                yield ids[keep], block

    def _span(
        self, index: int, first: int, size: int, start: int, stop: int
    ) -> tuple[int, int] | None:
        """The stored rows of piece `index` that new ids `[start, stop)`
        need, as one range `[low, high)`, or None."""
        if size == 0:
            return None
        if self._remap is not None:
            old = self._remap[1][start:stop]
            old = old[old >= 0]
            stored = self._stored_rows(old, index, first, size)
            if not stored.size:
                return None
            return int(stored.min()), int(stored.max()) + 1
        if not self._mod:
            low, high = max(start, first), min(stop, first + size)
            return (low, high) if low < high else None
        n = self._num_shards
        # The ids in [start, stop) that piece `index` holds: index + n * k.
        low_id = start + (index - start) % n
        high_id = stop - 1 - (stop - 1 - index) % n
        if low_id > high_id:
            return None
        return first + low_id // n, first + high_id // n + 1

    def _stored_rows(
        self, old: np.ndarray, index: int, first: int, size: int
    ) -> np.ndarray:
        """Where piece `index` stores the old ids `old` it holds."""
        n = self._num_shards
        held: np.ndarray = (
            first + old[old % n == index] // n
            if self._mod
            else old[(old >= first) & (old < first + size)]
        )
        return held

    def _new_ids(
        self, index: int, first: int, begin: int, end: int
    ) -> np.ndarray:
        """The new ids of stored rows `[begin, end)` of piece `index`."""
        stored = np.arange(begin, end, dtype=np.int64)
        old = (
            index + self._num_shards * (stored - first) if self._mod else stored
        )
        if self._remap is None:
            return old
        new: np.ndarray = self._remap[0][old]
        return new

    def _restore(self, low: int, high: int, device: str | None) -> Tensor:
        """Stored rows `[low, high)` as float32, read by TF's `RestoreV2`.

        A tensor: its `.numpy()` would copy it whole (blocks are copied
        out of it one at a time instead).
        """
        rows, dimension = self._stored_shape
        spec = tf.Variable.SaveSliceInfo(
            full_name="",
            full_shape=[rows, dimension],
            var_offset=[low, 0],
            var_shape=[high - low, dimension],
        ).spec
        with tf.device(device or ""):
            (value,) = tf.raw_ops.RestoreV2(
                prefix=self._prefix,
                tensor_names=[self._key],
                shape_and_slices=[spec],
                dtypes=[self._dtype],
            )
            return tf.cast(value, tf.float32)
