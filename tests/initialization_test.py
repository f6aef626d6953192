"""Block-wise table initialization keeps the initializer's distribution."""

import keras
import numpy as np
import pytest

import keras_tpu_embed as kte
from keras_tpu_embed import initialization


class _Holder(keras.layers.Layer):
    pass


def test_blocks_fill_every_row_with_fresh_draws(monkeypatch):
    monkeypatch.setattr(initialization, "BLOCK_BYTES", 4 * 8 * 100)
    layer = _Holder()
    init = keras.initializers.TruncatedNormal(stddev=0.5)
    table = initialization.create_table(layer, "t", (1000, 8), init).numpy()
    assert np.all(np.abs(table) <= 2 * 0.5 + 1e-6)  # truncated at 2 stddev
    assert abs(table.mean()) < 0.05
    assert 0.35 < table.std() < 0.5
    # Ten blocks of 100 rows: no block repeats another.
    blocks = table.reshape(10, 100, 8)
    assert len({b.tobytes() for b in blocks}) == 10


def test_constants_and_seeded_initializers():
    layer = _Holder()
    ones = initialization.create_table(
        layer, "c", (7, 3), keras.initializers.Constant(0.25)
    )
    np.testing.assert_array_equal(ones.numpy(), np.full((7, 3), 0.25))
    zeros = initialization.create_table(
        layer, "z", (7, 3), keras.initializers.Constant(0.0)
    )
    np.testing.assert_array_equal(zeros.numpy(), np.zeros((7, 3)))
    seeded = keras.initializers.RandomNormal(seed=3)
    assert not initialization.fills_by_blocks(seeded)
    table = initialization.create_table(layer, "s", (5, 2), seeded)
    np.testing.assert_allclose(
        table.numpy(), keras.initializers.RandomNormal(seed=3)((5, 2))
    )
    glorot = keras.initializers.GlorotUniform()
    assert not initialization.fills_by_blocks(glorot)


def test_creating_tables_logs_nothing():
    """Issue: every build printed TF's "triggered tf.function retracing"."""
    import logging

    import tensorflow as tf

    records = []

    class _Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = _Collect(level=logging.DEBUG)
    logger = tf.get_logger()
    logger.addHandler(handler)
    try:
        layer = _Holder()
        for i in range(8):
            initialization.create_table(
                layer, f"t{i}", (50, 4), keras.initializers.TruncatedNormal()
            )
            initialization.create_table(
                layer, f"g{i}", (50, 4), keras.initializers.GlorotUniform()
            )
            initialization.create_table(
                layer, f"z{i}", (50, 4), keras.initializers.Zeros()
            )
    finally:
        logger.removeHandler(handler)
    assert not [r for r in records if "retracing" in r], records


@pytest.mark.parametrize(
    "categorical",
    [
        lambda: kte.categorical_column_with_hash_bucket("h", 2**40),
        lambda: kte.categorical_column_with_identity("h", 2**63),
    ],
    ids=["hash_2**40", "identity_2**63"],
)
def test_tables_too_large_for_memory_fail_at_build_naming_them(categorical):
    """They failed after long allocation with an OOM or an integer
    conversion error that named no table."""
    layer = kte.TPUEmbeddingLayer([kte.embedding_column(categorical(), 8)])
    with pytest.raises(ValueError, match=r"Table 'h'.*rows.*bytes.*avail"):
        layer.build()
