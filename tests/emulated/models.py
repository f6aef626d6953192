"""One small model, trained under `emulated_tpu` and on one device.

The same global batches go to both: `kte.distribute_dataset` splits each
global batch of `GLOBAL_BATCH` rows between the replicas, and one device
(no strategy) sees the whole batch. Ids are dense int64, or with
`sparse=True` the same ids as `[batch, 1]` sparse tensors (see
`distributed_input_test.py` for several ids per example).
"""

import functools

import keras
import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu

GLOBAL_BATCH = 8
ROWS = 32
SEED = 1

OPTIMIZERS = {
    "sgd": lambda: kte.optimizers.SGD(0.1),
    "adagrad": lambda: kte.optimizers.Adagrad(0.1),
    # Adam divides by sqrt(v): where a row's gradients nearly cancel, the
    # replicas' float32 summation order shows at lr * 1e-4; a small rate
    # keeps that under the 1e-5 tolerance.
    "adam": lambda: kte.optimizers.Adam(0.01),
    "ftrl": lambda: kte.optimizers.FTRL(0.2, l1_regularization_strength=0.01),
}


def build(optimizer, item_on_tensor_core=False, sparse=False):
    """Two tables and a dense head; one id per example. With
    `item_on_tensor_core`, "item" is looked up on the tensor core: one layer
    with an engine table and a tensor-core table.

    On a TPU without an engine ("UNSUPPORTED") the tables fall back to the
    tensor core, which needs `tensor_core_shape`.

    TF's enqueue refuses dense ids of width > 1 (it reduces the last
    dimension only when it is 1), so multivalent ids are not used here.
    """
    user = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20),
        4,
        combiner="sum",
        tensor_core_shape=(None, 1),
    )
    item = kte.embedding_column(
        kte.categorical_column_with_identity("item", 15),
        3,
        combiner="mean",
        tensor_core_shape=(None, 1),
        embedding_lookup_device=(
            "tpu_tensor_core" if item_on_tensor_core else None
        ),
    )
    inputs = {
        key: keras.Input((1,), dtype="int64", name=key, sparse=sparse)
        for key in ("user", "item")
    }
    embedded = kte.TPUEmbeddingLayer(
        [user, item],
        config=kte.EmbeddingConfig(optimizer=optimizer),
        name="embed",
    )(inputs)
    joined = keras.layers.Concatenate()(
        [embedded["user_embedding"], embedded["item_embedding"]]
    )
    output = keras.layers.Dense(1, name="head")(joined)
    model = keras.Model(inputs, output)
    model.compile(optimizer="sgd", loss="mse")
    return model


def dataset(rows=ROWS, seed=0, sparse=False):
    rng = np.random.default_rng(seed)
    features = {
        "user": rng.integers(0, 20, (rows, 1)).astype(np.int64),
        "item": rng.integers(0, 15, (rows, 1)).astype(np.int64),
    }
    if sparse:
        # Every id kept, 0 too (tf.sparse.from_dense would drop it).
        indices = np.stack([np.arange(rows), np.zeros(rows, int)], axis=1)
        features = {
            key: tf.SparseTensor(indices, ids[:, 0], [rows, 1])
            for key, ids in features.items()
        }
    labels = rng.normal(size=(rows, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels))


def one_device(optimizer_name, epochs=2, sparse=False):
    """The reference: the model trained with no strategy."""
    keras.utils.set_random_seed(SEED)
    model = build(OPTIMIZERS[optimizer_name](), sparse=sparse)
    model.fit(
        batches(tf.distribute.get_strategy(), sparse=sparse),
        epochs=epochs,
        verbose=0,
    )
    return model


@functools.cache
def trained_one_device(optimizer_name, epochs=2, sparse=False):
    """`one_device`, trained once per process and shared by every test
    (of every file the process runs) that compares with it: each fit traces
    Keras' train step anew, seconds of CPU. Tests only read it (values,
    `evaluate`, `predict`, checkpoint writes); one that trains it further
    must call `one_device` for a model of its own."""
    return one_device(optimizer_name, epochs=epochs, sparse=sparse)


def batches(strategy, sparse=False):
    return kte.distribute_dataset(
        strategy, dataset(sparse=sparse), GLOBAL_BATCH
    )


def build_emulated(strategy, optimizer_name, sparse=False):
    keras.utils.set_random_seed(SEED)
    with strategy.scope():
        return build(OPTIMIZERS[optimizer_name](), sparse=sparse)


def engine_values(model):
    """Every engine table and slot, `<table>` and `<table>/<slot>`.

    Read from TF's mid-level object after its own retrieve (what a
    checkpoint save does first): its host variables are stale otherwise.
    """
    mid_level = model.get_layer("embed").engine.mid_level
    mid_level._retrieve_variables()
    values = {}
    for table, variables in mid_level._variables.items():
        for slot, variable in variables.items():
            name = table if slot == "parameters" else f"{table}/{slot}"
            values[name] = np.concatenate(
                [shard.numpy() for shard in variable.variables]
            )
    return values


def item_engine_values(strategy, column):
    """The engine tables of a one-column model ("item") after TF built
    them at a first step (a `predict`, which changes none)."""
    with strategy.scope():
        inputs = {"item": keras.Input((1,), dtype="int64", name="item")}
        layer = kte.TPUEmbeddingLayer([column], name="embed")
        model = keras.Model(inputs, layer(inputs)["item_embedding"])
        model.compile(loss="mse")
    assert layer.engine is not None
    items = tf.data.Dataset.from_tensor_slices(
        ({"item": np.zeros((8, 1), np.int64)}, np.zeros((8, 1), np.float32))
    )
    model.predict(kte.distribute_dataset(strategy, items, 8), verbose=0)
    return model, engine_values(model)


def engine_tables(model):
    """Every engine table and slot, V1 or V2 (SparseCore, unstacked from
    its chip layout), as `<table>` and `<table>/<slot>`, read through the
    engine as a save reads them."""
    engine = model.get_layer("embed").engine
    return {
        table if slot == "parameters" else f"{table}/{slot}": value
        for (table, slot), value in engine.read_tables(
            engine.table_names
        ).items()
    }


def table_values(model):
    """The tables and slots wherever they are: the engine or the layer."""
    if model.get_layer("embed").engine is not None:
        return engine_values(model)
    return local_values(model)


def local_values(model):
    """Every table and slot of a model that holds its tables itself."""
    layer = model.get_layer("embed")
    values = {}
    for spec in layer.local_table_specs:
        values[spec.name] = layer.table_variable(spec.name).numpy()
        for slot, variable in layer.slot_variables(spec.name).items():
            values[f"{spec.name}/{slot}"] = variable.numpy()
    return values


def assert_values_equal(actual, expected, atol=1e-5):
    assert sorted(actual) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(
            actual[name], expected[name], atol=atol, rtol=0, err_msg=name
        )


__all__ = ["emulated_tpu"]
