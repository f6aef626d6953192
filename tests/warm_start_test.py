"""Warm start from feature-column and TPUEstimator checkpoints.

Feature-column checkpoints are written by TF's own legacy code
(`tf.compat.v1.feature_column.input_layer` in a graph, saved with
`tf.compat.v1.train.Saver`), so their variable names are TF's. No
TPUEstimator can run here: its checkpoints are built with the names and
layout its sources give (see `keras_tpu_embed/saving/warm_start.py`): the table
as a variable partitioned over the hosts with `fixed_size_partitioner`,
each row where TF1's own "mod" `embedding_lookup` reads it, and the Adagrad
slot `<table>/Adagrad` beside it.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.tables import initialization

fc = tf.feature_column
V1 = tf.compat.v1

FEATURES = {
    "item": [[1, 3], [0, -1], [5, 5]],
    "s1": [[2, -1], [4, 1], [0, -1]],
    "s2": [[3, -1], [-1, -1], [1, 2]],
}


def _shared_categoricals():
    return [
        fc.categorical_column_with_identity("s1", 5),
        fc.categorical_column_with_identity("s2", 5),
    ]


def _tf_columns(legacy=False):
    """The legacy model's columns; `legacy`: TF1's shared columns, which
    `input_layer` takes (ours: the same table from kte)."""
    item = fc.embedding_column(
        fc.categorical_column_with_identity("item", 6), 3, combiner="sum"
    )
    shared_columns = (
        V1.feature_column.shared_embedding_columns
        if legacy
        else kte.shared_embedding_columns
    )
    shared = shared_columns(
        _shared_categoricals(), 2, shared_embedding_collection_name="s_shared"
    )
    return [item] + shared


def _legacy_checkpoint(directory):
    """Trains nothing: random tables, saved by TF's legacy graph code.

    Returns the checkpoint prefix and the legacy (concatenated) output.
    """
    with tf.Graph().as_default():
        columns = _tf_columns(legacy=True)
        features = {}
        for key, rows in FEATURES.items():
            dense = tf.constant(rows, tf.int64)
            # -1 entries are padding, dropped as the layer drops them.
            where = tf.where(tf.not_equal(dense, -1))
            features[key] = tf.SparseTensor(
                where, tf.gather_nd(dense, where), tf.shape(dense, tf.int64)
            )
        # One input_layer: columns concatenated in name order.
        outputs = V1.feature_column.input_layer(features, columns)
        saver = V1.train.Saver()
        with V1.Session() as session:
            session.run(V1.global_variables_initializer())
            names = [v.name for v in V1.global_variables()]
            values = session.run(outputs)
            prefix = saver.save(session, str(directory / "legacy"))
    assert "input_layer/item_embedding/embedding_weights:0" in names
    assert "input_layer/s_shared/embedding_weights:0" in names
    return prefix, values


def _layer(columns=None, output="dict"):
    layer = kte.TPUEmbeddingLayer(columns or _tf_columns(), output=output)
    layer.build()
    return layer


def _features():
    return {k: tf.constant(v, tf.int64) for k, v in FEATURES.items()}


def test_feature_column_checkpoint_gives_legacy_outputs(tmp_path):
    prefix, legacy = _legacy_checkpoint(tmp_path)
    layer = _layer(output="concat")
    report = kte.warm_start(layer, prefix)
    assert report.loaded == {
        "item": "input_layer/item_embedding/embedding_weights",
        "s_shared": "input_layer/s_shared/embedding_weights",
    }
    assert report.not_found == {}
    ours = layer(_features())
    np.testing.assert_allclose(ours.numpy(), legacy, atol=1e-6)


def test_tables_not_in_the_checkpoint_are_reported(tmp_path):
    prefix, _ = _legacy_checkpoint(tmp_path)
    extra = kte.embedding_column(
        kte.categorical_column_with_identity("other", 4), 2
    )
    layer = _layer(_tf_columns() + [extra])
    before = layer.table_variable("other").numpy().copy()
    with pytest.warns(UserWarning, match="other.*other_embedding"):
        report = kte.warm_start(layer, prefix)
    assert report.not_found == {"other": ["other_embedding/embedding_weights"]}
    np.testing.assert_array_equal(layer.table_variable("other").numpy(), before)


def test_wrong_shape_names_tensor_checkpoint_and_both_shapes(tmp_path):
    prefix, _ = _legacy_checkpoint(tmp_path)
    wide = kte.embedding_column(
        kte.categorical_column_with_identity("item", 6), 4
    )
    with pytest.raises(ValueError, match=r"item_embedding.*\[6, 3\].*\[6, 4\]"):
        kte.warm_start(_layer([wide]), prefix)


def test_vocabulary_change_moves_rows_by_token(tmp_path):
    old_vocabulary = ["a", "b", "c", "d"]
    new_vocabulary = ["d", "new", "a"]
    old_values = np.arange(12, dtype=np.float32).reshape(4, 3)
    with tf.Graph().as_default():
        V1.get_variable(
            "input_layer/w_embedding/embedding_weights",
            initializer=tf.constant(old_values),
        )
        with V1.Session() as session:
            session.run(V1.global_variables_initializer())
            prefix = V1.train.Saver().save(session, str(tmp_path / "v"))
    column = kte.embedding_column(
        kte.categorical_column_with_vocabulary_list(
            "w", new_vocabulary, num_oov_buckets=1
        ),
        3,
    )
    layer = _layer([column])
    initial = layer.table_variable("w").numpy().copy()
    kte.warm_start(
        layer, prefix, vocabularies={"w": (old_vocabulary, new_vocabulary)}
    )
    table = layer.table_variable("w").numpy()
    np.testing.assert_array_equal(table[0], old_values[3])  # "d"
    np.testing.assert_array_equal(table[2], old_values[0])  # "a"
    # The new token and the OOV bucket keep the column's initial values.
    np.testing.assert_array_equal(table[[1, 3]], initial[[1, 3]])


TABLE_KEY = "input_layer/item_embedding/embedding_weights"


def tpu_estimator_checkpoint(directory, logical, accumulators, num_hosts):
    """A checkpoint laid out as a TPUEstimator run with "mod" sharding
    writes it: the table and its Adagrad slot partitioned over the hosts by
    `fixed_size_partitioner`, each row where TF1's own "mod" lookup
    (`tf.compat.v1.nn.embedding_lookup(..., partition_strategy="mod")`)
    reads it. The rows are placed by asking that lookup, not by the layout
    `unshard_mod` assumes. What this cannot catch: that TPUEstimator itself
    shards with `fixed_size_partitioner` and "mod" (its sources say so; no
    TPUEstimator runs here)."""
    name = TABLE_KEY
    with tf.Graph().as_default():
        shards = {
            variable_name: list(
                V1.get_variable(
                    variable_name,
                    shape=logical.shape,
                    initializer=V1.zeros_initializer(),
                    partitioner=V1.fixed_size_partitioner(num_hosts),
                )
            )
            for variable_name in (name, name + "/Adagrad")
        }
        sizes = [int(shard.shape[0]) for shard in shards[name]]
        ids = tf.range(len(logical))

        def write(variable_name, stored):
            parts = np.split(stored, np.cumsum(sizes)[:-1])
            return [
                shard.assign(part)
                for shard, part in zip(shards[variable_name], parts)
            ]

        def lookup(variable_name):
            return V1.nn.embedding_lookup(
                shards[variable_name], ids, partition_strategy="mod"
            )

        with V1.Session() as session:
            # Each stored row holds its own position: the lookup of id i
            # then says which stored row TF's "mod" strategy reads for i.
            position = np.repeat(
                np.arange(len(logical), dtype=np.float32)[:, None],
                logical.shape[1],
                axis=1,
            )
            session.run(write(name, position))
            reads = session.run(lookup(name))[:, 0].astype(int)
            assert sorted(reads) == list(range(len(logical)))
            for variable_name, values in (
                (name, logical),
                (name + "/Adagrad", accumulators),
            ):
                stored = np.empty_like(values)
                stored[reads] = values
                session.run(write(variable_name, stored))
                np.testing.assert_array_equal(
                    session.run(lookup(variable_name)), values
                )
            return V1.train.Saver().save(session, str(directory / "tpu"))


def test_mod_sharded_tpu_estimator_table_and_slots(tmp_path):
    logical = np.arange(14 * 2, dtype=np.float32).reshape(14, 2)
    accumulators = logical + 100.0
    prefix = tpu_estimator_checkpoint(tmp_path, logical, accumulators, 3)
    shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    assert shapes["input_layer/item_embedding/embedding_weights"] == [14, 2]
    column = tf.compat.v1.tpu.experimental.embedding_column(
        fc.categorical_column_with_identity("item", 14), 2
    )
    layer = kte.TPUEmbeddingLayer(
        [column],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
    )
    layer.build()
    report = kte.warm_start(
        layer, prefix, partition_strategy="mod", num_shards=3, slots=True
    )
    table = "input_layer/item_embedding/embedding_weights"
    assert report.slots == {"item": {"accumulators": table + "/Adagrad"}}
    np.testing.assert_array_equal(layer.table_variable("item").numpy(), logical)
    np.testing.assert_array_equal(
        layer.slot_variables("item")["accumulators"].numpy(), accumulators
    )
    # Read as "div", the same checkpoint gives the stored (host) order.
    kte.warm_start(layer, prefix)
    assert not np.array_equal(layer.table_variable("item").numpy(), logical)


def test_mod_needs_the_number_of_shards(tmp_path):
    with pytest.raises(ValueError, match="num_shards"):
        kte.warm_start(_layer(), str(tmp_path), partition_strategy="mod")


def test_tf2_shared_embeddings_variable_is_found(tmp_path):
    values = np.arange(10, dtype=np.float32).reshape(5, 2)
    with tf.Graph().as_default():
        shared = fc.shared_embeddings(
            _shared_categoricals(),
            2,
            shared_embedding_collection_name="s_shared",
        )
        # What DenseFeatures creates: one variable named after the table.
        variable = shared[0].shared_embedding_column_creator.embedding_weights
        assert variable.name == "s_shared:0"
        with V1.Session() as session:
            session.run(variable.assign(values))
            prefix = V1.train.Saver([variable]).save(
                session, str(tmp_path / "s")
            )
    layer = _layer(_tf_columns()[1:])
    assert kte.warm_start(layer, prefix).loaded == {"s_shared": "s_shared"}
    np.testing.assert_array_equal(
        layer.table_variable("s_shared").numpy(), values
    )


def test_slots_of_a_tf1_optimizer_are_loaded(tmp_path):
    # The slot is created by TF's own AdagradOptimizer, named by TF.
    with tf.Graph().as_default():
        column = fc.embedding_column(
            fc.categorical_column_with_identity("item", 6), 3
        )
        ids = tf.SparseTensor(
            [[0, 0], [1, 0]], tf.constant([1, 4], tf.int64), [2, 1]
        )
        out = V1.feature_column.input_layer({"item": ids}, [column])
        train = V1.train.AdagradOptimizer(0.5).minimize(tf.reduce_sum(out))
        with V1.Session() as session:
            session.run(V1.global_variables_initializer())
            session.run(train)
            names = [v.op.name for v in V1.global_variables()]
            prefix = V1.train.Saver().save(session, str(tmp_path / "adagrad"))
    table = "input_layer/item_embedding/embedding_weights"
    assert table + "/Adagrad" in names
    reader = tf.train.load_checkpoint(prefix)
    layer = kte.TPUEmbeddingLayer(
        [column],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.5)),
    )
    layer.build()
    report = kte.warm_start(layer, prefix, slots=True)
    assert report.slots == {"item": {"accumulators": table + "/Adagrad"}}
    np.testing.assert_array_equal(
        layer.slot_variables("item")["accumulators"].numpy(),
        reader.get_tensor(table + "/Adagrad"),
    )


def _vocabulary_checkpoint(directory, values):
    with tf.Graph().as_default():
        V1.get_variable(
            "input_layer/w_embedding/embedding_weights",
            initializer=tf.constant(values),
        )
        with V1.Session() as session:
            session.run(V1.global_variables_initializer())
            return V1.train.Saver().save(session, str(directory / "v"))


def _vocabulary_layer(vocabulary, dimension=3, dtype="string"):
    column = kte.embedding_column(
        kte.categorical_column_with_vocabulary_list(
            "w", vocabulary, dtype=dtype, num_oov_buckets=1
        ),
        dimension,
    )
    return _layer([column])


@pytest.mark.parametrize("num_shards", [-1, 0, 2.7, True, "3"])
def test_mod_refuses_a_number_of_shards_that_is_not_positive(
    tmp_path, num_shards
):
    logical = np.arange(14 * 2, dtype=np.float32).reshape(14, 2)
    prefix = tpu_estimator_checkpoint(tmp_path, logical, logical, 3)
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 14), 2
    )
    layer = _layer([column])
    before = layer.table_variable("item").numpy().copy()
    with pytest.raises(ValueError, match=r"num_shards.*positive integer"):
        kte.warm_start(
            layer, prefix, partition_strategy="mod", num_shards=num_shards
        )
    np.testing.assert_array_equal(layer.table_variable("item").numpy(), before)


def test_vocabularies_key_that_is_no_table_is_refused(tmp_path):
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    prefix = _vocabulary_checkpoint(tmp_path, values)
    layer = _vocabulary_layer(["a", "b", "c"])
    before = layer.table_variable("w").numpy().copy()
    with pytest.raises(ValueError, match=r"vocabularies.*'x'.*\['w'\]"):
        kte.warm_start(layer, prefix, vocabularies={"x": (["a"], ["a"])})
    np.testing.assert_array_equal(layer.table_variable("w").numpy(), before)


def test_variable_names_key_that_is_no_table_is_refused(tmp_path):
    prefix, _ = _legacy_checkpoint(tmp_path)
    layer = _layer()
    before = layer.table_variable("item").numpy().copy()
    with pytest.raises(ValueError, match=r"variable_names.*'itme'.*'item'"):
        kte.warm_start(layer, prefix, variable_names={"itme": "x"})
    np.testing.assert_array_equal(layer.table_variable("item").numpy(), before)


def test_new_vocabulary_must_be_the_columns_own(tmp_path):
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    prefix = _vocabulary_checkpoint(tmp_path, values)
    layer = _vocabulary_layer(["d", "new", "a"])
    before = layer.table_variable("w").numpy().copy()
    # Not the column's order: rows would land on other tokens' ids.
    with pytest.raises(ValueError, match=r"'w'.*column's own vocabulary"):
        kte.warm_start(
            layer,
            prefix,
            vocabularies={"w": (["a", "b", "c", "d"], ["a", "new", "d"])},
        )
    # Longer than the table (was an IndexError).
    with pytest.raises(ValueError, match=r"'w'.*column's own vocabulary"):
        kte.warm_start(
            layer,
            prefix,
            vocabularies={
                "w": (["a", "b", "c", "d"], ["d", "new", "a", "b", "c"])
            },
        )
    np.testing.assert_array_equal(layer.table_variable("w").numpy(), before)


def test_vocabularies_without_common_tokens_are_refused(tmp_path):
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    prefix = _vocabulary_checkpoint(tmp_path, values)
    layer = _vocabulary_layer(["x", "y"])
    before = layer.table_variable("w").numpy().copy()
    with pytest.raises(ValueError, match=r"'w'.*no token in common"):
        kte.warm_start(
            layer, prefix, vocabularies={"w": (["a", "b", "c"], ["x", "y"])}
        )
    np.testing.assert_array_equal(layer.table_variable("w").numpy(), before)


def test_integer_old_vocabulary_against_string_column_is_refused(tmp_path):
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    prefix = _vocabulary_checkpoint(tmp_path, values)
    layer = _vocabulary_layer(["1", "2"])
    with pytest.raises(ValueError, match=r"old vocabulary of table 'w'.*int"):
        kte.warm_start(
            layer, prefix, vocabularies={"w": ([1, 2, 3], ["1", "2"])}
        )


def test_integer_vocabulary_file_remaps_an_integer_column(tmp_path):
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    prefix = _vocabulary_checkpoint(tmp_path, values)
    old_file = tmp_path / "old.txt"
    old_file.write_text("10\n20\n30\n40\n")
    layer = _vocabulary_layer([40, 99, 10], dtype="int64")
    kte.warm_start(
        layer, prefix, vocabularies={"w": (str(old_file), [40, 99, 10])}
    )
    table = layer.table_variable("w").numpy()
    np.testing.assert_array_equal(table[0], values[3])
    np.testing.assert_array_equal(table[2], values[0])


def test_old_vocabulary_longer_than_the_checkpoint_is_refused(tmp_path):
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    prefix = _vocabulary_checkpoint(tmp_path, values)
    layer = _vocabulary_layer(["c", "a"])
    with pytest.raises(ValueError, match=r"old vocabulary.*3 tokens.*2 rows"):
        kte.warm_start(
            layer, prefix, vocabularies={"w": (["a", "b", "c"], ["c", "a"])}
        )


def test_remap_with_another_dimension_names_both_shapes(tmp_path):
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    prefix = _vocabulary_checkpoint(tmp_path, values)
    layer = _vocabulary_layer(["d", "a"], dimension=5)
    with pytest.raises(ValueError, match=r"w_embedding.*\[4, 3\].*\[3, 5\]"):
        kte.warm_start(
            layer,
            prefix,
            vocabularies={"w": (["a", "b", "c", "d"], ["d", "a"])},
        )


def test_a_failing_table_leaves_every_table_unchanged(tmp_path):
    prefix, _ = _legacy_checkpoint(tmp_path)
    item = kte.embedding_column(
        kte.categorical_column_with_identity("item", 6), 3
    )
    # The checkpoint's shared table has dimension 2.
    shared = kte.shared_embedding_columns(
        [
            kte.categorical_column_with_identity("s1", 5),
            kte.categorical_column_with_identity("s2", 5),
        ],
        4,
        shared_embedding_collection_name="s_shared",
    )
    layer = _layer([item] + shared)
    assert [t.name for t in layer.table_specs] == ["item", "s_shared"]
    before = layer.table_variable("item").numpy().copy()
    with pytest.raises(ValueError, match="s_shared"):
        kte.warm_start(layer, prefix)
    np.testing.assert_array_equal(layer.table_variable("item").numpy(), before)


class _RecordingReader:
    """A checkpoint reader that records every whole tensor read."""

    def __init__(self, reader):
        self._reader = reader
        self.whole_reads = []

    def get_tensor(self, name):
        self.whole_reads.append(name)
        return self._reader.get_tensor(name)

    def __getattr__(self, name):
        return getattr(self._reader, name)


@pytest.fixture(name="reads")
def _reads(monkeypatch):
    """`(whole tensors read, slice specs RestoreV2 was asked for)`."""
    readers = []
    load_checkpoint = tf.train.load_checkpoint

    def recording_load(path):
        readers.append(_RecordingReader(load_checkpoint(path)))
        return readers[-1]

    specs = []
    restore = tf.raw_ops.RestoreV2

    def recording_restore(**kwargs):
        specs.extend(
            zip(kwargs["tensor_names"], kwargs["shape_and_slices"], strict=True)
        )
        return restore(**kwargs)

    monkeypatch.setattr(tf.train, "load_checkpoint", recording_load)
    monkeypatch.setattr(tf.raw_ops, "RestoreV2", recording_restore)
    return readers, specs


def _slice_rows(spec):
    """`(first row, rows)` of a slice spec such as `"14 2 5,5:0,2"`."""
    first, size = spec.split()[2].split(":")[0].split(",")
    return int(first), int(size)


def test_reads_one_stored_slice_at_a_time_never_a_whole_table(tmp_path, reads):
    """The TPUEstimator checkpoint stores each table and slot as 3 slices
    (one per host); each is read on its own, once, and never whole."""
    logical = np.arange(14 * 2, dtype=np.float32).reshape(14, 2)
    prefix = tpu_estimator_checkpoint(tmp_path, logical, logical + 100, 3)
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 14), 2
    )
    layer = kte.TPUEmbeddingLayer(
        [column],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
    )
    layer.build()
    kte.warm_start(
        layer, prefix, partition_strategy="mod", num_shards=3, slots=True
    )
    readers, specs = reads
    assert [reader.whole_reads for reader in readers] == [[]]
    stored = [(0, 5), (5, 5), (10, 4)]  # fixed_size_partitioner(3) of 14
    for tensor in (TABLE_KEY, TABLE_KEY + "/Adagrad"):
        pieces = sorted(_slice_rows(s) for name, s in specs if name == tensor)
        assert pieces == stored, tensor
    np.testing.assert_array_equal(layer.table_variable("item").numpy(), logical)
    np.testing.assert_array_equal(
        layer.slot_variables("item")["accumulators"].numpy(), logical + 100
    )


def test_tables_are_written_in_place_by_blocks(tmp_path, monkeypatch):
    # Blocks of 24 bytes: 2 rows of `item` (dimension 3), 3 of `s_shared`.
    monkeypatch.setattr(initialization, "BLOCK_BYTES", 2 * 3 * 4)
    prefix, legacy = _legacy_checkpoint(tmp_path)
    layer = _layer(output="concat")
    variable_class = type(layer.table_variable("item").value)
    assigned, scattered = [], []
    assign = keras.Variable.assign
    scatter = variable_class.scatter_update

    def recording_assign(variable, value):
        assigned.append(tuple(np.shape(value)))
        return assign(variable, value)

    def recording_scatter(variable, sparse_delta, *args, **kwargs):
        scattered.append(tuple(sparse_delta.values.shape))
        return scatter(variable, sparse_delta, *args, **kwargs)

    monkeypatch.setattr(keras.Variable, "assign", recording_assign)
    monkeypatch.setattr(variable_class, "scatter_update", recording_scatter)
    kte.warm_start(layer, prefix)
    assert assigned == []
    # item [6, 3] in 3 blocks, s_shared [5, 2] in 2.
    assert scattered == [(2, 3)] * 3 + [(3, 2), (2, 2)]
    np.testing.assert_allclose(layer(_features()).numpy(), legacy, atol=1e-6)


def test_mod_sharded_table_and_slots_remapped_by_token(tmp_path):
    logical = np.arange(14 * 2, dtype=np.float32).reshape(14, 2)
    prefix = tpu_estimator_checkpoint(tmp_path, logical, logical + 100, 3)
    old = [f"t{i}" for i in range(14)]
    new = ["t13", "fresh", "t0", "t5", "t7"]
    column = kte.embedding_column(
        kte.categorical_column_with_vocabulary_list(
            "item", new, num_oov_buckets=1
        ),
        2,
    )
    layer = kte.TPUEmbeddingLayer(
        [column],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
    )
    layer.build()
    table = layer.table_variable("item")
    initial = table.numpy().copy()
    report = kte.warm_start(
        layer,
        prefix,
        partition_strategy="mod",
        num_shards=3,
        slots=True,
        vocabularies={"item": (old, None)},
    )
    assert report.remapped == {"item": 4}
    moved = {0: 13, 2: 0, 3: 5, 4: 7}
    expected = initial.copy()
    expected_slot = np.full_like(initial, 0.1)
    for new_id, old_id in moved.items():
        expected[new_id] = logical[old_id]
        expected_slot[new_id] = logical[old_id] + 100
    np.testing.assert_array_equal(table.numpy(), expected)
    np.testing.assert_array_equal(
        layer.slot_variables("item")["accumulators"].numpy(), expected_slot
    )


def test_a_damaged_data_file_names_what_was_loaded(tmp_path):
    prefix, _ = _legacy_checkpoint(tmp_path)
    # The data file holds the tensors in key order, `s_shared` last:
    # damage its last bytes, so its checksum fails and `item` still reads.
    data = tmp_path / "legacy.data-00000-of-00001"
    content = bytearray(data.read_bytes())
    content[-4:] = b"\xff\xff\xff\xff"
    data.write_bytes(bytes(content))
    layer = _layer()
    before = layer.table_variable("s_shared").numpy().copy()
    with pytest.raises(
        ValueError, match=r"s_shared.*Already loaded from it: \['item'\]"
    ):
        kte.warm_start(layer, prefix)
    np.testing.assert_array_equal(
        layer.table_variable("s_shared").numpy(), before
    )
