"""The SparseCore ops of `TPUEmbeddingV2`, as CPU kernels.

`tf.tpu.experimental.embedding.TPUEmbeddingV2` (TF's
`tpu_embedding_v3.py`) talks to SparseCore through ops of
`tensorflow.python.tpu.ops.gen_xla_ops`, looked up by name at each call.
tensorflow-cpu registers no kernel for any of them, so they are "the chip":
`EmulatedSparseCore.install` replaces exactly those names while
`emulated_tpu(embedding_feature="V2")` is active. Every line of
`TPUEmbeddingV2` around them is TensorFlow's own: the table stacking
(`_stack_tables_with_same_table_dim_and_optimizer` and the C++ layout
stacker), the sharded variables and their initialization, the order and
arguments of the preprocessing ops (`_preprocess_features`), the
reshapes and slices that unstack activations and stack gradients, and the
optimizer hyperparameters that `apply_gradients` passes.

The replaced ops and what they do here (the semantics of TF's own host
kernels in `tensorflow/core/tpu/kernels/sparse_core_preprocess_ops.cc`
and of the per-row optimizer computations in `sparse_core_xla_ops.cc`,
re-implemented; the formats between the ops are TF's):

- `convert_to_list_of_sparse_core_coo_tensors`: one feature's ids
  (dense, `SparseTensor` indices or `RaggedTensor` row splits) to COO
  triples, one list per SparseCore of the chip. Gains carry the combiner
  (`sum`, `mean`, `sqrtn`) so that the lookup is always a weighted sum;
  sample `i` goes to SparseCore `i // (sample_count / num_sc_per_chip)`
  and to row `i % per_sc + row_offset / num_sc_per_chip + sc *
  stacked_sample_count / num_sc_per_chip` of the stacked activation;
  id `c` of a table goes to column
  `((c + col_shift) % N) + (c - c % N) + col_offset` of the stacked
  table, N the number of SparseCores of the system (`num_sc_shards`).
- `sort_list_of_sparse_core_coo_tensors`: concatenates the features of
  one stacked table, sorts by column, merges repeated (row, column)
  pairs, and groups the ids by the SparseCore that holds their row
  (column `% N`), each keeping its row within that shard (column `// N`);
  more than `max_ids_per_sparse_core` ids or
  `max_unique_ids_per_sparse_core` distinct rows bound for one SparseCore
  fail, as on the chip.
- `convert_to_sparse_core_csr_wrapped_coo_tensor`: packs the sorted ids
  of every SparseCore of the chip into the static buffers of the step
  (`max_ids_per_chip_per_sample * sample_count` entries), one row pointer
  per destination SparseCore, each segment padded to 8; ids past the
  buffer fail, or are dropped when `allow_id_dropping`.
- `get_stats_from_list_of_sparse_core_coo_tensors`: the two maxima above.
- `tpu_copy_with_dynamic_shape`, `tpu_annotate_tensors_with_dynamic_shape`:
  the buffers cut to their unpadded sizes, then unchanged.
- `xla_sparse_dense_matmul_with_static_buffer_size`: the lookup. Row
  `r` of a stacked table lives on SparseCore `r % N` at position
  `r // N`; chip `k` holds SparseCores `k * num_sc_per_chip ...` one
  after the other (`TPUEmbeddingV2._initialize_stacked_table_for_device`,
  TF's `tpu_embedding_v3_utils.map_indices_in_shard`, and keras-rs'
  `_sparsecore_get_embedding_tables` read the layout the same way). Every
  chip reads the rows it needs from every chip's shard, as SparseCores do
  over the interconnect.
- `xla_sparse_dense_matmul_grad_with_{sgd,adagrad,adagrad_momentum,adam,
  ftrl}_and_static_buffer_size`: the gradient of every id of every chip is
  sent to the SparseCore holding its row; the gradients of one row are
  summed over the global batch, and the optimizer updates each row that
  received ids once (lazily: rows without ids keep their slots), then
  each chip gets its own shard back. The per-row rules are those of
  `sparse_core_xla_ops.cc`: Adam has no bias correction; FTRL is
  FTRL-Proximal with `beta`.

Not emulated (each fails with an error that says so): minibatching (TF's
Python never asks for it), quantization, custom combiners. Where the
chip's exact numerics are unknown, e.g. the `mean` combiner of a sample
whose weights sum to 0 (here 0), the code says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable

import numpy as np
import numpy.typing as npt

from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_distribute_lib as distribute_lib
from keras_tpu_embed._compat import tf_gen_xla_ops as gen_xla_ops
from keras_tpu_embed.types import Tensor

Array = npt.NDArray[Any]

# What the host kernels write into the unused tail of a padded segment
# (`kXlaPadValue`); the chip never reads it, and neither do we.
PAD_VALUE = np.iinfo(np.int32).max
# Segments and row pointers are padded to this many entries (the host
# kernels' `xla_pad_size`).
_PAD = 8


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


class SparseCoreError(ValueError):
    """An input the SparseCore kernels refuse, as the chip's ops do."""


