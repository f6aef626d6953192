"""Block-wise table initialization keeps the initializer's distribution."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.columns.embedding import describe
from keras_tpu_embed.tables import initialization
from tests import initializer_cases as cases


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
    # Drawn by blocks in float32 only, where the per-block counters are
    # those of the whole draw.
    assert initialization.row_local(seeded)
    assert not initialization.row_local(seeded, "float64")
    table = initialization.create_table(layer, "s", (5, 2), seeded)
    np.testing.assert_array_equal(
        table.numpy(), keras.initializers.RandomNormal(seed=3)((5, 2))
    )
    assert initialization.row_local(keras.initializers.GlorotUniform())
    assert not initialization.row_local(keras.initializers.Orthogonal())


_SEEDED = {
    "truncated": lambda: keras.initializers.TruncatedNormal(0.5, 0.3, seed=7),
    "normal": lambda: keras.initializers.RandomNormal(-1.0, 2.0, seed=8),
    "uniform": lambda: keras.initializers.RandomUniform(-3.0, 1.0, seed=9),
    # Keras gives an initializer made without a seed an integer one.
    "default": lambda: (
        kte.embedding_column(
            kte.categorical_column_with_identity("c", 2), 5
        ).initializer
    ),
}


@pytest.mark.parametrize("name", sorted(_SEEDED))
def test_seeded_tables_fill_by_blocks_bit_for_bit(monkeypatch, name):
    """Issue 28 (memory): a seeded draw ran in one piece, so each table
    cost three times its size (the draw, `* stddev`, `+ mean`) and the
    freed intermediates stayed in TensorFlow's allocator: W2's layer build
    took 1.55x its state in resident memory before its first step."""
    initializer = _SEEDED[name]()
    assert type(initializer.seed) is int
    shape = (1003, 5)  # blocks of 37 rows: offsets off the 4-value groups
    whole = initializer(shape, dtype="float32").numpy()
    monkeypatch.setattr(initialization, "BLOCK_BYTES", 4 * 5 * 37)
    requested = []
    kind = type(initializer)
    original = kind.__call__

    def spy(self, shape, dtype=None, **kwargs):
        requested.append(tuple(shape))
        return original(self, shape, dtype=dtype, **kwargs)

    monkeypatch.setattr(kind, "__call__", spy)
    table = initialization.create_table(_Holder(), "t", shape, initializer)
    np.testing.assert_array_equal(table.numpy(), whole)
    assert all(rows <= 37 for rows, _ in requested), requested


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


# Pod slices (issue 23, finding 5). TF's mid-level API creates every engine
# table under `make_sharded_variable_creator(hosts)`, which calls the
# table's initializer once per host with that host's shard. These tests run
# TF's own creator on CPU "hosts" and create the variable exactly as
# `TPUEmbedding._create_variables_and_slots` does.


def _shards(initializer, shape, hosts):
    """The per-host shards TF's sharded variable creator makes."""
    import functools

    from tensorflow.python.tpu import tpu_embedding_v2

    creator = tpu_embedding_v2.make_sharded_variable_creator(["/cpu:0"] * hosts)
    with tf.variable_creator_scope(creator):
        variable = tf.Variable(
            name="table",
            initial_value=functools.partial(
                initializer, shape, dtype=tf.float32
            ),
            shape=shape,
            dtype=tf.float32,
            trainable=False,
        )
    return [shard.numpy() for shard in variable.variables]


def _engine_initializer(column):
    configs = kte.to_tpu_feature_configs([column])
    return configs[column.name].table.initializer


def _one_device(initializer, shape):
    """The table TF's mid-level API makes off the TPU (no creator scope)."""
    import functools

    return tf.Variable(
        functools.partial(initializer, shape, dtype=tf.float32)
    ).numpy()


_INITIALIZERS = {
    "default": lambda shape: None,
    "function": lambda shape: (
        lambda shape, dtype=None: tf.reshape(
            tf.range(shape[0] * shape[1], dtype=dtype), shape
        )
    ),
    **cases.DETERMINISTIC,
}


