"""The SparseCore buffer sizes, computed on TF's own stacking.

`model.fit` over buffers sized this way is in
`tests/emulated/sparsecore_buffers_test.py`.
"""

import pytest
import tensorflow as tf

from keras_tpu_embed.engines.sparsecore import sparsecore_buffers

emb = tf.tpu.experimental.embedding
BATCH = 512  # per replica: 128 samples per SparseCore of 4


def _features():
    """`item` and `hist` share a table; TF stacks it with `tags` and
    `genres` (one optimizer; widths padded to 8) into `genres_items_tags`
    of 64 + 64 + 4032 padded rows."""
    items = emb.TableConfig(64, 4, name="items")
    tags = emb.TableConfig(4000, 4, name="tags")
    genres = emb.TableConfig(12, 2, name="genres")
    return {
        "item": emb.FeatureConfig(items, name="item", output_shape=[BATCH]),
        "hist": emb.FeatureConfig(
            items,
            name="hist",
            max_sequence_length=20,
            output_shape=[BATCH, 20],
        ),
        "tags": emb.FeatureConfig(tags, name="tags", output_shape=[BATCH]),
        "genres": emb.FeatureConfig(
            genres, name="genres", output_shape=[BATCH]
        ),
    }


def _inputs(tags_width=5):
    def sparse(width):
        return tf.SparseTensor(
            tf.zeros([0, 2], tf.int64),
            tf.zeros([0], tf.int64),
            [BATCH, width],
        )

    return {
        "item": tf.zeros([BATCH, 1], tf.int64),
        "hist": tf.ragged.constant([[1]] * BATCH, tf.int64),
        "tags": sparse(tags_width),
        "genres": tf.ragged.constant([[1, 2]] * BATCH, tf.int64),
    }


def _sizes(declared=None, **inputs):
    config = sparsecore_buffers.buffer_sizes(
        _features(),
        {**_inputs(), **inputs},
        declared or {"genres": 3},
        replicas=2,
        sparse_cores_per_chip=4,
    )
    return config.max_ids_per_table, config.max_unique_ids_per_table


def _one_feature(table, shape):
    """The config for one feature of `shape` ids (per replica) on 2 chips
    of 4 SparseCores."""
    return sparsecore_buffers.buffer_sizes(
        {"f": emb.FeatureConfig(table, name="f", output_shape=shape[:1])},
        {"f": tf.zeros(shape, tf.int64)},
        {},
        replicas=2,
        sparse_cores_per_chip=4,
    )


def test_each_stack_holds_every_id_of_a_sparse_cores_share():
    max_ids, unique = _sizes()
    # 128 samples per SparseCore: item 1 id, hist 20 positions of 1 id,
    # tags 5 ids (the sparse width); genres declared 3.
    assert max_ids == {"genres_items_tags": 128 * (1 + 20 + 5 + 3)}
    # Distinct ids are bounded by the stack's rows on one SparseCore too:
    # 4160 rows over 2 chips of 4 SparseCores.
    assert unique == {"genres_items_tags": 4160 // 8}


def test_a_declared_bound_wins_over_the_width_and_tfs_floor_holds():
    max_ids, _ = _sizes({"genres": 1, "tags": 1}, tags=_inputs(50)["tags"])
    assert max_ids == {"genres_items_tags": 128 * (1 + 20 + 1 + 1)}
    small = _one_feature(emb.TableConfig(10, 2, name="small"), [8, 3])
    # 2 samples of 3 ids per SparseCore: TF's 256 stays.
    assert small.max_ids_per_table == {"small": 256}
    assert small.max_unique_ids_per_table == {"small": 256}
    assert small.max_ids_per_chip_per_sample == 64
    assert not small.allow_id_dropping


def test_a_chip_holds_every_id_of_its_samples_with_tfs_alignment():
    config = _one_feature(emb.TableConfig(4096, 4, name="wide"), [32, 80])
    # 32 samples of 80 ids, plus up to 7 aligning slots for each of 4
    # SparseCores times 8 destinations: 2560 + 224 ids over 32 samples is
    # 87, rounded up to 8.
    assert config.max_ids_per_chip_per_sample == 88
    # And the per-SparseCore buffer: 8 samples of 80 ids.
    assert config.max_ids_per_table == {"wide": 640}


def test_ids_of_unknown_width_are_named():
    with pytest.raises(ValueError) as raised:
        _sizes({"item": 1})
    message = str(raised.value)
    assert "columns ['genres']" in message
    assert "max_ids_per_example={'genres': ...}" in message


@pytest.mark.parametrize(
    "value, feature, expected",
    [
        (tf.zeros([8]), emb.FeatureConfig(emb.TableConfig(4, 2)), 1),
        (tf.zeros([8, 3]), emb.FeatureConfig(emb.TableConfig(4, 2)), 3),
        (
            tf.ragged.constant([[1, 2], [3]]),
            emb.FeatureConfig(emb.TableConfig(4, 2)),
            None,
        ),
        (
            tf.ragged.constant([[1, 2], [3]]),
            emb.FeatureConfig(emb.TableConfig(4, 2), max_sequence_length=7),
            1,
        ),
    ],
)
def test_ids_per_sample_reads_the_static_shape(value, feature, expected):
    assert sparsecore_buffers.ids_per_sample(value, feature) == expected
