"""Initializing large tables without a second copy in memory.

Measured here: a `[10^7, 64]` float32 table (2.5 GB) initialized with a
truncated normal costs 5.1 GB of resident memory when the initializer runs
in one piece, because its full-size intermediates stay in TensorFlow's CPU
allocator. Filling the table a block of rows at a time keeps the overhead to
one block. That is only sound for initializers whose values do not depend on
the shape they are asked for and that draw fresh random numbers per call:
the element-wise Keras distributions without a seed. Every other initializer
runs in one piece.

Everything here runs eagerly, outside any graph being traced: a
`tf.function` made per table is traced once per table and makes TensorFlow
log "triggered tf.function retracing" on every build with a few tables.
Inside Keras' symbolic build of a subclassed model the variable does not
exist yet (Keras creates it later, outside the trace), so the table is then
initialized in one piece by Keras itself; the block fill needs a real
variable to write into.
"""

from __future__ import annotations

import os
from typing import Any

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import keras_in_stateless_scope
from keras_tpu_embed._compat import tf

BLOCK_BYTES = 64 * 2**20
"""Size of one block of rows filled at a time."""

_ELEMENTWISE_RANDOM = (
    keras.initializers.TruncatedNormal,
    keras.initializers.RandomNormal,
    keras.initializers.RandomUniform,
)
_ELEMENTWISE_CONSTANT = (
    keras.initializers.Constant,
    keras.initializers.Ones,
)


def fills_by_blocks(initializer: Any) -> bool:
    """Whether `initializer` may be applied one block of rows at a time."""
    if type(initializer) in _ELEMENTWISE_CONSTANT:
        return True
    return (
        type(initializer) in _ELEMENTWISE_RANDOM
        and getattr(initializer, "seed", None) is None
    )


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
    initializer: Any,
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


def _is_zero(initializer: Any) -> bool:
    return type(initializer) is keras.initializers.Zeros or (
        type(initializer) is keras.initializers.Constant
        and initializer.value == 0
    )


def fill_by_blocks(variable: Any, initializer: Any) -> None:
    """Overwrites a rank-2 `variable` block by block with `initializer`."""
    with tf.init_scope():
        target = variable.value if hasattr(variable, "value") else variable
        rows, dim = (int(d) for d in target.shape)
        block = max(1, BLOCK_BYTES // (max(dim, 1) * target.dtype.size))
        for start in range(0, rows, block):
            size = min(block, rows - start)
            values = initializer((size, dim), dtype=target.dtype.name)
            # A scatter writes in place; a sliced assign copied the table.
            target.scatter_update(
                tf.IndexedSlices(values, tf.range(start, start + size))
            )