@pytest.mark.parametrize("hosts", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(_INITIALIZERS))
def test_engine_shards_are_the_rows_of_the_one_device_table(name, hosts):
    """Each host's shard is its rows of the table one device makes, and of
    the table the layer holds on CPU: bit for bit."""
    # 7 rows: not divisible by 2 or 3; 5 columns: shard offsets are not on
    # the random generator's 4-element groups.
    shape = (7, 5)
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", shape[0]),
        shape[1],
        initializer=_INITIALIZERS[name](shape),
    )
    initializer = _engine_initializer(column)
    shards = _shards(initializer, shape, hosts)
    assert [len(s) for s in shards] == [
        len(r) for r in np.array_split(np.zeros(shape[0]), hosts)
    ]
    whole = _one_device(initializer, shape)
    np.testing.assert_array_equal(np.concatenate(shards), whole)
    layer = kte.TPUEmbeddingLayer([column])
    layer.build()
    np.testing.assert_array_equal(layer.table_variable("item").numpy(), whole)


def test_default_initialized_shards_never_repeat():
    """With TF's creator the default initializer gave every host the same
    shard: rows repeated with period vocabulary / hosts."""
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 8), 4
    )
    shards = _shards(_engine_initializer(column), (8, 4), 2)
    assert not np.array_equal(shards[0], shards[1])
    rows = np.concatenate(shards)
    assert len({row.tobytes() for row in rows}) == len(rows)


def _checkpoint_column(tmp_path, values):
    variable = tf.Variable(values)
    path = tf.train.Checkpoint(table=variable).write(str(tmp_path / "c"))
    return kte.embedding_column(
        kte.categorical_column_with_identity("item", values.shape[0]),
        values.shape[1],
        ckpt_to_load_from=path,
        tensor_name_in_ckpt="table/.ATTRIBUTES/VARIABLE_VALUE",
    )


@pytest.mark.parametrize("hosts", [2, 3])
def test_checkpoint_initializer_on_pod_shards(tmp_path, hosts):
    """It raised on the shard shape whenever there was more than one host."""
    values = np.arange(35, dtype=np.float32).reshape(7, 5)
    column = _checkpoint_column(tmp_path, values)
    shards = _shards(_engine_initializer(column), values.shape, hosts)
    assert len(shards) == hosts
    np.testing.assert_array_equal(np.concatenate(shards), values)


def test_a_layer_first_built_inside_a_traced_function_fills_its_table():
    # Seeded tables fill by blocks when built eagerly; built inside a
    # trace, the first scatter met a variable without its buffer
    # (InvalidArgumentError: params.shape [0]).
    column = kte.embedding_column(
        kte.categorical_column_with_identity("ids", 300), 4
    )
    traced = kte.TPUEmbeddingLayer([column], output="concat")
    tf.function(lambda x: traced({"ids": x}))(tf.constant([[1]], tf.int64))
    values = traced.table_variable("ids").numpy()
    assert values.shape == (300, 4) and np.all(np.isfinite(values))
    assert np.std(values) > 0


# Rows made alone (issue 39, "initializers per shard"; issue 41, item 7).
# The cases are generated (tests/initializer_cases.py): every initializer
# class Keras exports, TF's public ones, pretrained matrices given every way.

SHAPE = (1003, 5)
# With blocks of 101 rows: ranges across blocks, off the 4-value groups.
RANGES = [(0, 1003), (7, 500), (333, 1), (100, 0), (401, 602)]


@pytest.fixture
def blocks_of_101_rows(monkeypatch):
    monkeypatch.setattr(initialization, "BLOCK_BYTES", 4 * 5 * 101)


def _bits(values):
    """float32 values as their bits: -0.0 differs from 0.0."""
    return np.asarray(values, np.float32).view(np.uint32)


def _whole(initializer, shape):
    """The table one device makes: the initializer called once."""
    return np.asarray(initializer(shape, dtype="float32"), np.float32)


