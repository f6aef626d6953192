"""Where the engine's tables live, as TF's sharded creator cuts them.

The tables read from and written to the engine (checkpoints both ways
between the TPU and CPU) run under TF's own `TPUEmbedding` in
`tests/emulated/`: `evaluate_predict_checkpoint_test.py`,
`engine_tables_test.py`, `engine_checkpoint_test.py`, `save_paths_test.py`.
"""

import tensorflow as tf

from keras_tpu_embed.engines.engine_members import HostShard
from keras_tpu_embed.engines.engine_members import host_shards
from keras_tpu_embed.engines.engine_members import slice_spec


def test_host_shards_are_contiguous_the_first_ones_one_row_longer():
    assert host_shards(10, ["a", "b", "c"]) == [
        HostShard("a", 0, 4),
        HostShard("b", 4, 3),
        HostShard("c", 7, 3),
    ]
    # A host with no row gets no shard.
    assert host_shards(1, ["a", "b"]) == [HostShard("a", 0, 1)]


def test_a_shards_slice_is_spelled_as_tf_saves_a_sharded_variable():
    shard = HostShard("b", 4, 3)
    spec = slice_spec([10, 2], shard)
    assert spec == "10 2 4,3:0,2"
    assert spec == tf.Variable.SaveSliceInfo("", [10, 2], [4, 0], [3, 2]).spec
