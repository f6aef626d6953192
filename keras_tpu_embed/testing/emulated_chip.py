"""The TPU embedding engine's device ops, as CPU kernels.

`tf.tpu.experimental.embedding.TPUEmbedding` talks to the chip through a
handful of ops in `tensorflow.python.tpu.ops.tpu_ops`, looked up by name at
each call: configure and is-initialized, the per-optimizer load and
retrieve ops (one shard per host), the enqueue
(`enqueue_tpu_embedding_arbitrary_tensor_batch`), the dequeue
(`recv_tpu_embedding_activations`) and `send_tpu_embedding_gradients`.
`EmulatedChip.install` replaces exactly those names while an emulation is
active; every line of `TPUEmbedding` around them is TensorFlow's own.

What the chip does is what the ops' documentation says the engine does:

- it holds each table of the configuration proto, with the slots of the
  table's optimizer, as one shard per host (host `i` of `n` holds a
  contiguous block of rows, the first `rows % n` hosts one row more: TF's
  sharded variable creator), and takes and gives them back one host
  shard at a time. Each shard lives on its host's device: TF calls each
  host's load and retrieve op under `ops.device(host)`, and the shard is
  allocated there by its first load (TF loads every table right after
  configuring the engine) and read and written there ever after;
- an enqueue records each replica's ids, row splits or sample indices and
  weights; only one of sparse or ragged inputs may be in one call;
- the dequeue gathers each id's row on the host of the shard that holds
  it (only the gathered rows travel, as over the TPU interconnect) and
  combines the rows of each output cell with the table's combiner (`sum`,
  `mean`, `sqrtn`) into the per-replica output shape of the feature
  descriptor; sequence features put one id per cell and drop positions
  past the sequence length;
- sending gradients hands every replica's row gradients to one merge call
  (the chip is shared by all cores), which sums them per distinct row over
  the global batch and applies the table's optimizer once, each shard's
  rows on its host (`engine_rules.step`).

Ids outside `[0, vocabulary_size)` fail at run time: the engine has no
rule for them.

What this does not emulate: the chip's memory is the host's (a shard takes
host RAM where a TPU holds it in its HBM, so on an emulated host the
chip's shards add to what TF's host copies hold, and HBM's size is never
checked), the interconnect is TF's runtime between devices (gRPC between
an emulated pod's hosts), the cores of one host share one shard (a TPU
spreads a host's rows over its cores), and the ops run in the step's CPU
graph, not in the TPU program XLA compiles.
"""

from __future__ import annotations

import threading
from typing import Any
from typing import Callable

from tensorflow.core.protobuf.tpu import (
    tpu_embedding_configuration_pb2 as config_pb2,
)

from keras_tpu_embed._compat import tf
from keras_tpu_embed._compat import tf_distribute_lib as distribute_lib
from keras_tpu_embed._compat import (
    tf_resource_variable_ops as resource_variable_ops,
)
from keras_tpu_embed._compat import tf_tpu_ops as tpu_ops
from keras_tpu_embed._compat import tf_tpu_util as tpu_util
from keras_tpu_embed._tf_private import replica_index
from keras_tpu_embed.testing import engine_rules
from keras_tpu_embed.testing.chip_kernels import ChipShard
from keras_tpu_embed.testing.chip_kernels import ChipTable
from keras_tpu_embed.testing.chip_kernels import Enqueued
from keras_tpu_embed.testing.chip_kernels import apply_table
from keras_tpu_embed.testing.chip_kernels import cells_and_scales
from keras_tpu_embed.testing.chip_kernels import cells_in
from keras_tpu_embed.testing.chip_kernels import checked_ids
from keras_tpu_embed.testing.chip_kernels import gather_rows
from keras_tpu_embed.types import Tensor

# The `config` argument of TF's chip ops: the serialized
# `TPUEmbeddingConfiguration`, which this chip reads once, in `configure`.
SerializedConfig = bytes | str | None


def shard_rows(rows: int, num_shards: int, shard_id: int) -> tuple[int, int]:
    """Rows `[start, end)` of host `shard_id`, as TF's sharded creator cuts."""
    base, extra = divmod(rows, num_shards)
    start = shard_id * base + min(shard_id, extra)
    return start, start + base + (1 if shard_id < extra else 0)


def _scope_device() -> str:
    """The device an op made here runs on: the caller's device scope."""
    device: str = tf.identity(tf.constant(0)).device
    return device


