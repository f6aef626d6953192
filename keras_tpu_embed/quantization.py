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


def quantize_rows(
    values: np.ndarray, table_dtype: str, table: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """A float table `[rows, dim]` as stored for serving.

    Returns:
        `(codes, scale_offset)`: for "bfloat16" the rows as bfloat16 and
        None; for "int8" uint8 codes and float32 `[rows, 2]` (scale,
        offset); for "float32" the rows as they are and None.

    Raises:
        ValueError: an unknown `table_dtype`, non-finite values in
            `table` (a NaN or inf would make its row's scale NaN or inf),
            or finite rows that `table_dtype` would serve as inf (bfloat16
            rounding of |x| >= ~3.39e38; an int8 row spread of float32's
            largest value / 2 or more).
    """
    check_table_dtype(table_dtype)
    values = np.asarray(values, np.float32)
    if table_dtype == "float32":
        return values, None
    finite = np.isfinite(values)
    if not finite.all():
        rows = np.flatnonzero(~finite.all(axis=1))
        raise ValueError(
            f"Table '{table}' holds NaN or inf values (rows "
            f"{rows[:10].tolist()}), which cannot be quantized to "
            f"{table_dtype}. Fix or re-train the table, or export with "
            "table_dtype='float32'."
        )
    if table_dtype == "bfloat16":
        rounded = tf.cast(values, tf.bfloat16).numpy()
        # bfloat16 has float32's range, but rounding to 8 significant bits
        # carries |x| >= ~3.39e38 past its largest value, to inf.
        _refuse_overflow(table, table_dtype, np.isfinite(rounded))
        return rounded, None
    # float64 keeps the scale and codes exact to well below one level.
    wide = values.astype(np.float64)
    low = wide.min(axis=1, keepdims=True)
    spread = wide.max(axis=1, keepdims=True) - low
    # Dequantization, `code * scale + offset` in float32, reaches `spread`
    # before the offset is added unless fused (XLA fuses it, the sparse
    # path does not): a spread beyond float32 would serve inf on one path
    # and finite values on another, for the same id.
    _refuse_overflow(table, table_dtype, spread < np.finfo(np.float32).max / 2)
    scale = spread / _INT8_LEVELS
    # A constant row has scale 0: every code is 0 and the offset is exact.
    safe = np.where(scale > 0, scale, 1.0)
    codes = np.clip(np.rint((wide - low) / safe), 0, _INT8_LEVELS)
    scale_offset = np.concatenate([scale, low], axis=1).astype(np.float32)
    return codes.astype(np.uint8), scale_offset


def _refuse_overflow(table: str, table_dtype: str, finite: np.ndarray) -> None:
    """Raises naming `table`'s rows whose `finite` entries are not all true.

    Raises:
        ValueError: a row `table_dtype` would serve as inf.
    """
    if finite.all():
        return
    rows = np.flatnonzero(~finite.reshape(finite.shape[0], -1).all(axis=1))
    reason = (
        "values of magnitude ~3.39e38 or more, which round to inf in bfloat16"
        if table_dtype == "bfloat16"
        else "a spread (row max - row min) of float32's largest value / 2 "
        "or more, which int8 dequantization would carry to inf"
    )
    raise ValueError(
        f"Table '{table}' has rows {rows[:10].tolist()} with {reason}: "
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
        values: The float32 table `[rows, dim]`.
        table_dtype: "bfloat16" or "int8".
        name: The table's name (in errors and variable names).
    """

    def __init__(self, values: np.ndarray, table_dtype: str, name: str):
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


def packed_words(codes: np.ndarray) -> np.ndarray:
    """`codes` `[rows, dim]` as `[rows, words]` of int64 (or int32) holding
    the same bytes, or unchanged when a row's bytes fill no whole word."""
    row_bytes = codes.shape[1] * codes.dtype.itemsize
    for word in (np.int64, np.int32):
        if row_bytes % np.dtype(word).itemsize == 0:
            return np.ascontiguousarray(codes).view(word)
    return codes


def gather(table: Any, ids: Tensor) -> Tensor:
    """Rows of a float table or a `QuantizedTable`, as float32."""
    if isinstance(table, QuantizedTable):
        return table.gather(ids)
    return tf.gather(table, ids)
