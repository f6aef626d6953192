"""SparseCore tables are made one SparseCore's rows at a time.

`TPUEmbeddingV2` (TF's own, under `emulated_tpu(embedding_feature="V2")`)
asks each table's initializer for each SparseCore's rows of the padded,
stacked table; the engine answers from the rows the column's initializer
makes on one device, a block at a time, so no table is ever made whole on
the client and every table starts where the same column's CPU table does,
bit for bit. A table whose rows come from a checkpoint
(`ckpt_to_load_from`) or a constant matrix starts from them, also when
TF's stacking pads it.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models
from tests.emulated import sparsecore_training_test as training


def _full_shapes(model):
    shapes = set()
    for name, variable in kte.engine_checkpoint(model).named_variables():
        if "/" not in name:
            shapes.add(tuple(int(d) for d in variable.shape))
    return shapes


def test_tables_are_made_per_sparse_core_as_on_cpu(monkeypatch):
    # Every call of the Keras initializers the columns use is recorded; the
    # columns' own (TruncatedNormal) draws with an integer seed.
    calls = []
    for kind in (
        keras.initializers.TruncatedNormal,
        keras.initializers.RandomNormal,
    ):
        original = kind.__call__

        def recording(self, shape, dtype=None, _original=original, **kwargs):
            calls.append(tuple(int(d) for d in shape))
            return _original(self, shape, dtype=dtype, **kwargs)

        monkeypatch.setattr(kind, "__call__", recording)
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        keras.utils.set_random_seed(models.SEED)
        with strategy.scope():
            model = training.build(models.OPTIMIZERS["adagrad"]())
        calls.clear()
        # The engine makes its tables at the first step; predict trains
        # nothing.
        model.predict(
            kte.distribute_dataset(
                strategy, training.dataset(), models.GLOBAL_BATCH
            ),
            steps=1,
            verbose=0,
        )
        created = training._tables(model)
        full = _full_shapes(model)
    assert full == {(40, 4), (30, 4), (12, 2)}
    assert not [shape for shape in calls if shape in full]
    keras.utils.set_random_seed(models.SEED)
    cpu = training._tables(training.build(models.OPTIMIZERS["adagrad"]()))
    assert sorted(created) == sorted(cpu)
    for name in cpu:
        np.testing.assert_array_equal(created[name], cpu[name], name)


ROWS = 16


def _padded_columns(kind, pretrained, tmp_path):
    # 40 x 4 and 12 x 2: TF pads both to 64 rows (8 per SparseCore of 8)
    # and 8 columns.
    if kind == "checkpoint":
        path = tf.train.Checkpoint(table=tf.Variable(pretrained)).write(
            str(tmp_path / "pretrained")
        )
        given = {
            "ckpt_to_load_from": path,
            "tensor_name_in_ckpt": "table/.ATTRIBUTES/VARIABLE_VALUE",
        }
    else:
        given = {"initializer": tf.constant_initializer(pretrained)}
    item = kte.embedding_column(
        kte.categorical_column_with_identity("item", 40), 4, **given
    )
    genres = kte.embedding_column(
        kte.categorical_column_with_identity("genres", 12), 2, combiner="sum"
    )
    return [item, genres]


def _padded_model(columns):
    inputs = {
        key: keras.Input((None,), dtype="int64", name=key, sparse=True)
        for key in ("item", "genres")
    }
    embedded = kte.TPUEmbeddingLayer(
        columns,
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
        name="embed",
    )(inputs)
    joined = keras.layers.Concatenate()(
        [embedded["item_embedding"], embedded["genres_embedding"]]
    )
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(joined))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _padded_dataset():
    rng = np.random.default_rng(5)
    # One id per example, 0 included (from_dense would drop it).
    indices = np.stack([np.arange(ROWS), np.zeros(ROWS, int)], axis=1)
    features = {
        key: tf.SparseTensor(indices, rng.integers(0, rows, ROWS), [ROWS, 1])
        for key, rows in (("item", 40), ("genres", 12))
    }
    labels = rng.normal(size=(ROWS, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels))


def _train_padded(strategy, columns):
    """The tables as made, and after two epochs."""
    keras.utils.set_random_seed(models.SEED)
    with strategy.scope():
        model = _padded_model(columns)
    batches = kte.distribute_dataset(strategy, _padded_dataset(), 8)
    model.predict(batches, steps=1, verbose=0)
    made = training._tables(model)
    model.fit(batches, epochs=2, verbose=0)
    return made, training._tables(model)


@pytest.mark.parametrize("kind", ["checkpoint", "constant"])
def test_pretrained_tables_that_tf_pads_train_as_on_cpu(tmp_path, kind):
    pretrained = np.random.default_rng(9).normal(size=(40, 4))
    pretrained = pretrained.astype(np.float32)
    columns = _padded_columns(kind, pretrained, tmp_path)
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        made, on_sparse_core = _train_padded(strategy, columns)
    np.testing.assert_array_equal(made["item"], pretrained)
    _, on_cpu = _train_padded(tf.distribute.get_strategy(), columns)
    assert not np.allclose(on_cpu["item"], pretrained)
    models.assert_values_equal(on_sparse_core, on_cpu)