def _same_device(a: str, b: str) -> bool:
    return bool(
        tf.DeviceSpec.from_string(a).to_string()
        == tf.DeviceSpec.from_string(b).to_string()
    )


class EmulatedChip:
    """The embedding memory and ops of one emulated TPU system."""

    def __init__(self, worker_devices: list[str] | None = None) -> None:
        # The strategy's cores in replica order: an enqueue made outside
        # the step names its core by host and `device_ordinal` only.
        self.worker_devices = list(worker_devices or [])
        self.config: config_pb2.TPUEmbeddingConfiguration | None = None
        self.tables: list[ChipTable] = []
        self._enqueued: dict[tuple[int, int, int], Enqueued] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ install

    def install(self) -> Callable[[], None]:
        """Replaces TF's chip ops with this chip's; returns the undo."""
        replaced: dict[str, Any] = {
            "is_tpu_embedding_initialized": self.is_initialized,
            "configure_tpu_embedding": self.configure,
            "enqueue_tpu_embedding_arbitrary_tensor_batch": self.enqueue,
            "recv_tpu_embedding_activations": self.recv_activations,
            "send_tpu_embedding_gradients": self.send_gradients,
        }
        for kind in engine_rules.SLOT_NAMES:
            replaced[f"load_tpu_embedding_{kind}_parameters"] = self._loader()
            replaced[f"retrieve_tpu_embedding_{kind}_parameters"] = (
                self._retriever()
            )
        saved = {name: getattr(tpu_ops, name) for name in replaced}
        for name, op in replaced.items():
            setattr(tpu_ops, name, op)

        def undo() -> None:
            for name, op in saved.items():
                setattr(tpu_ops, name, op)

        return undo

    # ------------------------------------------------------------- system

    def is_initialized(self, name: str | None = None) -> Tensor:
        return tf.constant(self.config is not None)

    def configure(self, config: bytes, name: str | None = None) -> Any:
        """Reads the proto's tables (once per TPU system); each host's
        shard of a table is allocated on that host by its first load."""
        if self.config is not None:
            raise RuntimeError(
                "TPU is already initialized for embeddings (emulated chip)."
            )
        proto = config_pb2.TPUEmbeddingConfiguration()
        proto.ParseFromString(config)
        self.config = proto
        for table in proto.table_descriptor:
            parameters = table.optimization_parameters
            self.tables.append(
                ChipTable(
                    name=table.name,
                    vocabulary_size=table.vocabulary_size,
                    dim=table.dimension,
                    parameters=parameters,
                    kind=engine_rules.optimizer_kind(parameters),
                    num_shards=proto.num_hosts,
                )
            )
        return tf.no_op()

    def _table(self, name: str) -> ChipTable:
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(f"emulated chip: no table named {name!r}")

    def _shard(
        self, table: ChipTable, num_shards: int, shard_id: int
    ) -> ChipShard:
        """Host `shard_id`'s shard of `table`, on the device TF's op was
        called on (TF calls each host's load and retrieve under
        `ops.device(host)`), allocated there at its first use."""
        if num_shards != table.num_shards:
            raise ValueError(
                f"emulated chip: table '{table.name}' is sharded over "
                f"{table.num_shards} hosts (the configuration's num_hosts), "
                f"but an op asked for shard {shard_id} of {num_shards}."
            )
        host = _scope_device()
        shard = table.shards.get(shard_id)
        if shard is not None:
            if _same_device(shard.host, host):
                return shard
            raise RuntimeError(
                f"emulated chip: shard {shard_id} of table '{table.name}' "
                f"lives on {shard.host}, but an op for it runs on {host}: "
                "TF runs each host's load and retrieve on that host."
            )
        start, end = shard_rows(table.vocabulary_size, num_shards, shard_id)
        variables = {}
        # Lifted out of the traced load: the chip's memory outlives it.
        with tf.init_scope(), tf.device(host):
            for slot in table.slot_names if end > start else ():
                variables[slot] = resource_variable_ops.ResourceVariable(
                    tf.zeros([end - start, table.dim], tf.float32),
                    trainable=False,
                    name=f"emulated_chip/{table.name}/{slot}_{shard_id}",
                )
        shard = ChipShard(host, start, end - start, variables)
        table.shards[shard_id] = shard
        return shard

    def _loader(self) -> Callable[..., Any]:
        def load(
            *,
            table_name: str,
            num_shards: int,
            shard_id: int,
            config: SerializedConfig = None,
            table_id: int = -1,
            name: str | None = None,
            **values: Tensor,
        ) -> Any:
            table = self._table(table_name)
            shard = self._shard(table, num_shards, shard_id)
            if not shard.rows:
                # TF loads zeros shaped like the first shard for a host
                # that holds no row (a table with fewer rows than hosts).
                return tf.no_op()
            with tf.device(shard.host):
                ops = [
                    shard.variables[slot].assign(tf.convert_to_tensor(value))
                    for slot, value in values.items()
                ]
            with tf.control_dependencies(ops):
                return tf.no_op()

        return load

    def _retriever(self) -> Callable[..., Any]:
        def retrieve(
            *,
            table_name: str,
            num_shards: int,
            shard_id: int,
            config: SerializedConfig = None,
            table_id: int = -1,
            name: str | None = None,
        ) -> Any:
            table = self._table(table_name)
            shard = self._shard(table, num_shards, shard_id)
            with tf.device(shard.host):
                values = tuple(
                    shard.variables[slot].read_value()
                    if shard.rows
                    else tf.zeros([0, table.dim], tf.float32)
                    for slot in table.slot_names
                )
            return values if len(values) > 1 else values[0]

        return retrieve

    # --------------------------------------------------------------- step

    def _replica_key(self, device_ordinal: int = -1) -> tuple[int, int, int]:
        """One replica's step: one replicated computation (a TPU program
        run) of a graph. Keras' predict with `steps_per_execution > 1`
        runs several in one graph, each with its own enqueue.

        Outside a step, TF's `enqueue` makes one op per core, each under its
        core's host with the core's `device_ordinal` (the documented
        pattern enqueues before `strategy.run`); that op feeds that core.
        """
        graph = tf.compat.v1.get_default_graph()
        program = tpu_util.enclosing_tpu_context()
        if program is None and device_ordinal >= 0:
            replica = self._core_on_host(_scope_device(), device_ordinal)
        else:
            replica = replica_index(distribute_lib.get_replica_context())
        return id(graph), id(program), int(replica)

    def _core_on_host(self, host: str, device_ordinal: int) -> int:
        scope = tf.DeviceSpec.from_string(host)
        for replica, device in enumerate(self.worker_devices):
            core = tf.DeviceSpec.from_string(device)
            # One host's cores may be named without job and task, as a
            # one-host strategy names them; only what both name must agree.
            same_host = all(
                None in (getattr(core, part), getattr(scope, part))
                or getattr(core, part) == getattr(scope, part)
                for part in ("job", "replica", "task")
            )
            if same_host and core.device_index == device_ordinal:
                return replica
        raise RuntimeError(
            f"emulated chip: an enqueue on {host} for core {device_ordinal}, "
            f"which is none of the emulated cores {self.worker_devices}"
        )

    def _step_batch(self, key: tuple[int, int, int], pop: bool) -> Any:
        """The batch this replica's step reads: enqueued in the step, or
        before it in the same graph, outside any step."""
        graph, _, replica = key
        for candidate in (key, (graph, id(None), replica)):
            if candidate in self._enqueued:
                if pop:
                    return self._enqueued.pop(candidate)
                return self._enqueued[candidate]
        return None

    def enqueue(
        self,
        sample_indices_or_row_splits: list[Tensor],
        embedding_indices: list[Tensor],
        aggregation_weights: list[Tensor],
        mode_override: Any,
        device_ordinal: int = -1,
        combiners: list[str] | None = None,
        name: str | None = None,
    ) -> Any:
        """Records one replica's batch for the dequeue of this step."""
        kinds = []
        for positions in sample_indices_or_row_splits:
            if positions.shape.rank == 2:
                kinds.append("sparse")
            elif positions.shape.num_elements() == 0:
                kinds.append("dense")
            else:
                kinds.append("ragged")
        if "sparse" in kinds and "ragged" in kinds:
            # TF's `TPUEmbedding.enqueue` docstring: "Only one type out of
            # `tf.SparseTensor` or `tf.RaggedTensor` is supported per call";
            # no TF code checks it before the op.
            raise ValueError(
                "emulated chip: one enqueue mixes SparseTensor and "
                "RaggedTensor features; the TPU embedding enqueue takes "
                "one kind per call."
            )
        weights = [
            None if w.shape.num_elements() == 0 else w
            for w in aggregation_weights
        ]
        with self._lock:
            key = self._replica_key(device_ordinal)
            if key in self._enqueued:
                raise RuntimeError(
                    "emulated chip: a second enqueue in one step of one "
                    "replica; the engine is fed once per step."
                )
            self._enqueued[key] = Enqueued(
                ids=[tf.cast(i, tf.int64) for i in embedding_indices],
                positions=[
                    None if kind == "dense" else p
                    for kind, p in zip(kinds, sample_indices_or_row_splits)
                ],
                kinds=kinds,
                weights=weights,
                combiners=list(combiners or []),
            )
        return tf.no_op()

    def _features(self) -> list[tuple[int, ChipTable, list[int]]]:
        if self.config is None:
            raise RuntimeError(
                "emulated chip: activations asked before "
                "configure_tpu_embedding"
            )
        return [
            (f.table_id, self.tables[f.table_id], list(f.input_shape))
            for f in self.config.feature_descriptor
        ]

    def recv_activations(
        self,
        num_outputs: int,
        config: SerializedConfig = None,
        name: str | None = None,
    ) -> list[Tensor]:
        batch = self._step_batch(self._replica_key(), pop=False)
        if batch is None:
            raise RuntimeError(
                "emulated chip: dequeue without an enqueue in this step"
            )
        outputs = []
        for index, (table_id, table, shape) in enumerate(self._features()):
            cells, scale = cells_and_scales(
                batch, index, shape, batch.combiners[table_id]
            )
            batch.cells.append(cells)
            batch.scales.append(scale)
            ids = checked_ids(batch.ids[index], table)
            rows = gather_rows(table, ids)
            num_cells = cells_in(shape)
            combined = tf.math.unsorted_segment_sum(
                rows * scale[:, tf.newaxis], cells, num_cells
            )
            outputs.append(tf.reshape(combined, shape + [table.dim]))
        if len(outputs) != num_outputs:
            raise ValueError(
                f"emulated chip: {num_outputs} outputs asked, the "
                f"configuration has {len(outputs)} features"
            )
        return outputs

    def send_gradients(
        self,
        inputs: list[Tensor],
        learning_rates: list[Tensor],
        config: SerializedConfig = None,
        name: str | None = None,
    ) -> Any:
        """Row gradients of this replica, applied once for all replicas."""
        batch = self._step_batch(self._replica_key(), pop=True)
        if batch is None or len(batch.cells) != len(inputs):
            raise RuntimeError(
                "emulated chip: gradients sent without a dequeue in this step"
            )
        per_table: dict[str, list[tuple[Tensor, Tensor]]] = {}
        for index, (_, table, _) in enumerate(self._features()):
            gradient = tf.reshape(inputs[index], [-1, table.dim])
            rows = tf.gather(gradient, batch.cells[index])
            rows = rows * batch.scales[index][:, tf.newaxis]
            ids = checked_ids(batch.ids[index], table)
            per_table.setdefault(table.name, []).append((ids, rows))
        payload = {
            name: (
                tf.concat([ids for ids, _ in parts], 0),
                tf.concat([rows for _, rows in parts], 0),
            )
            for name, parts in per_table.items()
        }
        rates = [tf.cast(r, tf.float32) for r in learning_rates]
        context = distribute_lib.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return self._apply({n: [p] for n, p in payload.items()}, rates)

        def merge(strategy: Any, payload: Any, rates: Any) -> Any:
            local = strategy.experimental_local_results
            gathered = {
                name: list(
                    zip(local(value[0]), local(value[1]))  # ids, rows
                )
                for name, value in payload.items()
            }
            first_rates = [local(r)[0] for r in rates]
            return self._apply(gathered, first_rates)

        return context.merge_call(merge, args=(payload, rates))

    def _apply(
        self,
        gathered: dict[str, list[tuple[Tensor, Tensor]]],
        rates: list[Tensor],
    ) -> Any:
        updates = []
        for table in self.tables:
            parts = gathered.get(table.name)
            if not parts:
                continue
            ids = tf.concat([ids for ids, _ in parts], 0)
            rows = tf.concat([rows for _, rows in parts], 0)
            updates += apply_table(table, ids, rows, rates)
        with tf.control_dependencies(updates):
            return tf.no_op()
