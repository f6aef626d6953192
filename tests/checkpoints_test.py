"""Checkpoints interchange with `tf.tpu.experimental.embedding.TPUEmbedding`.

The mid-level object builds on CPU with the variable layout it has on TPU;
a checkpoint written from our layers must restore into it (every table and
slot), and one written from it must restore into our layers. Restoring
and validating tables fails loudly, naming what is wrong.
"""

import glob

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import testing

OPTIMIZERS = {
    "adagrad": kte.optimizers.Adagrad(0.3),
    "adam": kte.optimizers.Adam(0.1),
    "ftrl": kte.optimizers.FTRL(0.2, l1_regularization_strength=0.01),
    "adagrad_momentum": kte.optimizers.AdagradMomentum(0.2, momentum=0.5),
    "sgd": kte.optimizers.SGD(0.1),
}


def _layers(optimizer):
    config = kte.EmbeddingConfig(optimizer=optimizer)
    user = kte.embedding_column(
        kte.categorical_column_with_identity("user", 11), 4
    )
    shared = kte.shared_embedding_columns(
        [
            kte.categorical_column_with_identity("item", 13),
            kte.sequence_categorical_column_with_identity("hist", 13),
        ],
        3,
        max_sequence_lengths=[0, 2],
    )
    return (
        kte.TPUEmbeddingLayer([user], config=config),
        kte.SharedTPUEmbedding(shared, config=config),
    )


def _train(layers, steps=3):
    features = {
        "user": tf.constant([[1, 2], [3, 3]]),
        "item": tf.constant([[4], [5]]),
        "hist": tf.constant([[4, 6, 7], [8, -1, -1]]),
    }
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = 0.0
            for layer in layers:
                for value in layer(features, training=True).values():
                    loss += tf.reduce_sum(value * value)
        tape.gradient(
            loss, [w for layer in layers for w in layer.trainable_weights]
        )


def _mid_level(layers, optimizer):
    embedding = tf.tpu.experimental.embedding
    features = {}
    for layer in layers:
        for table in layer.table_specs:
            config = embedding.TableConfig(
                vocabulary_size=table.vocabulary_size,
                dim=table.dimension,
                name=table.name,
                optimizer=optimizer.to_tpu(),
            )
            for column in table.columns:
                features[column.name] = embedding.FeatureConfig(
                    table=config, name=column.name
                )
    mid = embedding.TPUEmbedding(features, optimizer=optimizer.to_tpu())
    mid.build()
    return mid


def _built(layers):
    for layer in layers:
        layer.build()
    return layers


def _values(layers):
    values = {}
    for layer in layers:
        for table in layer.table_specs:
            values[table.name] = layer.table_variable(table.name).numpy()
            for slot, var in layer.slot_variables(table.name).items():
                values[f"{table.name}/{slot}"] = var.numpy()
    return values


def _checkpoint_values(path):
    reader = tf.train.load_checkpoint(path)
    values = {}
    for key in reader.get_variable_to_shape_map():
        if key.startswith("embedding/") and key.endswith("VARIABLE_VALUE"):
            name = key[len("embedding/") : -len("/.ATTRIBUTES/VARIABLE_VALUE")]
            values[name.replace(".S", "/")] = reader.get_tensor(key)
    return values


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_round_trip_through_the_mid_level_object(name, tmp_path):
    optimizer = OPTIMIZERS[name]
    layers = _layers(optimizer)
    for layer in layers:
        layer.build()
    initial = _values(layers)
    _train(layers)
    trained = _values(layers)
    # A round trip of untrained state proves nothing: every table and slot
    # left its initial value.
    unmoved = [k for k in trained if np.array_equal(trained[k], initial[k])]
    assert unmoved == [], unmoved

    # Without the layers' steps, which the mid-level object has no place
    # for (assert_consumed would name them).
    ours = tf.train.Checkpoint(
        embedding=kte.engine_checkpoint(list(layers), steps=False)
    )
    path = ours.save(str(tmp_path / "ours"))

    mid = _mid_level(layers, optimizer)
    status = tf.train.Checkpoint(embedding=mid).restore(path)
    status.assert_existing_objects_matched()
    status.assert_consumed()
    # Write the mid-level object's state and compare every table and slot.
    mid_path = tf.train.Checkpoint(embedding=mid).save(str(tmp_path / "mid"))
    from_mid = _checkpoint_values(mid_path)
    assert sorted(from_mid) == sorted(trained)
    for key, value in trained.items():
        np.testing.assert_array_equal(from_mid[key], value, err_msg=key)

    fresh = _layers(optimizer)
    for layer in fresh:
        layer.build()
    status = tf.train.Checkpoint(
        embedding=kte.engine_checkpoint(list(fresh), steps=False)
    ).restore(mid_path)
    status.assert_consumed()
    # restore_tables reads the mid-level object's checkpoint as it is.
    kte.restore_tables(list(_built(_layers(optimizer))), mid_path)
    restored = _values(fresh)
    for key, value in trained.items():
        np.testing.assert_array_equal(restored[key], value, err_msg=key)