# ----------------------------------------------------------- host kernels


def coo_from_feature(
    indices_or_row_splits: Array,
    values: Array,
    weights: Array,
    *,
    sample_count: int,
    num_sc_per_chip: int,
    row_offset: int,
    col_offset: int,
    col_shift: int,
    num_sc_shards: int,
    stacked_table_sample_count: int,
    combiner: str,
) -> list[tuple[Array, Array, Array]]:
    """`ConvertToListOfSparseCoreCooTensors`: per SparseCore (rows, cols,
    gains) of one feature."""
    if not _is_power_of_two(num_sc_shards):
        raise SparseCoreError(
            f"num_sc_shards {num_sc_shards} is not a power of two."
        )
    if sample_count % num_sc_per_chip:
        raise SparseCoreError(
            f"sample_count {sample_count} is not divisible by the "
            f"{num_sc_per_chip} SparseCores per chip."
        )
    if combiner not in ("sum", "mean", "sqrtn"):
        raise SparseCoreError(
            f"combiner {combiner!r} is not one of 'sum', 'mean', 'sqrtn'."
        )
    values = values.reshape(-1).astype(np.int64)
    count = values.shape[0]
    if weights.ndim == 0:
        weights = np.full([count], weights, np.float32)
    elif weights.shape != (count,):
        raise SparseCoreError(
            f"{count} values but {weights.shape[0]} weights were given."
        )
    if np.any(values < 0):
        raise SparseCoreError(
            f"a negative id {int(values.min())} was fed to the SparseCore."
        )
    positions = indices_or_row_splits
    if positions.ndim == 1 and positions.size == 0:
        if count not in (0, sample_count):
            raise SparseCoreError(
                f"a dense input has {count} values for {sample_count} samples."
            )
        rows = np.arange(count, dtype=np.int64)
    elif positions.ndim == 2:
        rows = positions[:, 0].astype(np.int64)
        if np.any(np.diff(rows) < 0):
            raise SparseCoreError(
                "the indices of a SparseTensor input are not sorted."
            )
        if count and rows.max() >= sample_count:
            raise SparseCoreError(
                f"a SparseTensor row {int(rows.max())} is >= the sample "
                f"count {sample_count}."
            )
    elif positions.ndim == 1:
        if positions.size != sample_count + 1:
            raise SparseCoreError(
                f"a RaggedTensor input has {positions.size} row splits for "
                f"{sample_count} samples."
            )
        rows = np.repeat(
            np.arange(sample_count, dtype=np.int64), np.diff(positions)
        )
    else:
        raise SparseCoreError(
            f"indices_or_row_splits of rank {positions.ndim} is invalid."
        )
    gains = weights.astype(np.float32)
    scale = np.ones([sample_count], np.float32)
    if combiner != "sum":
        contribution = gains if combiner == "mean" else gains * gains
        total = np.zeros([sample_count], np.float32)
        np.add.at(total, rows, contribution)
        if combiner == "sqrtn":
            total = np.sqrt(total)
        # A sample whose weights sum to 0: the chip's rule is not
        # documented; here its ids get gain 0.
        scale = np.divide(
            1.0, total, out=np.zeros_like(total), where=total != 0
        )
    # Adjacent repeats of one id in one sample merge into one COO entry.
    keep = np.ones([count], bool)
    if count:
        keep[1:] = (rows[1:] != rows[:-1]) | (values[1:] != values[:-1])
    group = np.cumsum(keep) - 1
    merged = np.zeros([int(keep.sum())], np.float32)
    np.add.at(merged, group, gains)
    rows, values = rows[keep], values[keep]
    gains = merged * scale[rows]
    per_sc = sample_count // num_sc_per_chip
    sc_of_row = rows // per_sc
    mod = num_sc_shards - 1
    cols = ((values + col_shift) & mod) + (values & ~mod) + col_offset
    out_rows = (
        rows % per_sc
        + row_offset // num_sc_per_chip
        + (stacked_table_sample_count // num_sc_per_chip) * sc_of_row
    )
    return [
        (
            out_rows[sc_of_row == sc].astype(np.int32),
            cols[sc_of_row == sc].astype(np.int32),
            gains[sc_of_row == sc].astype(np.float32),
        )
        for sc in range(num_sc_per_chip)
    ]


@dataclasses.dataclass
class SortedCoo:
    rows: Array
    cols: Array
    gains: Array
    id_counts: Array
    max_ids: int
    max_unique_ids: int


def sort_coo(
    rows_list: list[Array],
    cols_list: list[Array],
    gains_list: list[Array],
    *,
    sample_count_list: list[int],
    col_offset_list: list[int],
    num_replica: int,
    num_sc_per_chip: int,
    table_vocab_size: int,
    max_ids_per_sparse_core: int | None,
    max_unique_ids_per_sparse_core: int | None,
    table_name: str,
) -> SortedCoo:
    """`SortListOfSparseCoreCooTensors` (and its statistics) for one
    SparseCore of the chip."""
    shards = num_replica * num_sc_per_chip
    if not _is_power_of_two(shards):
        raise SparseCoreError(
            f"{shards} SparseCores in the system: expected a power of two."
        )
    shard_bits = shards.bit_length() - 1
    per_sc_batch = sum(sample_count_list)
    # Features of one table share its column offset; each offset's table
    # ends where the next table of the stack starts.
    offsets = sorted(set(col_offset_list))
    ends = dict(zip(offsets, offsets[1:] + [table_vocab_size]))
    groups: list[tuple[Array, Array, Array]] = []
    for offset in offsets:
        members = [i for i, o in enumerate(col_offset_list) if o == offset]
        rows = np.concatenate([rows_list[i] for i in members]).astype(np.int64)
        cols = np.concatenate([cols_list[i] for i in members]).astype(np.int64)
        gains = np.concatenate([gains_list[i] for i in members])
        outside = (cols < offset) | (cols >= ends[offset])
        if np.any(outside):
            raise SparseCoreError(
                f"table {table_name!r}: an id outside its table reached the "
                "SparseCore (stacked row "
                f"{int(cols[outside][0])} is not in [{offset}, "
                f"{ends[offset]})); the chip would read another table's row."
            )
        order = np.argsort(cols, kind="stable")
        rows, cols, gains = rows[order], cols[order], gains[order]
        first = np.ones([cols.size], bool)
        first[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
        group_of = np.cumsum(first) - 1
        merged = np.zeros([int(first.sum())], np.float32)
        np.add.at(merged, group_of, gains)
        groups.append((rows[first], cols[first], merged))
    all_cols = (
        np.concatenate([g[1] for g in groups]) if groups else np.zeros([0])
    ).astype(np.int64)
    destination = all_cols & (shards - 1)
    id_count = np.bincount(destination, minlength=shards)
    unique_count = np.zeros([shards], np.int64)
    for _, cols, _ in groups:
        distinct = np.unique(cols)
        unique_count += np.bincount(distinct & (shards - 1), minlength=shards)
    for shard in range(shards):
        if (
            max_ids_per_sparse_core is not None
            and id_count[shard] > max_ids_per_sparse_core
        ):
            raise SparseCoreError(
                f"Sparse core {shard} gets {id_count[shard]} ids while the "
                f"max ids per sparse core is set to be "
                f"{max_ids_per_sparse_core} for table {table_name}. Raise "
                "SparseCoreEmbeddingConfig(max_ids_per_table=...)."
            )
        if (
            max_unique_ids_per_sparse_core is not None
            and unique_count[shard] > max_unique_ids_per_sparse_core
        ):
            raise SparseCoreError(
                f"Sparse core {shard} gets {unique_count[shard]} unique ids "
                "while the max unique ids per sparse core is set to be "
                f"{max_unique_ids_per_sparse_core} for table {table_name}. "
                "Raise SparseCoreEmbeddingConfig(max_unique_ids_per_table="
                "...)."
            )
    all_rows = np.concatenate([g[0] for g in groups]) if groups else all_cols
    all_gains = (
        np.concatenate([g[2] for g in groups])
        if groups
        else np.zeros([0], np.float32)
    )
    order = np.argsort(destination, kind="stable")
    id_counts = np.concatenate([[0], np.cumsum(id_count)]).astype(np.int32)
    return SortedCoo(
        rows=(all_rows[order] % max(per_sc_batch, 1)).astype(np.int32),
        cols=(all_cols[order] >> shard_bits).astype(np.int32),
        gains=all_gains[order].astype(np.float32),
        id_counts=id_counts,
        max_ids=int(id_count.max()) if shards else 0,
        max_unique_ids=int(unique_count.max()) if shards else 0,
    )


def csr_wrap(
    rows_list: list[Array],
    cols_list: list[Array],
    gains_list: list[Array],
    id_counts_list: list[Array],
    *,
    sample_count_per_sc: int,
    num_replica: int,
    num_sc_per_chip: int,
    max_minibatches_per_sc: int,
    max_ids_per_chip_per_sample: int,
    allow_id_dropping: bool,
    table_name: str,
) -> tuple[Array, ...]:
    """`ConvertToSparseCoreCsrWrappedCooTensor` without minibatching."""
    shards = num_replica * num_sc_per_chip
    max_ids = max_ids_per_chip_per_sample * sample_count_per_sc
    max_ids *= num_sc_per_chip
    if max_ids % _PAD:
        raise SparseCoreError(
            f"The max_ids_per_chip is set to be {max_ids} which is not "
            f"divisible by the xla_pad_size {_PAD}."
        )
    pointers_per_sc = _round_up(shards, _PAD)
    row_pointers = np.zeros(
        [max_minibatches_per_sc * num_sc_per_chip * pointers_per_sc], np.int32
    )
    sample_ids = np.full([max_ids], PAD_VALUE, np.int32)
    token_ids = np.full([max_ids], PAD_VALUE, np.int32)
    gains = np.full([max_ids], float(PAD_VALUE), np.float32)
    total = sum(int(c[-1]) for c in id_counts_list)
    packed = 0
    position = 0
    pointer = 0
    for sc in range(num_sc_per_chip):
        counts = id_counts_list[sc]
        if counts.size != shards + 1:
            raise SparseCoreError(
                f"id counts of {counts.size} entries for {shards} "
                "SparseCores: minibatching is not emulated."
            )
        for shard in range(shards):
            start, end = int(counts[shard]), int(counts[shard + 1])
            take = end - start
            if position + take > max_ids:
                if not allow_id_dropping:
                    raise SparseCoreError(
                        f"The max_ids_per_chip is set to be {max_ids} which "
                        "is not going to fit all ids. The remaining id "
                        f"count is {total - packed} (table {table_name}). "
                        "Raise SparseCoreEmbeddingConfig("
                        "max_ids_per_chip_per_sample=...) or set "
                        "allow_id_dropping=True."
                    )
                take = max_ids - position
            span = slice(position, position + take)
            token_ids[span] = cols_list[sc][start : start + take]
            sample_ids[span] = rows_list[sc][start : start + take]
            gains[span] = gains_list[sc][start : start + take]
            position += take
            packed += take
            row_pointers[pointer] = position
            pointer += 1
            position = min(_round_up(position, _PAD), max_ids)
        padded = _round_up(pointer, _PAD)
        row_pointers[pointer:padded] = position
        pointer = padded
    if packed < total:
        tf.get_logger().warning(
            "emulated SparseCore: table %s drops %d ids that do not fit the "
            "static buffer of %d ids.",
            table_name,
            total - packed,
            max_ids,
        )
    row_pointers[pointer:] = position
    return (
        row_pointers,
        sample_ids,
        token_ids,
        gains,
        np.array(num_sc_per_chip * pointers_per_sc, np.int32),
        np.array(position, np.int32),
        np.array(1, np.int32),  # minibatches per SparseCore
    )


def decode_csr(
    row_pointers: Array,
    sample_ids: Array,
    token_ids: Array,
    gains: Array,
    *,
    num_sc_per_chip: int,
    num_sc_shards: int,
    per_sc_samples: int,
    rows_per_shard: int,
) -> tuple[Array, Array, Array]:
    """The chip's reading of the buffers: for every id, its activation row
    on this chip, its row in the stacked table (shard-major: the chips'
    shards one after the other) and its gain."""
    pointers_per_sc = _round_up(num_sc_shards, _PAD)
    if row_pointers.size < num_sc_per_chip * pointers_per_sc:
        raise SparseCoreError(
            f"{row_pointers.size} row pointers for {num_sc_per_chip} "
            f"SparseCores of {num_sc_shards} shards."
        )
    act_rows, table_rows, out_gains = [], [], []
    end = 0
    for sc in range(num_sc_per_chip):
        for shard in range(num_sc_shards):
            start = _round_up(end, _PAD) if (sc, shard) != (0, 0) else 0
            end = int(row_pointers[sc * pointers_per_sc + shard])
            if end < start or end > token_ids.size:
                raise SparseCoreError(
                    f"row pointer {end} out of order (segment starts at "
                    f"{start}, {token_ids.size} ids)."
                )
            tokens = token_ids[start:end].astype(np.int64)
            samples = sample_ids[start:end].astype(np.int64)
            if np.any(tokens >= rows_per_shard) or np.any(
                samples >= per_sc_samples
            ):
                raise SparseCoreError(
                    "an id or sample outside the shard reached the SparseCore."
                )
            act_rows.append(sc * per_sc_samples + samples)
            table_rows.append(shard * rows_per_shard + tokens)
            out_gains.append(gains[start:end])
    return (
        np.concatenate(act_rows).astype(np.int64),
        np.concatenate(table_rows).astype(np.int64),
        np.concatenate(out_gains).astype(np.float32),
    )


# -------------------------------------------------------- optimizer rows


def _clip(table: Tensor, low: float, high: float) -> Tensor:
    return tf.clip_by_value(table, low, high)


def _sgd(
    gradient: Tensor, slots: list[Tensor], rate: Tensor, hp: dict[str, Any]
) -> list[Tensor]:
    return [slots[0] - rate * gradient]


def _adagrad(
    gradient: Tensor, slots: list[Tensor], rate: Tensor, hp: dict[str, Any]
) -> list[Tensor]:
    table, accumulator = slots
    accumulator = accumulator + gradient * gradient
    return [table - rate * gradient / tf.sqrt(accumulator), accumulator]


def _adagrad_momentum(
    gradient: Tensor, slots: list[Tensor], rate: Tensor, hp: dict[str, Any]
) -> list[Tensor]:
    table, accumulator, momenta = slots
    beta1, beta2 = hp["beta1"], hp["beta2"]
    if beta2 == 1.0:
        accumulator = accumulator + gradient * gradient
    else:
        accumulator = beta2 * accumulator + (1.0 - beta2) * gradient**2
    scaled = tf.pow(accumulator + hp["epsilon"], -1.0 / hp["exponent"])
    scaled = scaled * gradient
    momenta = beta1 * momenta + scaled
    if hp["use_nesterov"]:
        table = table - rate * (beta1 * momenta + scaled)
    else:
        table = table - rate * momenta
    return [table, accumulator, momenta]


def _adam(
    gradient: Tensor, slots: list[Tensor], rate: Tensor, hp: dict[str, Any]
) -> list[Tensor]:
    table, momenta, velocity = slots
    beta1, beta2, epsilon = hp["beta1"], hp["beta2"], hp["epsilon"]
    momenta = beta1 * momenta + (1.0 - beta1) * gradient
    velocity = beta2 * velocity + (1.0 - beta2) * gradient * gradient
    if hp["use_sum_inside_sqrt"]:
        denominator = tf.sqrt(velocity + epsilon * epsilon)
    else:
        denominator = tf.sqrt(velocity) + epsilon
    return [table - rate * momenta / denominator, momenta, velocity]


def _ftrl(
    gradient: Tensor, slots: list[Tensor], rate: Tensor, hp: dict[str, Any]
) -> list[Tensor]:
    table, accumulator, linear = slots
    power = hp["learning_rate_power"]
    l1 = hp["l1_regularization_strength"]
    l2 = hp["l2_regularization_strength"]
    beta = hp["beta"]
    new_accumulator = accumulator + gradient * gradient
    delta = tf.pow(new_accumulator, -power) - tf.pow(accumulator, -power)
    if hp["multiply_linear_by_learning_rate"]:
        linear = linear + rate * gradient - delta * table
        bound = rate * l1
        denominator = tf.pow(new_accumulator, -power) + 2 * rate * l2 + beta
    else:
        linear = linear + gradient - delta * table / rate
        bound = tf.constant(l1, tf.float32)
        denominator = (tf.pow(new_accumulator, -power) + beta) / rate + 2 * l2
    numerator = tf.clip_by_value(linear, -bound, bound) - linear
    return [numerator / denominator, new_accumulator, linear]


_OPTIMIZERS: dict[str, tuple[Callable[..., list[Tensor]], tuple[str, ...]]] = {
    "sgd": (_sgd, ()),
    "adagrad": (_adagrad, ("accumulator",)),
    "adagrad_momentum": (_adagrad_momentum, ("accumulator", "momenta")),
    "adam": (_adam, ("momenta", "velocity")),
    "ftrl": (_ftrl, ("accumulator", "linear")),
}


# ------------------------------------------------------------------ chip


def _replica() -> tuple[Any, int, int]:
    context = distribute_lib.get_replica_context()
    if context is None:
        return None, 0, 1
    return (
        context,
        int(getattr(context, "_replica_id_in_sync_group", 0)),
        context.num_replicas_in_sync,
    )


def _num_sc_per_chip() -> int:
    strategy = tf.distribute.get_strategy()
    hardware = strategy.extended.tpu_hardware_feature
    return int(hardware.num_embedding_devices_per_chip)


def _local_value(value: Any) -> Tensor:
    """This chip's shard: TF passes the sharded variable to the lookup."""
    return tf.convert_to_tensor(value)


class EmulatedSparseCore:
    """The SparseCores of one emulated TPU system."""

    def __init__(self) -> None:
        self.lookups = 0
        self.updates = 0

    def install(self) -> Callable[[], None]:
        """Replaces TF's SparseCore ops with this chip's; returns the undo."""
        replaced: dict[str, Any] = {
            "convert_to_list_of_sparse_core_coo_tensors": self.convert_to_coo,
            "sort_list_of_sparse_core_coo_tensors": self.sort_coo,
            "get_stats_from_list_of_sparse_core_coo_tensors": self.coo_stats,
            "convert_to_sparse_core_csr_wrapped_coo_tensor": self.csr_wrap,
            "tpu_copy_with_dynamic_shape": self.copy_with_dynamic_shape,
            "tpu_annotate_tensors_with_dynamic_shape": self.annotate,
            "xla_sparse_dense_matmul_with_static_buffer_size": self.lookup,
        }
        for kind in _OPTIMIZERS:
            replaced[
                f"xla_sparse_dense_matmul_grad_with_{kind}_and_static_buffer_size"
            ] = self._updater(kind)
        saved = {name: getattr(gen_xla_ops, name) for name in replaced}
        for name, op in replaced.items():
            setattr(gen_xla_ops, name, op)

        def undo() -> None:
            for name, op in saved.items():
                setattr(gen_xla_ops, name, op)

        return undo

    # ------------------------------------------------------------ host

    def convert_to_coo(
        self,
        indices_or_row_splits: Tensor,
        values: Tensor,
        weights: Tensor,
        sample_count: int,
        num_sc_per_chip: int,
        row_offset: int,
        col_offset: int,
        col_shift: int,
        num_sc_shards: int,
        stacked_table_sample_count: int,
        combiner: str,
        name: str | None = None,
    ) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        def kernel(*arrays: Array) -> list[Array]:
            per_sc = coo_from_feature(
                *arrays,
                sample_count=sample_count,
                num_sc_per_chip=num_sc_per_chip,
                row_offset=row_offset,
                col_offset=col_offset,
                col_shift=col_shift,
                num_sc_shards=num_sc_shards,
                stacked_table_sample_count=stacked_table_sample_count,
                combiner=combiner,
            )
            return [a for part in zip(*per_sc) for a in part]

        outputs = tf.numpy_function(
            kernel,
            [indices_or_row_splits, values, weights],
            [tf.int32] * (2 * num_sc_per_chip) + [tf.float32] * num_sc_per_chip,
            stateful=False,
        )
        for output in outputs:
            output.set_shape([None])
        s = num_sc_per_chip
        return (
            list(outputs[:s]),
            list(outputs[s : 2 * s]),
            list(outputs[2 * s :]),
        )

    def _sort(
        self,
        row_ids_list: list[Tensor],
        col_ids_list: list[Tensor],
        gains_list: list[Tensor],
        stats: bool,
        **attrs: Any,
    ) -> list[Tensor]:
        count = len(row_ids_list)

        def kernel(*arrays: Array) -> list[Array]:
            sorted_coo = sort_coo(
                list(arrays[:count]),
                list(arrays[count : 2 * count]),
                list(arrays[2 * count :]),
                **attrs,
            )
            if stats:
                return [
                    np.array(sorted_coo.max_ids, np.int32),
                    np.array(sorted_coo.max_unique_ids, np.int32),
                ]
            return [
                sorted_coo.rows,
                sorted_coo.cols,
                sorted_coo.gains,
                sorted_coo.id_counts,
            ]

        types = (
            [tf.int32] * 2 if stats else [tf.int32] * 2 + [tf.float32, tf.int32]
        )
        outputs = tf.numpy_function(
            kernel,
            list(row_ids_list) + list(col_ids_list) + list(gains_list),
            types,
            stateful=False,
        )
        shapes: list[list[int | None]] = (
            [[], []] if stats else [[None], [None], [None], [None]]
        )
        for output, shape in zip(outputs, shapes):
            output.set_shape(shape)
        return list(outputs)

    def sort_coo(
        self,
        row_ids_list: list[Tensor],
        col_ids_list: list[Tensor],
        gains_list: list[Tensor],
        sample_count_list: list[int],
        col_offset_list: list[int],
        num_replica: int,
        table_vocab_size: int,
        feature_width: int,
        num_sc_per_chip: int,
        max_ids_per_sparse_core: int,
        max_unique_ids_per_sparse_core: int,
        table_name: str,
        name: str | None = None,
    ) -> list[Tensor]:
        return self._sort(
            row_ids_list,
            col_ids_list,
            gains_list,
            stats=False,
            sample_count_list=list(sample_count_list),
            col_offset_list=list(col_offset_list),
            num_replica=num_replica,
            num_sc_per_chip=num_sc_per_chip,
            table_vocab_size=table_vocab_size,
            max_ids_per_sparse_core=max_ids_per_sparse_core,
            max_unique_ids_per_sparse_core=max_unique_ids_per_sparse_core,
            table_name=table_name,
        )

    def coo_stats(
        self,
        row_ids_list: list[Tensor],
        col_ids_list: list[Tensor],
        gains_list: list[Tensor],
        sample_count_list: list[int],
        col_offset_list: list[int],
        num_replica: int,
        table_vocab_size: int,
        feature_width: int,
        num_sc_per_chip: int,
        table_name: str,
        name: str | None = None,
    ) -> list[Tensor]:
        return self._sort(
            row_ids_list,
            col_ids_list,
            gains_list,
            stats=True,
            sample_count_list=list(sample_count_list),
            col_offset_list=list(col_offset_list),
            num_replica=num_replica,
            num_sc_per_chip=num_sc_per_chip,
            table_vocab_size=table_vocab_size,
            max_ids_per_sparse_core=None,
            max_unique_ids_per_sparse_core=None,
            table_name=table_name,
        )

    def csr_wrap(
        self,
        sorted_row_ids_list: list[Tensor],
        sorted_col_ids_list: list[Tensor],
        sorted_gains_list: list[Tensor],
        id_counts_list: list[Tensor],
        splits: Tensor,
        sample_count_per_sc: int,
        num_replica: int,
        max_minibatches_per_sc: int,
        max_ids_per_chip_per_sample: int,
        table_vocab_size: int,
        feature_width: int,
        table_name: str,
        allow_id_dropping: bool,
        name: str | None = None,
    ) -> list[Tensor]:
        count = len(sorted_row_ids_list)

        def kernel(*arrays: Array) -> tuple[Array, ...]:
            if np.any(arrays[-1] != 0):
                raise SparseCoreError(
                    "minibatch splits were asked for: minibatching is not "
                    "emulated."
                )
            return csr_wrap(
                list(arrays[:count]),
                list(arrays[count : 2 * count]),
                list(arrays[2 * count : 3 * count]),
                list(arrays[3 * count : 4 * count]),
                sample_count_per_sc=sample_count_per_sc,
                num_replica=num_replica,
                num_sc_per_chip=count,
                max_minibatches_per_sc=max_minibatches_per_sc,
                max_ids_per_chip_per_sample=max_ids_per_chip_per_sample,
                allow_id_dropping=allow_id_dropping,
                table_name=table_name,
            )

        outputs = tf.numpy_function(
            kernel,
            list(sorted_row_ids_list)
            + list(sorted_col_ids_list)
            + list(sorted_gains_list)
            + list(id_counts_list)
            + [splits],
            [tf.int32, tf.int32, tf.int32, tf.float32] + [tf.int32] * 3,
            stateful=False,
        )
        shards = num_replica * count
        max_ids = max_ids_per_chip_per_sample * sample_count_per_sc * count
        pointers = max_minibatches_per_sc * count * _round_up(shards, _PAD)
        for output, shape in zip(
            outputs, [[pointers]] + [[max_ids]] * 3 + [[]] * 3
        ):
            output.set_shape(shape)
        return list(outputs)

    def copy_with_dynamic_shape(
        self,
        tensors: list[Tensor],
        unpadded_sizes: list[Tensor],
        name: str | None = None,
    ) -> list[Tensor]:
        return [tensor[:size] for tensor, size in zip(tensors, unpadded_sizes)]

    def annotate(
        self, tensors: list[Tensor], name: str | None = None
    ) -> list[Tensor]:
        return [tf.identity(tensor) for tensor in tensors]

    # ---------------------------------------------------------- device

    def _decode(
        self,
        row_pointers: Tensor,
        sorted_sample_ids: Tensor,
        sorted_token_ids: Tensor,
        sorted_gains: Tensor,
        num_minibatches: Tensor,
        input_size: int,
        total_rows: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        sc_per_chip = _num_sc_per_chip()
        _, _, chips = _replica()
        shards = sc_per_chip * chips
        if input_size % sc_per_chip or total_rows % shards:
            raise SparseCoreError(
                f"input_size {input_size} or the table's {total_rows} rows "
                f"do not divide over {sc_per_chip} SparseCores per chip."
            )

        def kernel(*arrays: Array) -> tuple[Array, ...]:
            if int(arrays[-1]) != 1:
                raise SparseCoreError(
                    f"{int(arrays[-1])} minibatches per SparseCore: "
                    "minibatching is not emulated."
                )
            return decode_csr(
                *arrays[:-1],
                num_sc_per_chip=sc_per_chip,
                num_sc_shards=shards,
                per_sc_samples=input_size // sc_per_chip,
                rows_per_shard=total_rows // shards,
            )

        act_rows, table_rows, gains = tf.numpy_function(
            kernel,
            [
                row_pointers,
                sorted_sample_ids,
                sorted_token_ids,
                sorted_gains,
                num_minibatches,
            ],
            [tf.int64, tf.int64, tf.float32],
            stateful=False,
        )
        for output in (act_rows, table_rows, gains):
            output.set_shape([None])
        return act_rows, table_rows, gains

    def lookup(
        self,
        row_pointers: Tensor,
        sorted_sample_ids: Tensor,
        sorted_token_ids: Tensor,
        sorted_gains: Tensor,
        embedding_table: Any,
        num_minibatches_per_physical_sparse_core: Tensor,
        input_size: int,
        quantization_config_low: float,
        quantization_config_high: float,
        quantization_config_num_buckets: int,
        max_ids_per_sparse_core: int,
        max_unique_ids_per_sparse_core: int,
        table_name: str,
        num_sparsecores_per_device: int = -1,
        name: str | None = None,
    ) -> Tensor:
        """`XlaSparseDenseMatmulWithStaticBufferSize`: this chip's rows of
        the stacked activation, `[input_size, dim]`."""
        if quantization_config_num_buckets:
            raise NotImplementedError(
                f"table {table_name!r}: quantization is not emulated."
            )
        local = _local_value(embedding_table)
        context, replica, chips = _replica()
        total_rows = int(local.shape[0]) * chips
        dim = int(local.shape[1])
        decoded = self._decode(
            row_pointers,
            sorted_sample_ids,
            sorted_token_ids,
            sorted_gains,
            num_minibatches_per_physical_sparse_core,
            input_size,
            total_rows,
        )
        self.lookups += 1

        def combine(table: Tensor, decoded: Any) -> Tensor:
            act_rows, table_rows, gains = decoded
            rows = tf.gather(table, table_rows) * gains[:, tf.newaxis]
            return tf.math.unsorted_segment_sum(rows, act_rows, input_size)

        if context is None or chips == 1:
            result = combine(local, decoded)
        else:

            def merge(strategy: Any, local: Any, decoded: Any) -> list[Any]:
                per_chip = strategy.experimental_local_results
                table = tf.concat(per_chip(local), 0)
                chip_inputs = [per_chip(part) for part in decoded]
                devices = strategy.extended.worker_devices
                outputs = []
                for chip in range(chips):
                    with tf.device(devices[chip]):
                        outputs.append(
                            combine(table, [p[chip] for p in chip_inputs])
                        )
                return outputs

            result = context.merge_call(merge, args=(local, decoded))[replica]
        result.set_shape([input_size, dim])
        return result

    def _updater(self, kind: str) -> Callable[..., Any]:
        rule, slot_names = _OPTIMIZERS[kind]

        def update(
            row_pointers: Tensor,
            sorted_sample_ids: Tensor,
            sorted_token_ids: Tensor,
            sorted_gains: Tensor,
            activation_gradients: Tensor,
            learning_rate: Tensor,
            embedding_table: Tensor,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            slots = [embedding_table]
            slots += [kwargs.pop(slot) for slot in slot_names]
            minibatches = kwargs.pop("num_minibatches_per_physical_sparse_core")
            low = kwargs.pop("clip_weight_min", float("-inf"))
            high = kwargs.pop("clip_weight_max", float("inf"))
            table_name = kwargs.pop("table_name")
            for unused in (
                "max_ids_per_sparse_core",
                "max_unique_ids_per_sparse_core",
                "num_sparsecores_per_device",
                "name",
            ):
                kwargs.pop(unused, None)
            if args:
                raise TypeError(
                    f"emulated SparseCore {kind} update of {table_name!r}: "
                    "pass its inputs by name, as TPUEmbeddingV2 does."
                )
            return self._update(
                rule,
                kwargs,
                row_pointers,
                sorted_sample_ids,
                sorted_token_ids,
                sorted_gains,
                minibatches,
                activation_gradients,
                learning_rate,
                slots,
                low,
                high,
            )

        return update

    def _update(
        self,
        rule: Callable[..., list[Tensor]],
        hyperparameters: dict[str, Any],
        row_pointers: Tensor,
        sorted_sample_ids: Tensor,
        sorted_token_ids: Tensor,
        sorted_gains: Tensor,
        minibatches: Tensor,
        activation_gradients: Tensor,
        learning_rate: Tensor,
        slots: list[Tensor],
        low: float,
        high: float,
    ) -> Any:
        """The chip's update of one stacked table and its slots."""
        slots = [tf.convert_to_tensor(slot) for slot in slots]
        context, replica, chips = _replica()
        local_rows, dim = int(slots[0].shape[0]), int(slots[0].shape[1])
        input_size = int(activation_gradients.shape[0])
        act_rows, table_rows, gains = self._decode(
            row_pointers,
            sorted_sample_ids,
            sorted_token_ids,
            sorted_gains,
            minibatches,
            input_size,
            local_rows * chips,
        )
        contributions = (
            tf.gather(activation_gradients, act_rows) * gains[:, tf.newaxis]
        )
        self.updates += 1

        def apply(
            rows: Tensor,
            grads: Tensor,
            shards: list[list[Tensor]],
            rate: Tensor,
        ) -> list[list[Tensor]]:
            full = [tf.concat(per_chip, 0) for per_chip in shards]
            unique, position = tf.unique(rows)
            gradient = tf.math.unsorted_segment_sum(
                grads, position, tf.shape(unique)[0]
            )
            old = [tf.gather(value, unique) for value in full]
            new = rule(gradient, old, rate, hyperparameters)
            new[0] = _clip(new[0], low, high)
            updated = [
                tf.tensor_scatter_nd_update(value, unique[:, tf.newaxis], row)
                for value, row in zip(full, new)
            ]
            return [tf.split(value, chips, 0) for value in updated]

        rate = tf.cast(learning_rate, tf.float32)
        if context is None or chips == 1:
            result = [
                value[0]
                for value in apply(
                    table_rows, contributions, [[s] for s in slots], rate
                )
            ]
        else:

            def merge(
                strategy: Any, rows: Any, grads: Any, slots: Any, rate: Any
            ) -> list[list[Tensor]]:
                per_chip = strategy.experimental_local_results
                with tf.device(strategy.extended.worker_devices[0]):
                    updated = apply(
                        tf.concat(per_chip(rows), 0),
                        tf.concat(per_chip(grads), 0),
                        [list(per_chip(slot)) for slot in slots],
                        per_chip(rate)[0],
                    )
                return [
                    [value[chip] for value in updated] for chip in range(chips)
                ]

            result = context.merge_call(
                merge, args=(table_rows, contributions, slots, rate)
            )[replica]
        for value in result:
            value.set_shape([local_rows, dim])
        return result[0] if len(result) == 1 else tuple(result)
