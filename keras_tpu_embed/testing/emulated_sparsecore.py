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

The parts: the host kernels in numpy (`sparsecore_kernels.py`), run as
TF ops (`sparsecore_host_ops.py`); the per-row optimizer updates
(`sparsecore_optimizer_rules.py`); and here, `EmulatedSparseCore`, which
installs them and runs the lookup and its gradient over the chips' shards.

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

from typing import Any
from typing import Callable

from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_distribute_lib as distribute_lib
from keras_tpu_embed._compat import tf_gen_xla_ops as gen_xla_ops
from keras_tpu_embed._tf_private import replica_index
from keras_tpu_embed.testing import sparsecore_host_ops
from keras_tpu_embed.testing.sparsecore_kernels import Array
from keras_tpu_embed.testing.sparsecore_kernels import SparseCoreError
from keras_tpu_embed.testing.sparsecore_kernels import decode_csr
from keras_tpu_embed.testing.sparsecore_optimizer_rules import OPTIMIZER_RULES
from keras_tpu_embed.testing.sparsecore_optimizer_rules import clip_rows
from keras_tpu_embed.types import Tensor


def _replica() -> tuple[Any, int, int]:
    context = distribute_lib.get_replica_context()
    if context is None:
        return None, 0, 1
    return (
        context,
        replica_index(context),
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
            name: getattr(sparsecore_host_ops, name)
            for name in sparsecore_host_ops.HOST_OPS
        }
        replaced["xla_sparse_dense_matmul_with_static_buffer_size"] = (
            self.lookup
        )
        for kind in OPTIMIZER_RULES:
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
        rule, slot_names = OPTIMIZER_RULES[kind]

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
            new[0] = clip_rows(new[0], low, high)
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