def test_engine_checkpoint_carries_each_layers_step(tmp_path):
    """A `learning_rate_fn` schedule reads the step: a restore that left it
    at 0 restarted the schedule."""
    layers = _layers(OPTIMIZERS["adagrad"])
    _train(layers, steps=4)
    assert [int(layer.embedding_step.numpy()) for layer in layers] == [4, 4]
    path = tf.train.Checkpoint(
        embedding=kte.engine_checkpoint(list(layers))
    ).write(str(tmp_path / "ck"))
    for restore in ("read", "restore_tables"):
        fresh = _layers(OPTIMIZERS["adagrad"])
        for layer in fresh:
            layer.build()
        if restore == "read":
            tf.train.Checkpoint(
                embedding=kte.engine_checkpoint(list(fresh))
            ).read(path).assert_consumed()
        else:
            kte.restore_tables(list(fresh), path)
        assert [int(layer.embedding_step.numpy()) for layer in fresh] == [
            4,
            4,
        ], restore


def test_restore_tables_keeps_the_steps_of_a_checkpoint_without_them(
    tmp_path,
):
    """As TF's mid-level object writes them: tables and slots only."""
    layers = _layers(OPTIMIZERS["adagrad"])
    _train(layers, steps=2)
    path = tf.train.Checkpoint(
        embedding=kte.engine_checkpoint(list(layers), steps=False)
    ).write(str(tmp_path / "ck"))
    fresh = _layers(OPTIMIZERS["adagrad"])
    _train(fresh, steps=3)
    kte.restore_tables(list(fresh), path)
    assert [int(layer.embedding_step.numpy()) for layer in fresh] == [3, 3]
    np.testing.assert_array_equal(
        fresh[0].table_variable("user").numpy(),
        layers[0].table_variable("user").numpy(),
    )


def test_engine_checkpoint_refuses_duplicate_and_unbuilt_tables():
    first, _ = _layers(kte.optimizers.SGD())
    with pytest.raises(ValueError, match="not built"):
        kte.engine_checkpoint(first)
    first.build()
    twin, _ = _layers(kte.optimizers.SGD())
    twin.build()
    with pytest.raises(ValueError, match="Table 'user' is held by both"):
        kte.engine_checkpoint([first, twin])


# Restoring and validating tables, with errors naming what is wrong.


def _item_layer(key="item", dimension=4):
    column = kte.embedding_column(
        kte.categorical_column_with_identity(key, 10), dimension
    )
    layer = kte.TPUEmbeddingLayer(
        [column],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
    )
    layer.build()
    return layer


def _save(layer, path):
    checkpoint = tf.train.Checkpoint(embedding=kte.engine_checkpoint(layer))
    return checkpoint.save(str(path))


def test_restore_tables_round_trip(tmp_path):
    source, target = _item_layer(), _item_layer()
    path = _save(source, tmp_path / "ck")
    kte.restore_tables(target, path)
    np.testing.assert_array_equal(
        target.table_variable("item").numpy(),
        source.table_variable("item").numpy(),
    )


@pytest.mark.parametrize("how", ["write", "save"])
def test_restore_tables_reads_write_and_save_checkpoints(tmp_path, how):
    """`write` keeps no save counter; that is no reason to call it corrupt."""
    source, target = _item_layer(), _item_layer()
    source.table_variable("item").assign(
        np.arange(40, dtype="float32").reshape(10, 4)
    )
    source.slot_variables("item")["accumulators"].assign(
        np.full((10, 4), 0.5, "float32")
    )
    checkpoint = tf.train.Checkpoint(embedding=kte.engine_checkpoint(source))
    path = getattr(checkpoint, how)(str(tmp_path / "ck"))
    kte.restore_tables(target, path)
    np.testing.assert_array_equal(
        target.table_variable("item").numpy(),
        source.table_variable("item").numpy(),
    )
    np.testing.assert_array_equal(
        target.slot_variables("item")["accumulators"].numpy(),
        np.full((10, 4), 0.5, "float32"),
    )
    # Real damage is still named as such, for both kinds of checkpoint.
    data = glob.glob(path + ".data-*")[0]
    testing.flip_byte(data, 16)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        kte.restore_tables(_item_layer(), path)


def test_renamed_table_is_named(tmp_path):
    path = _save(_item_layer("product"), tmp_path / "ck")
    with pytest.raises(ValueError, match=r"table 'item' is missing.*'product'"):
        kte.restore_tables(_item_layer("item"), path)


def test_reshaped_table_names_both_shapes(tmp_path):
    path = _save(_item_layer(dimension=4), tmp_path / "ck")
    with pytest.raises(
        ValueError,
        match=r"shape \[10, 4\] in the checkpoint "
        r"but \[10, 8\] in the model",
    ):
        kte.restore_tables(_item_layer(dimension=8), path)


def test_corrupt_checkpoint_names_the_file(tmp_path):
    path = _save(_item_layer(), tmp_path / "ck")
    data = glob.glob(path + ".data-*")[0]
    testing.flip_byte(data, 16)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        kte.restore_tables(_item_layer(), path)


def test_validate_tables_reports_non_finite_rows():
    layer = _item_layer()
    assert kte.validate_tables(layer) == {}
    layer.table_variable("item")[7, 1].assign(float("inf"))
    assert kte.validate_tables(layer) == {"item": [7]}


def test_validate_tables_reports_non_finite_slot_rows():
    layer = kte.TPUEmbeddingLayer(
        [kte.embedding_column(kte.categorical_column_with_identity("i", 6), 2)],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
    )
    layer.build()
    layer.slot_variables("i")["accumulators"][4, 0].assign(float("nan"))
    assert kte.validate_tables(layer) == {"i/accumulators": [4]}
