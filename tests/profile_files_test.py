"""A table's lookup profile, read back by column name."""

import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.engines.sparsecore import profile_files


def test_profiled_max_ids_are_read_back_by_column_name(tmp_path):
    item, hist = kte.shared_embedding_columns(
        [
            kte.categorical_column_with_identity("item", 8),
            kte.sequence_categorical_column_with_identity("hist", 8),
        ],
        2,
        max_sequence_lengths=[0, 4],
    )
    data = tf.data.Dataset.from_tensor_slices(
        {
            "item": tf.ragged.constant([[0, 1], [7], [6, 6, 2], [1]]),
            "hist": tf.ragged.constant([[1, 2, 3], [], [0], [5, 4, 4, 4, 4]]),
        }
    ).batch(2)
    kte.profile_lookups(data, [item, hist], str(tmp_path))
    read = profile_files.profiled_max_ids(
        str(tmp_path), "hist_item_shared_embedding"
    )
    assert read == {item.name: 3, hist.name: 5}
    assert profile_files.profiled_max_ids(str(tmp_path), "other") == {}