def test_every_keras_initializer_class_is_a_case():
    """So that an initializer Keras adds is tested on every hardware kind
    (or named as unusable for tables)."""
    for cls in cases.keras_classes():
        assert cls in cases.NOT_FOR_TABLES or (
            cls.__name__ in cases.DETERMINISTIC
        )


@pytest.mark.parametrize("name", sorted(cases.DETERMINISTIC))
def test_row_local_is_claimed_for_the_expected_kinds(name):
    initializer = cases.DETERMINISTIC[name](SHAPE)
    assert initialization.row_local(initializer) == cases.makes_rows_alone(name)


@pytest.mark.parametrize("name", sorted(cases.DETERMINISTIC))
def test_rows_are_the_one_device_tables_rows_eagerly_and_traced(
    name, blocks_of_101_rows
):
    """Bit for bit, in a trace too: `EngineInitializer(Constant(0.1))`
    failed inside SparseCore's initializer trace (`tf.rank(value) == 0`
    as a Python bool), and `Constant(matrix)` in `_is_zero`."""
    initializer = cases.DETERMINISTIC[name](SHAPE)
    whole = _bits(_whole(initializer, SHAPE))

    def ranges():
        return [
            initialization.table_rows(
                initializer, SHAPE, start, count, "float32"
            )
            for start, count in RANGES
        ]

    for rows in (ranges(), tf.function(ranges)()):
        for (start, count), values in zip(RANGES, rows):
            want = whole[start : start + count]
            np.testing.assert_array_equal(_bits(values), want)


@pytest.mark.parametrize(
    "name", sorted(n for n in cases.DETERMINISTIC if cases.makes_rows_alone(n))
)
def test_rows_made_alone_never_ask_for_the_whole_table(
    name, monkeypatch, blocks_of_101_rows
):
    """Glorot, He, Lecun, VarianceScaling and Identity were called for the
    whole table on every pod host, which then kept its slice of it."""
    initializer = cases.DETERMINISTIC[name](SHAPE)
    whole = _bits(_whole(initializer, SHAPE))
    shapes = cases.recording_calls(monkeypatch, initializer)
    engine = initialization.EngineInitializer(initializer)
    shards = _shards(engine, SHAPE, 2)
    np.testing.assert_array_equal(_bits(np.concatenate(shards)), whole)
    assert SHAPE not in shapes, shapes


@pytest.mark.parametrize("name", sorted(cases.DETERMINISTIC))
def test_tables_held_on_cpu_fill_by_blocks_bit_for_bit(
    name, monkeypatch, blocks_of_101_rows
):
    initializer = cases.DETERMINISTIC[name](SHAPE)
    whole = _bits(_whole(initializer, SHAPE))
    # A table of zeros is created with zeros: nothing to fill.
    by_blocks = cases.makes_rows_alone(name) and whole.any()
    if by_blocks:
        shapes = cases.recording_calls(monkeypatch, initializer)
    table = initialization.create_table(_Holder(), "t", SHAPE, initializer)
    np.testing.assert_array_equal(_bits(table.numpy()), whole)
    if by_blocks:
        assert SHAPE not in shapes, shapes


@pytest.mark.parametrize("name", sorted(cases.STATEFUL))
def test_fresh_draws_are_scaled_from_the_whole_tables_shape(name, monkeypatch):
    """A `SeedGenerator` seed (or TF's unseeded initializers) draws a new
    table per call, on one device too: a shard's rows are new numbers,
    distributed as the whole table's (the scale of `VarianceScaling` is
    the whole shape's, not the shard's or the block's)."""
    from types import SimpleNamespace

    monkeypatch.setattr(initialization, "BLOCK_BYTES", 4 * 64 * 100)
    shape = (4000, 64)
    reference = _whole(cases.stateless_twin(name, shape), shape)
    engine = initialization.EngineInitializer(cases.STATEFUL[name](shape))
    shard = SimpleNamespace(shape=(1500, 64), offset=(2500, 0))
    rows = np.asarray(engine(shape, tf.float32, shard_info=shard))
    again = np.asarray(engine(shape, tf.float32, shard_info=shard))
    assert rows.shape == (1500, 64)
    assert not np.array_equal(rows, again)
    assert len({block.tobytes() for block in rows.reshape(15, -1)}) == 15
    spread = reference.std()
    for quantile in (0.01, 0.25, 0.5, 0.75, 0.99):
        assert abs(
            np.quantile(rows, quantile) - np.quantile(reference, quantile)
        ) < (0.05 * spread), quantile
    assert rows.min() >= reference.min() - 0.5 * spread
    assert rows.max() <= reference.max() + 0.5 * spread


