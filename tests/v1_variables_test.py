"""The V1 engine's tables as `TPUEmbedding`'s host shards
(`engines/v1/v1_variables.py`).

Their shards exist only once `TPUEmbedding` is built under a TPUStrategy
(it reads the hosts then), so their reads and writes run under TF's own
`TPUEmbedding` in the emulated suites: `tests/emulated/
engine_checkpoint_test.py`, `save_paths_test.py`, `warm_start_engine_test.py`
and the pod's `tests/emulated_hosts/engine_shards_test.py`."""

import keras

import keras_tpu_embed as kte
from keras_tpu_embed.engines.sparsecore.sparsecore_engine import (
    SparseCoreEngine,
)
from keras_tpu_embed.engines.v1.v1_engine import V1Engine
from keras_tpu_embed.engines.v1.v1_variables import V1HostShards
from keras_tpu_embed.placement.hardware import EmbeddingHardware


def _engine():
    engine = V1Engine(EmbeddingHardware.V1)
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 10), 3
    )
    engine.register(
        "layer",
        [column],
        None,
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
        step=keras.Variable(0, dtype="int64", trainable=False),
        trigger=keras.Variable(0.0, trainable=True),
        counts_step=True,
        return_sequence_lengths=False,
        layer_description="TPUEmbeddingLayer 'layer'",
    )
    return engine


def test_only_the_v1_engine_holds_its_tables_as_host_shards():
    assert isinstance(_engine(), V1HostShards)
    sparse_core = SparseCoreEngine(EmbeddingHardware.V2)
    assert not isinstance(sparse_core, V1HostShards)
