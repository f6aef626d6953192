"""Lookup profiles: statistics, shard spread, reuse of existing files."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.pipelines import profiling


def _columns():
    item = kte.categorical_column_with_identity("item", 8)
    hist = kte.sequence_categorical_column_with_identity("hist", 8)
    return kte.shared_embedding_columns(
        [item, hist], 2, max_sequence_lengths=[0, 4]
    )


def _dataset():
    return tf.data.Dataset.from_tensor_slices(
        {
            "item": tf.constant([[0, 1], [7, -1], [6, 6], [1, -1]]),
            "hist": tf.ragged.constant([[1, 2, 3], [], [0], [5, 4, 4, 4, 4]]),
        }
    ).batch(2)


@pytest.mark.parametrize(
    "strategy, shards", [("div", [5, 2, 5, 3]), ("mod", [6, 4, 3, 2])]
)
def test_statistics_and_shard_spread(tmp_path, strategy, shards):
    stats = kte.profile_lookups(
        _dataset(),
        _columns(),
        str(tmp_path),
        num_shards=4,
        partition_strategy=strategy,
    )
    table = stats["hist_item_shared_embedding"]
    assert table["features"]["item"]["mean_ids_per_example"] == 1.5
    assert table["features"]["item"]["max_ids_per_example"] == 2
    assert table["features"]["hist"]["max_ids_per_example"] == 5
    assert table["features"]["hist"]["examples"] == 4
    # ids: item 0,1,7,6,6,1 and hist 1,2,3,0,5,4,4,4,4 over 8 rows.
    assert table["ids_per_shard"] == shards
    assert table["shard_imbalance"] == pytest.approx(max(shards) / (15 / 4))
    on_disk = profiling.profile_path(str(tmp_path), table["table"])
    with open(on_disk) as handle:
        assert json.load(handle) == table


def test_existing_file_is_reused(tmp_path):
    first = kte.profile_lookups(_dataset(), _columns(), str(tmp_path))
    path = profiling.profile_path(str(tmp_path), "hist_item_shared_embedding")
    marker = dict(first["hist_item_shared_embedding"], marker=True)
    with open(path, "w") as handle:
        json.dump(marker, handle)
    again = kte.profile_lookups(_dataset(), _columns(), str(tmp_path))
    assert again["hist_item_shared_embedding"]["marker"] is True
    fresh = kte.profile_lookups(
        _dataset(), _columns(), str(tmp_path), overwrite=True
    )
    assert "marker" not in fresh["hist_item_shared_embedding"]


def test_layer_config_supplies_directory_and_strategy(tmp_path):
    config = kte.EmbeddingConfig(
        partition_strategy="mod", profile_data_directory=str(tmp_path / "p")
    )
    layer = kte.SharedTPUEmbedding(_columns(), config=config)
    stats = kte.profile_lookups(_dataset(), layer, num_shards=4)
    assert stats["hist_item_shared_embedding"]["partition_strategy"] == "mod"
    assert os.listdir(tmp_path / "p") == [
        "hist_item_shared_embedding.lookup_profile.json"
    ]
    with pytest.raises(ValueError, match="directory"):
        kte.profile_lookups(_dataset(), _columns())
    np.testing.assert_equal(
        profiling.shard_of(np.arange(8), 8, 4, "div"), [0, 0, 1, 1, 2, 2, 3, 3]
    )