def test_a_rotated_shard_continues_at_the_first_row():
    """SparseCore rotates each table's shards (`tpu_embedding_v3.py`,
    `_get_shard_info_for_table`): a shard may run past the last row."""
    from types import SimpleNamespace

    glorot = keras.initializers.GlorotUniform(seed=1)
    engine = initialization.EngineInitializer(glorot)
    shard = SimpleNamespace(shape=(4, 4), offset=(6, 0))
    rows = engine((8, 4), tf.float32, shard_info=shard)
    whole = glorot((8, 4)).numpy()
    np.testing.assert_array_equal(rows, np.concatenate([whole[6:], whole[:2]]))


def test_rows_outside_the_table_are_refused():
    with pytest.raises(ValueError, match=r"Rows \[6, 9\) are not rows"):
        initialization.table_rows(keras.initializers.Ones(), (8, 4), 6, 3)


@pytest.mark.parametrize(
    "name",
    sorted(n for n in cases.DETERMINISTIC if not cases.makes_rows_alone(n)),
)
def test_whole_table_initializers_are_refused_on_large_sharded_tables(
    name, monkeypatch
):
    """Above `WHOLE_TABLE_LIMIT_BYTES` every host would make the whole
    table to keep its rows."""
    shape = (7, 5)
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", shape[0]),
        shape[1],
        initializer=cases.DETERMINISTIC[name](shape),
    )
    initializer = _engine_initializer(column)
    whole = _one_device(initializer, shape)
    limit = 7 * 5 * 4 - 1
    monkeypatch.setattr(
        initialization, "WHOLE_TABLE_LIMIT_BYTES", limit, raising=False
    )
    described = re.escape(describe(column.initializer))
    with pytest.raises(
        ValueError,
        match=(
            rf"Table 'item' \(columns item_embedding\) of shape \(7, 5\).*"
            rf"its initializer {described} makes the table as a whole.*"
            r"WHOLE_TABLE_LIMIT_BYTES \(139 bytes\).*GlorotUniform.*"
            r"Constant\(matrix\).*ckpt_to_load_from"
        ),
    ):
        _shards(initializer, shape, 2)
    # One host holds the whole table: made as one device makes it.
    np.testing.assert_array_equal(_shards(initializer, shape, 1)[0], whole)


@pytest.mark.parametrize("name", sorted(cases.PRETRAINED))
def test_pretrained_tables_on_cpu(name):
    """Issue 41, item 7: each failed at build or construction (only
    `tf.constant_initializer(matrix)` worked)."""
    shape = (8200, 128)  # larger than one block
    assert shape[0] * shape[1] * 4 > initialization.BLOCK_BYTES
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", shape[0]),
        shape[1],
        initializer=cases.PRETRAINED[name](shape),
    )
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    layer.build()
    want = cases.pretrained_values(name, shape)
    np.testing.assert_array_equal(layer.table_variable("item").numpy(), want)
    ids = np.array([[8199], [3]], np.int64)
    np.testing.assert_array_equal(layer({"item": ids}), want[[8199, 3]])


def test_the_engines_initializer_answers_for_any_rows():
    """SparseCore holds the `TableConfig`'s initializer: `table_rows` of
    it makes the rows alone, as of the column's initializer."""
    glorot = keras.initializers.GlorotUniform(seed=2)
    engine = initialization.EngineInitializer(glorot)
    rows = initialization.table_rows(engine, (50, 4), 13, 20)
    np.testing.assert_array_equal(rows, glorot((50, 4))[13:33])
