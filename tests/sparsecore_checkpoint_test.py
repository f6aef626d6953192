"""SparseCore tables in TensorFlow checkpoints, without a TPU.

A stand-in engine holds two tables in TF's stacking (`sparsecore_layout.
stacking_layouts`), on stand-in stacked variables (one `tf.Variable` per
chip, as `TPUEmbeddingShardedVariable.values`); the emulated SparseCore
runs the same checkpoints against TF's own `TPUEmbeddingV2` in
`tests/emulated/sparsecore_checkpoint_test.py`.
"""

import types

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3_utils

import keras_tpu_embed as kte
from keras_tpu_embed.tables import sparsecore_checkpoint
from keras_tpu_embed.tables import sparsecore_layout
from keras_tpu_embed.tables import sparsecore_shards

E = tf.tpu.experimental.embedding
SHAPES = {"item": (40, 4), "genres": (12, 2)}


class StandInEngine:
    """Two Adagrad tables on 2 chips of 4 SparseCores each."""

    def __init__(self, created=True):
        adagrad = E.Adagrad(0.1)
        features = {
            name: E.FeatureConfig(
                E.TableConfig(*shape, name=name, optimizer=adagrad),
                output_shape=[8],
            )
            for name, shape in SHAPES.items()
        }
        self.layouts = sparsecore_layout.stacking_layouts(features, 2, 4)
        self.variables = {}
        for layout in self.layouts.values():
            rows = (
                layout.num_sparse_cores
                * layout.total_rows_per_sparse_core_shard
            )
            width = layout.unsharded_padded_shape[1]
            for slot in ("parameters", "accumulators"):
                key = (layout.stacked_table_name, slot)
                if key not in self.variables:
                    self.variables[key] = types.SimpleNamespace(
                        values=[
                            tf.Variable(tf.zeros([rows // 2, width]))
                            for _ in range(2)
                        ]
                    )
        self.created = created
        self.pending = {}

    def table_slots(self, table):
        return {
            "parameters": list(SHAPES[table]),
            "accumulators": list(SHAPES[table]),
        }

    def tables_created(self):
        return self.created

    def table_layout(self, table):
        return self.layouts[table]

    def stacked_variable(self, table, slot):
        return self.variables[(self.layouts[table].stacked_table_name, slot)]

    def read_tables(self, tables):
        if not self.created:
            raise RuntimeError("run one step")
        return {
            (table, slot): sparsecore_shards.read_table(
                self.stacked_variable(table, slot), self.layouts[table]
            )
            for table in tables
            for slot in self.table_slots(table)
        }

    def write_tables(self, values):
        for (table, slot), rows in values.items():
            assert list(rows.shape) == list(SHAPES[table])
            if not self.created:
                self.pending[(table, slot)] = rows
            else:
                sparsecore_shards.write_table(
                    self.stacked_variable(table, slot),
                    self.layouts[table],
                    rows,
                )

    def container(self):
        """What a layer's `embedding_tables` holds for these tables."""
        container = sparsecore_checkpoint.TableContainer("embedding_tables")
        values = {}
        for table in SHAPES:
            for slot in self.table_slots(table):
                name = sparsecore_checkpoint.local_name(table, slot)
                values[name] = sparsecore_checkpoint.SparseCoreTable(
                    self, table, slot
                )
        setattr(
            container,
            sparsecore_checkpoint.SPARSE_CORE,
            sparsecore_checkpoint.SparseCoreTableValues(values),
        )
        for table in SHAPES:
            for slot in self.table_slots(table):
                name = sparsecore_checkpoint.local_name(table, slot)
                setattr(
                    container,
                    name,
                    sparsecore_checkpoint.EngineTableHandle(self, table, slot),
                )
        return container


def _values(seed):
    rng = np.random.default_rng(seed)
    return {
        sparsecore_checkpoint.local_name(table, slot): rng.normal(
            size=shape
        ).astype(np.float32)
        for table, shape in SHAPES.items()
        for slot in ("parameters", "accumulators")
    }


def _filled(values):
    engine = StandInEngine()
    for name, value in values.items():
        table, _, slot = name.partition("/")
        engine.write_tables(
            {(table, slot or "parameters"): sparsecore_shards.ArrayRows(value)}
        )
    return engine


def _cpu_layer(seed):
    tf.keras.utils.set_random_seed(seed)
    layer = kte.TPUEmbeddingLayer(
        [
            kte.embedding_column(
                kte.categorical_column_with_identity(name, rows), dim
            )
            for name, (rows, dim) in SHAPES.items()
        ],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
    )
    layer.build()
    return layer


def _cpu_values(layer):
    return {
        name: np.asarray(
            variable.read() if hasattr(variable, "read") else variable
        )
        for name, variable in kte.engine_checkpoint(layer).named_variables()
    }


def _assert_bit_equal(actual, expected):
    assert sorted(actual) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], name)


def test_sparse_core_tables_are_saved_by_sparse_core_under_their_names(
    tmp_path,
):
    values = _values(0)
    engine = _filled(values)
    path = tf.train.Checkpoint(embedding=engine.container()).write(
        str(tmp_path / "c")
    )
    reader = tf.train.load_checkpoint(path)
    shapes = reader.get_variable_to_shape_map()
    key = "embedding/_sparse_core/{}/.ATTRIBUTES/{}".format
    for name, value in values.items():
        table = name.partition("/")[0]
        layout = engine.layouts[table]
        escaped = name.replace("/", ".S")
        assert shapes[key(escaped, "VARIABLE_VALUE")] == [8, 8, 8]
        padded = np.zeros(layout.unsharded_padded_shape, np.float32)
        padded[: value.shape[0], : value.shape[1]] = value
        np.testing.assert_array_equal(
            reader.get_tensor(key(escaped, "VARIABLE_VALUE")),
            tpu_embedding_v3_utils.shard_table(8, padded)
            .numpy()
            .reshape(8, 8, 8),
        )
        saved = type(layout)()
        saved.ParseFromString(
            reader.get_tensor(key(escaped, "SPARSECORE_LAYOUT"))
        )
        assert saved == layout
        # The name holds no value: a CPU variable of that name binds to it.
        assert f"embedding/{escaped}/.ATTRIBUTES/VARIABLE_VALUE" not in shapes
    assert sparsecore_checkpoint.saved_table_shapes(path, "embedding") == {
        f"embedding/{name.replace('/', '.S')}/.ATTRIBUTES/VARIABLE_VALUE": list(
            SHAPES[name.partition("/")[0]]
        )
        for name in values
    }


@pytest.mark.parametrize("how", ["restore_tables", "checkpoint"])
def test_cpu_models_read_sparse_core_tables_by_name(tmp_path, how):
    values = _values(1)
    path = tf.train.Checkpoint(embedding=_filled(values).container()).write(
        str(tmp_path / "c")
    )
    layer = _cpu_layer(2)
    assert not np.array_equal(_cpu_values(layer)["item"], values["item"])
    if how == "restore_tables":
        kte.restore_tables(layer, path)
    else:
        # A checkpoint of the mid-level object holds no embedding steps.
        tf.train.Checkpoint(
            embedding=kte.engine_checkpoint(layer, steps=False)
        ).read(path).assert_existing_objects_matched()
    _assert_bit_equal(_cpu_values(layer), values)


@pytest.mark.parametrize("created", [True, False])
def test_sparse_core_tables_read_cpu_checkpoints_by_name(tmp_path, created):
    layer = _cpu_layer(3)
    values = _cpu_values(layer)
    path = tf.train.Checkpoint(embedding=kte.engine_checkpoint(layer)).write(
        str(tmp_path / "c")
    )
    engine = StandInEngine(created=created)
    tf.train.Checkpoint(embedding=engine.container()).read(
        path
    ).assert_existing_objects_matched()
    if created:
        restored = {
            sparsecore_checkpoint.local_name(table, slot): value
            for (table, slot), value in engine.read_tables(list(SHAPES)).items()
        }
    else:
        # Held as the checkpoint's rows until TF creates the tables.
        restored = {
            sparsecore_checkpoint.local_name(table, slot): np.asarray(rows)
            for (table, slot), rows in engine.pending.items()
        }
    _assert_bit_equal(restored, values)


def test_saving_before_the_tables_exist_is_refused(tmp_path):
    engine = StandInEngine(created=False)
    with pytest.raises(ValueError, match="run one step"):
        tf.train.Checkpoint(embedding=engine.container()).write(
            str(tmp_path / "c")
        )


def test_a_table_of_another_shape_is_refused_by_name(tmp_path):
    path = tf.train.Checkpoint(table=tf.Variable(tf.zeros([41, 4]))).write(
        str(tmp_path / "c")
    )
    with pytest.raises(
        ValueError, match=r"'item' of shape \[40, 4\].*\[41, 4\]"
    ):
        sparsecore_checkpoint.checkpoint_rows(
            path, "table/.ATTRIBUTES/VARIABLE_VALUE", "item", [40, 4]
        )
