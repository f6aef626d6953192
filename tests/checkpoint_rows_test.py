"""`CheckpointRows`: a checkpoint's rows in new ids, a stored piece at a time.

The checkpoints are written by TF 1.x's own code: a variable partitioned
by `fixed_size_partitioner`, each row placed where TF1's "mod"
`embedding_lookup` reads it (`tests/warm_start_test.py`).
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_tpu_embed.saving import checkpoint_rows
from keras_tpu_embed.saving.checkpoint_rows import CheckpointRows
from keras_tpu_embed.saving.checkpoint_rows import vocabulary_positions
from keras_tpu_embed.tables import initialization
from tests.warm_start_test import TABLE_KEY
from tests.warm_start_test import tpu_estimator_checkpoint

ROWS = 14
PIECES = 3


@pytest.fixture(name="restores")
def _restores(monkeypatch):
    """Every slice spec `RestoreV2` is asked for."""
    specs = []
    restore = tf.raw_ops.RestoreV2

    def recording(**kwargs):
        specs.extend(kwargs["shape_and_slices"])
        return restore(**kwargs)

    monkeypatch.setattr(tf.raw_ops, "RestoreV2", recording)
    return specs


def _logical():
    return np.arange(ROWS * 2, dtype=np.float32).reshape(ROWS, 2)


def _rows(prefix, mod=True, remap=None, rows=ROWS):
    return CheckpointRows(
        prefix,
        TABLE_KEY,
        (ROWS, 2),
        tf.float32,
        rows=rows,
        num_shards=PIECES,
        mod=mod,
        remap=remap,
    )


def _gather(rows, start, stop):
    ids, values = [], []
    for block_ids, block in rows.blocks(start, stop):
        assert len(block) <= 2  # BLOCK_BYTES of one row of 2 floats
        ids.extend(block_ids.tolist())
        values.append(block)
    return ids, np.concatenate(values) if values else np.zeros([0, 2])


def _piece_of(spec):
    """The stored piece a slice spec lies in, or None if it spans two."""
    first, size = (int(x) for x in spec.split()[2].split(":")[0].split(","))
    for index, (start, rows) in enumerate(
        checkpoint_rows.stored_pieces(ROWS, PIECES)
    ):
        if start <= first and first + size <= start + rows:
            return index
    return None


@pytest.fixture(name="small_blocks", autouse=True)
def _small_blocks(monkeypatch):
    # Blocks of two rows, so that each piece comes out in several.
    monkeypatch.setattr(initialization, "BLOCK_BYTES", 2 * 2 * 4)


@pytest.mark.parametrize("start, stop", [(0, ROWS), (4, 11), (13, 14)])
def test_mod_layout_reads_ids_in_order_a_piece_at_a_time(
    tmp_path, restores, start, stop
):
    prefix = tpu_estimator_checkpoint(tmp_path, _logical(), _logical(), PIECES)
    ids, values = _gather(_rows(prefix), start, stop)
    assert sorted(ids) == list(range(start, stop))
    np.testing.assert_array_equal(values, _logical()[ids])
    # One read per stored piece holding some of the ids, none spanning two.
    pieces = [_piece_of(spec) for spec in restores]
    assert None not in pieces
    assert len(pieces) == len(set(pieces))


def test_div_reads_the_stored_rows_in_order(tmp_path, restores):
    prefix = tpu_estimator_checkpoint(tmp_path, _logical(), _logical(), PIECES)
    stored = tf.train.load_checkpoint(prefix).get_tensor(TABLE_KEY)
    ids, values = _gather(_rows(prefix, mod=False), 2, 9)
    assert ids == list(range(2, 9))
    np.testing.assert_array_equal(values, stored[2:9])
    # Pieces of 5, 5 and 4 rows: rows 2-8 lie in the first two.
    assert [_piece_of(spec) for spec in restores] == [0, 1]


def test_remap_moves_rows_by_token_and_skips_new_tokens(tmp_path, restores):
    prefix = tpu_estimator_checkpoint(tmp_path, _logical(), _logical(), PIECES)
    old = [f"t{i}" for i in range(ROWS)]
    new = ["t13", "fresh", "t0", "t5", "t6"]
    # 6 rows: the 5 tokens and an OOV bucket.
    remap = vocabulary_positions(old, new, ROWS, 6)
    ids, values = _gather(_rows(prefix, remap=remap, rows=6), 0, 6)
    assert sorted(ids) == [0, 2, 3, 4]
    expected = {0: 13, 2: 0, 3: 5, 4: 6}
    for new_id, row in zip(ids, values):
        np.testing.assert_array_equal(row, _logical()[expected[new_id]])
    assert None not in [_piece_of(spec) for spec in restores]
    # Only the pieces holding old ids 13, 0, 5 and 6 ("mod": 13 % 3 = 1,
    # 0 % 3 = 0, 5 % 3 = 2, 6 % 3 = 0): each once, read in part.
    assert sorted(_piece_of(spec) for spec in restores) == [0, 1, 2]


def test_a_range_no_stored_row_maps_to_reads_nothing(tmp_path, restores):
    prefix = tpu_estimator_checkpoint(tmp_path, _logical(), _logical(), PIECES)
    remap = vocabulary_positions(["a", "b"], ["x", "y", "a"], ROWS, 4)
    assert _gather(_rows(prefix, remap=remap, rows=4), 0, 2)[0] == []
    assert restores == []
