"""Quantized serving tables: bfloat16 rows, or int8 rows with a per-row
scale and offset.

A serving export can store its tables smaller than the float32 tables of
training (`export_saved_model(..., table_dtype=...)`). The rows are
dequantized right after the gather, before `max_norm` and the combiner,
on every serving path; the model's own tables stay float32.

Schemes and error bounds, per element `x` of a row and its served value
`x̂` (up to float32 rounding of the dequantization, a few ulps of `|x|`):

- `"bfloat16"`: `x` rounded to nearest with 8 significant bits,
  `|x̂ - x| <= 2**-8 * |x|`.
- `"int8"`: the row-wise scheme of TorchRec / FBGEMM inference tables:
  per row `offset = min(row)`, `scale = (max(row) - min(row)) / 255`,
  stored code `round((x - offset) / scale)` in `[0, 255]` (uint8),
  `x̂ = code * scale + offset`; so `|x̂ - x| <= scale / 2 =
  (max(row) - min(row)) / 510`. A constant row (`scale = 0`) is exact.

A combined output is a weighted sum of rows divided by a normalizer (1,
the weight sum, or the root of the summed squared weights), so its error
per element is at most `sum_i |w_i| * bound_i / normalizer`: for `"mean"`
with positive weights, the largest bound among the example's rows.

Example:

>>> import numpy as np
>>> table = np.array([[0.0, 1.0, 0.25], [2.0, 2.0, 2.0]], np.float32)
>>> codes, scale_offset = quantize_rows(table, "int8", "t")
>>> codes.dtype.name, codes[0].tolist(), codes[1].tolist()
('uint8', [0, 255, 64], [0, 0, 0])
>>> restored = dequantize_rows(codes, scale_offset)
>>> bool(np.all(np.abs(restored - table) <= error_bound(table, "int8")))
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import Tensor

TABLE_DTYPES = ("float32", "bfloat16", "int8")
"""The `table_dtype` choices of a serving export."""

_INT8_LEVELS = 255


def check_table_dtype(table_dtype: Any) -> str:
    """`table_dtype` if it is one of `TABLE_DTYPES`.

    Raises:
        ValueError: any other value, naming it and the choices.
    """
    if not isinstance(table_dtype, str) or table_dtype not in TABLE_DTYPES:
        raise ValueError(
            f"table_dtype={table_dtype!r} is not supported. Choose one of "
            f"{list(TABLE_DTYPES)}: 'float32' keeps the tables as trained, "
            "'bfloat16' halves them, 'int8' stores one byte per value plus a "
            "float32 scale and offset per row."
        )
    return table_dtype


_CHUNK_BYTES = 32 * 2**20
"""The float64 working copy of one chunk of rows, at most (`chunk_rows`)."""

_MIN_CHUNKS = 16
"""A table is quantized in at least this many chunks (or one row each), so
that the working copies stay a small fraction of any table, small or not."""


def chunk_rows(rows: int, dim: int) -> int:
    """The rows `quantize_rows` quantizes at once for a `[rows, dim]` table.

    A float64 copy of a chunk is at most `_CHUNK_BYTES` (32 MiB) and at most
    1/16 of the float64 table, and at least one row.

    >>> chunk_rows(10**7, 64), chunk_rows(1000, 64), chunk_rows(3, 4)
    (65536, 63, 1)
    """
    by_bytes = _CHUNK_BYTES // (8 * max(dim, 1))
    by_share = -(-rows // _MIN_CHUNKS)
    return max(1, min(rows, by_bytes, by_share))


def quantize_rows(
    values: Any, table_dtype: str, table: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """A float table `[rows, dim]` as stored for serving.

    The rows are read and quantized in chunks of `chunk_rows`, so that only
    one chunk is ever copied (to float64 for "int8"): with `values` a
    variable, quantizing adds the outputs and one chunk's working copies to
    memory, not a float64 copy of the table. Each row is quantized on its
    own, so the chunks give the same bits as the whole table at once.

    Args:
        values: The table: a numpy array, a tensor or a variable (read one
            chunk at a time).
        table_dtype: One of `TABLE_DTYPES`.
        table: The table's name, for errors.

    Returns:
        `(codes, scale_offset)`: for "bfloat16" the rows as bfloat16 and
        None; for "int8" uint8 codes and float32 `[rows, 2]` (scale,
        offset); for "float32" the rows as they are (float32) and None.

    Raises:
        ValueError: an unknown `table_dtype`, non-finite values in
            `table` (a NaN or inf would make its row's scale NaN or inf),
            or finite rows that `table_dtype` would serve as inf (bfloat16
            rounding of |x| >= ~3.39e38; an int8 row spread of float32's
            largest value / 2 or more).
    """
    check_table_dtype(table_dtype)
    if table_dtype == "float32":
        return np.asarray(values, np.float32), None
    rows, dim = (int(n) for n in values.shape)
    step = chunk_rows(rows, dim)
    if table_dtype == "bfloat16":
        codes = np.empty((rows, dim), tf.bfloat16.as_numpy_dtype)
        scale_offset = None
    else:
        codes = np.empty((rows, dim), np.uint8)
        scale_offset = np.empty((rows, 2), np.float32)
    # Every chunk is checked before an error is raised, so that it names
    # the first bad rows of the table, as one whole-table check would.
    non_finite: list[np.ndarray] = []
    overflow: list[np.ndarray] = []
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        chunk = _read_rows(values, start, stop)
        bad = ~np.isfinite(chunk).all(axis=1)
        if bad.any() or non_finite:
            non_finite.append(start + np.flatnonzero(bad))
            continue
        if table_dtype == "bfloat16":
            rounded = tf.cast(chunk, tf.bfloat16).numpy()
            # bfloat16 has float32's range, but rounding to 8 significant
            # bits carries |x| >= ~3.39e38 past its largest value, to inf.
            fits = np.isfinite(rounded).all(axis=1)
            codes[start:stop] = rounded
        else:
            assert scale_offset is not None
            fits = _quantize_int8(
                chunk, codes[start:stop], scale_offset[start:stop]
            )
        overflow.append(start + np.flatnonzero(~fits))
    if non_finite:
        bad_rows = np.concatenate(non_finite)
        raise ValueError(
            f"Table '{table}' holds NaN or inf values (rows "
            f"{bad_rows[:10].tolist()}), which cannot be quantized to "
            f"{table_dtype}. Fix or re-train the table, or export with "
            "table_dtype='float32'."
        )
    _refuse_overflow(
        table, table_dtype, np.concatenate([np.zeros(0, np.int64), *overflow])
    )
    return codes, scale_offset


def _read_rows(values: Any, start: int, stop: int) -> np.ndarray:
    """Rows `[start, stop)` of `values` as a float32 numpy array."""
    if isinstance(values, np.ndarray):
        return np.asarray(values[start:stop], np.float32)
    # A gather, not a slice: a slice reads the whole variable first, and
    # that read copies the whole table once the variable has been gathered
    # from (TF's copy-on-read mode, i.e. after any training step) or
    # assigned a slice, which is the copy this function exists to avoid.
    rows = tf.gather(values, tf.range(start, stop, dtype=tf.int64))
    return np.asarray(rows, np.float32)


def _quantize_int8(
    chunk: np.ndarray, codes: np.ndarray, scale_offset: np.ndarray
) -> np.ndarray:
    """Writes the int8 codes and (scale, offset) of `chunk`'s rows into
    `codes` and `scale_offset`; returns per row whether its spread fits."""
    # float64 keeps the scale and codes exact to well below one level.
    wide = chunk.astype(np.float64)
    low = wide.min(axis=1, keepdims=True)
    spread = wide.max(axis=1, keepdims=True) - low
    # Dequantization, `code * scale + offset` in float32, reaches `spread`
    # before the offset is added unless fused (XLA fuses it, the sparse
    # path does not): a spread beyond float32 would serve inf on one path
    # and finite values on another, for the same id.
    fits: np.ndarray = spread[:, 0] < np.finfo(np.float32).max / 2
    scale = spread / _INT8_LEVELS
    # A constant row has scale 0: every code is 0 and the offset is exact.
    safe = np.where(scale > 0, scale, 1.0)
    # In place on the float64 working copy: the same operations, in the
    # same order, as `np.clip(np.rint((wide - low) / safe), 0, 255)`.
    np.subtract(wide, low, out=wide)
    np.divide(wide, safe, out=wide)
    np.rint(wide, out=wide)
    np.clip(wide, 0, _INT8_LEVELS, out=wide)
    codes[...] = wide
    scale_offset[:, :1] = scale
    scale_offset[:, 1:] = low
    return fits


def _refuse_overflow(table: str, table_dtype: str, rows: np.ndarray) -> None:
    """Raises naming `table`'s `rows` if there are any.

    Raises:
        ValueError: rows `table_dtype` would serve as inf.
    """
    if not len(rows):
        return
    reason = (
        "values of magnitude ~3.39e38 or more, which round to inf in bfloat16"
        if table_dtype == "bfloat16"
        else "a spread (row max - row min) of float32's largest value / 2 "
        "or more, which int8 dequantization would carry to inf"
    )
    raise ValueError(
        f"Table '{table}' has rows {rows[:10].tolist()} "
        f"with {reason}: "
        f"exported as {table_dtype} they would serve inf. Export with "
        "table_dtype='float32', or bring those rows back to a finite range "
        "(`kte.quantization_error` checks a table before exporting)."
    )


def dequantize_rows(codes: Any, scale_offset: Any) -> Any:
    """Rows as float32 from `quantize_rows`' output (numpy or tensors)."""
    if scale_offset is None:
        return tf.cast(codes, tf.float32)
    return (
        tf.cast(codes, tf.float32) * scale_offset[..., :1]
        + scale_offset[..., 1:]
    )


def error_bound(values: np.ndarray, table_dtype: str) -> np.ndarray:
    """Per element, the largest `|x̂ - x|` the scheme allows (see above)."""
    check_table_dtype(table_dtype)
    values = np.asarray(values, np.float64)
    if table_dtype == "float32":
        return np.zeros_like(values)
    if table_dtype == "bfloat16":
        return np.asarray(np.abs(values) * 2.0**-8)
    spread = values.max(axis=1, keepdims=True) - values.min(
        axis=1, keepdims=True
    )
    return np.broadcast_to(spread / (2 * _INT8_LEVELS), values.shape)


class QuantizedTable(tf.Module):  # type: ignore[misc]
    """A serving table stored as `quantize_rows` gives it; `gather` returns
    float32 rows.

    The codes of a row are stored packed into 8-byte (or 4-byte) words when
    the row's bytes allow it: a gather then moves 8 words of a 64-dim int8
    row instead of 64 single bytes. Measured on CPU under XLA, a gather of
    one-byte elements ran slower than the float32 gather of the same rows;
    unpacking (`tf.bitcast`) is free, so the answer is the same bits.

    Args:
        values: The float32 table `[rows, dim]`: an array, a tensor or a
            variable (read a chunk of rows at a time, `quantize_rows`).
        table_dtype: "bfloat16" or "int8".
        name: The table's name (in errors and variable names).
    """

    def __init__(self, values: Any, table_dtype: str, name: str):
        super().__init__(name=f"{name}_{table_dtype}")
        codes, scale_offset = quantize_rows(values, table_dtype, name)
        self.table_dtype = table_dtype
        self._code_dtype = tf.as_dtype(codes.dtype)
        self._dimension = int(codes.shape[1])
        self.codes = tf.Variable(
            packed_words(codes), trainable=False, name=f"{name}_{table_dtype}"
        )
        self.scale_offset = (
            None
            if scale_offset is None
            else tf.Variable(
                scale_offset, trainable=False, name=f"{name}_scale_offset"
            )
        )

    @property
    def shape(self) -> Any:
        """The table's logical shape, `[rows, dim]`."""
        return tf.TensorShape([self.codes.shape[0], self._dimension])

    def gather(self, ids: Tensor) -> Tensor:
        """float32 rows for `ids` (any shape): `[*ids.shape, dim]`."""
        words = tf.gather(self.codes, ids)
        codes = words
        if words.dtype != self._code_dtype:
            codes = tf.reshape(
                tf.bitcast(words, self._code_dtype),
                tf.concat([tf.shape(ids), [self._dimension]], axis=0),
            )
        if self.scale_offset is None:
            return tf.cast(codes, tf.float32)
        return dequantize_rows(codes, tf.gather(self.scale_offset, ids))


def quantized_copies(
    tables: dict[str, tf.Variable], table_dtype: str
) -> dict[str, QuantizedTable]:
    """`QuantizedTable` copies of float32 `tables` (by name); none for
    `"float32"`, which serves the tables themselves.

    Each copy is made of new variables: the tables are read, not changed,
    and a serving graph that reads the copies holds no float32 table.
    """
    if check_table_dtype(table_dtype) == "float32":
        return {}
    # The TF variable itself, not `.numpy()`: `quantize_rows` gathers it a
    # chunk of rows at a time, so no float copy of a whole table is made.
    return {
        name: QuantizedTable(variable.value, table_dtype, name)
        for name, variable in tables.items()
    }


def packed_words(codes: np.ndarray) -> np.ndarray:
    """`codes` `[rows, dim]` as `[rows, words]` of int64 (or int32) holding
    the same bytes, or unchanged when a row's bytes fill no whole word."""
    row_bytes = codes.shape[1] * codes.dtype.itemsize
    for word in (np.int64, np.int32):
        if row_bytes % np.dtype(word).itemsize == 0:
            return np.ascontiguousarray(codes).view(word)
    return codes


def gather(table: tf.Variable | QuantizedTable, ids: Tensor) -> Tensor:
    """Rows of a float table or a `QuantizedTable`, as float32."""
    if isinstance(table, QuantizedTable):
        return table.gather(ids)
    return tf.gather(table, ids)
