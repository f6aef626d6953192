"""What the TPU in scope offers for embeddings: the one place that asks.

`embedding_hardware` reads the strategy's
`extended.tpu_hardware_feature.embedding_feature`; `mid_level_class` names
the mid-level API class for that hardware. Nothing else in the package
consults TPU hardware. The tests run the TPU paths under
`keras_tpu_embed.testing.emulated_tpu`, whose strategy answers these
questions as a TPU's does.
"""

from __future__ import annotations

import enum
from typing import Any

from keras_tpu_embed._compat import tf
from keras_tpu_embed._tf_private import variable_partitioner

CLIENT_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
"""This process's CPU. On a pod it is the client's (which builds the input
pipelines and serving copies), not a host's; a strategy's scope would
place resources on a host, where another process cannot reach them."""

_TPU_STRATEGIES = (
    tf.distribute.TPUStrategy,
    tf.distribute.experimental.TPUStrategy,
)


class EmbeddingHardware(enum.Enum):
    """What the current strategy offers for embedding lookups."""

    NONE = "none"  # not a TPUStrategy: CPU, GPU, default strategy
    NO_ENGINE = "no_engine"  # a TPU without an embedding engine (v5e)
    V1 = "v1"  # the TPU embedding engine (TPUEmbedding)
    V2 = "v2"  # SparseCore (TPUEmbeddingV2)

    @property
    def has_engine(self) -> bool:
        return self in (EmbeddingHardware.V1, EmbeddingHardware.V2)


def embedding_hardware(strategy: Any) -> EmbeddingHardware:
    """Reads `strategy.extended.tpu_hardware_feature.embedding_feature`."""
    if not isinstance(strategy, _TPU_STRATEGIES):
        return EmbeddingHardware.NONE
    feature = strategy.extended.tpu_hardware_feature.embedding_feature
    kinds = tf.tpu.experimental.HardwareFeature.EmbeddingFeature
    if feature == kinds.V1:
        return EmbeddingHardware.V1
    if feature == kinds.V2:
        return EmbeddingHardware.V2
    return EmbeddingHardware.NO_ENGINE


def refuse_unsupported_strategy(layer: str) -> None:
    """Raises under a strategy the layers cannot train on.

    `tf.distribute.experimental.ParameterServerStrategy` is supported
    without a `variable_partitioner`: the layers shard their own tables
    (`parameter_server/sharded_tables.py`). A partitioner would shard
    Keras' dense weights too, which Keras' optimizer cannot update, and
    make each table's initial value whole on the coordinator. TF1's
    `tf.compat.v1` strategy is not a TF2 strategy Keras runs under.

    Raises:
        RuntimeError: naming the strategy and what to use instead.
    """
    strategy = tf.distribute.get_strategy()
    if isinstance(
        strategy, tf.compat.v1.distribute.experimental.ParameterServerStrategy
    ):
        raise RuntimeError(
            f"{layer} is created or built under TF1's "
            "tf.compat.v1.distribute.experimental.ParameterServerStrategy, "
            "which keras_tpu_embed does not support. Use "
            "tf.distribute.experimental.ParameterServerStrategy(resolver) "
            "with kte.parameter_server.ParameterServerTrainer."
        )
    if (
        isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
        and variable_partitioner(strategy) is not None
    ):
        raise RuntimeError(
            f"{layer} is created or built under a ParameterServerStrategy "
            f"with variable_partitioner={variable_partitioner(strategy)!r}. "
            "keras_tpu_embed shards its embedding tables over the parameter "
            "servers itself; a partitioner would also shard the model's "
            "dense weights, which Keras' optimizer cannot update. Create "
            "the strategy without variable_partitioner."
        )


def sparse_cores_per_chip(strategy: Any) -> int:
    """SparseCores per TPU chip, as `TPUEmbeddingV2` reads them: 4 when the
    hardware feature does not say (`tpu_embedding_v3.py`)."""
    hardware = strategy.extended.tpu_hardware_feature
    return int(hardware.num_embedding_devices_per_chip) or 4


def current_hardware() -> EmbeddingHardware:
    """`embedding_hardware` of the strategy in scope (or in `run`)."""
    return embedding_hardware(tf.distribute.get_strategy())


def mid_level_class(hardware: EmbeddingHardware) -> type:
    """The mid-level API class for the hardware: `TPUEmbedding` on V1,
    `TPUEmbeddingV2` on SparseCore (V2)."""
    if hardware is EmbeddingHardware.V1:
        mid_level: type = tf.tpu.experimental.embedding.TPUEmbedding
        return mid_level
    if hardware is EmbeddingHardware.V2:
        sparse_core: type = tf.tpu.experimental.embedding.TPUEmbeddingV2
        return sparse_core
    raise ValueError(
        f"No supported TPU embedding engine on {hardware.value} hardware."
    )


def check_called_where_built(
    layer: str, built_on: EmbeddingHardware, on_engine: bool
) -> None:
    """A layer runs under the kind of strategy it was built under.

    Args:
        layer: The layer's kind and name, for messages.
        built_on: The hardware the layer was built on.
        on_engine: Whether the layer's tables live in the TPU engine.

    Raises:
        RuntimeError: called outside the strategy that holds its engine
            tables, or under a TPUStrategy after being built outside one.
    """
    now = current_hardware()
    if on_engine and not now.has_engine:
        raise RuntimeError(
            f"{layer} was built under TPUStrategy and its tables live in the "
            "TPU embedding engine, but it is called outside that strategy. "
            "Call the model through model.fit / evaluate / predict under "
            "the strategy; export it for serving with "
            "kte.export_saved_model(model, path). To run it on CPU, build "
            "the same model outside the strategy and restore "
            "tf.train.Checkpoint(model=model) into it."
        )
    if built_on is EmbeddingHardware.NONE and now is not EmbeddingHardware.NONE:
        raise RuntimeError(
            f"{layer} was built outside TPUStrategy (its tables are ordinary "
            "variables) but is called under it. Create and build the model "
            "inside `strategy.scope()`."
        )
