"""The tables a layer holds itself: variables, lookups, training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.backends.local_tables import LocalTables
from keras_tpu_embed.backends.table_backend import Activations
from keras_tpu_embed.backends.table_backend import Phase
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.tables.table_specs import group_into_tables
from tests import testing

DIM = testing.DIM


def test_untouched_rows_stay_put():
    layer = kte.TPUEmbeddingLayer(
        [testing.identity_column()],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(1.0)),
    )
    layer.build()
    before = layer.table_variable("ids").numpy().copy()
    testing.train_steps(layer, [[[1, 2]]], tf.ones([1, DIM]))
    after = layer.table_variable("ids").numpy()
    changed = np.where(np.any(before != after, axis=1))[0]
    np.testing.assert_array_equal(changed, [1, 2])


def test_tables_are_not_trained_by_keras_optimizer():
    layer = kte.TPUEmbeddingLayer([testing.identity_column()])
    layer.build()
    assert [w.name for w in layer.trainable_weights] == ["table_update_trigger"]
    assert "ids" in [w.name for w in layer.non_trainable_weights]


def _local_tables(optimizer, counts_step=True):
    """LocalTables for an own and a shared table, on a bare Keras layer."""
    shared = kte.shared_embedding_columns(
        [
            kte.categorical_column_with_identity("item", 6),
            kte.sequence_categorical_column_with_identity("hist", 6),
        ],
        2,
        max_sequence_lengths=[0, 3],
    )
    columns = [testing.identity_column("user")] + shared
    config = kte.EmbeddingConfig(optimizer=optimizer)
    tables = LocalTables(group_into_tables(columns), config, True)
    owner = keras.layers.Layer()
    module = tables.create_variables(
        owner, {name: LookupDevice.CPU for name in tables.table_names}
    )
    step = owner.add_weight(
        name="step", shape=(), dtype="int64", initializer="zeros"
    )
    trap = owner.add_weight(name="trap", shape=(), initializer="zeros")
    tables.bind(step, trap, counts_step=counts_step)
    return tables, module, step, trap


FEATURES = {
    "user": tf.constant([[1, 2], [3, -1]]),
    "item": tf.constant([[4], [5]]),
    "hist": tf.constant([[1, 2, 3, 4], [5, -1, -1, -1]]),
}


def _phase(tables, training):
    devices = {name: LookupDevice.CPU for name in tables.table_names}
    return Phase(training=training, serving=False, devices=devices)


def test_variables_carry_the_mid_level_api_names():
    tables, module, _, _ = _local_tables(kte.optimizers.Adagrad(0.1))
    assert tables.table_names == ["user", "hist_item_shared_embedding"]
    for name in tables.table_names:
        assert getattr(module, name) is tables.table_variable(name)
        slots = tables.slot_variables(name)
        assert list(slots) == ["accumulators"]
        assert getattr(module, f"{name}/accumulators") is slots["accumulators"]
        np.testing.assert_allclose(slots["accumulators"].numpy(), 0.1)
    assert tables.table_variable("user").shape == (testing.VOCAB, DIM)
    # slot_variables hands out a copy of the mapping.
    tables.slot_variables("user").clear()
    assert list(tables.slot_variables("user")) == ["accumulators"]


def test_activations_look_every_column_up():
    tables, _, step, _ = _local_tables(kte.optimizers.SGD(0.1))
    out = tables.activations(FEATURES, _phase(tables, training=False))
    assert sorted(out.values) == [
        "hist_shared_embedding",
        "item_shared_embedding",
        "user_embedding",
    ]
    assert list(out.lengths) == ["hist_shared_embedding"]
    np.testing.assert_array_equal(out.lengths["hist_shared_embedding"], [3, 1])
    shared = tables.table_variable("hist_item_shared_embedding").numpy()
    np.testing.assert_allclose(
        out.values["item_shared_embedding"][1], shared[5]
    )
    assert int(step.numpy()) == 0


def test_training_call_updates_through_the_trap_and_counts_the_step():
    for counts_step in (True, False):
        tables, _, step, trap = _local_tables(
            kte.optimizers.SGD(0.5), counts_step
        )
        before = tables.table_variable("user").numpy().copy()
        with tf.GradientTape() as tape:
            out = tables.activations(FEATURES, _phase(tables, training=True))
            loss = tf.reduce_sum(out.values["user_embedding"])
        trap_gradient = tape.gradient(loss, trap)
        assert float(trap_gradient) == 0.0
        after = tables.table_variable("user").numpy()
        # Row 1 and 2 of example 0 and row 3 of example 1, summed: -lr * 1.
        np.testing.assert_allclose(
            after[[1, 2, 3]], before[[1, 2, 3]] - 0.5, rtol=1e-6
        )
        np.testing.assert_array_equal(after[[0, 4, 5]], before[[0, 4, 5]])
        assert int(step.numpy()) == (1 if counts_step else 0)


@pytest.mark.parametrize("device", [None, "tpu_tensor_core"])
def test_frozen_table_is_never_updated_and_has_no_slots(device):
    # tf.feature_column.embedding_column(..., trainable=False), converted;
    # on the tensor core, the same spec with its device.
    frozen = tf.feature_column.embedding_column(
        tf.feature_column.categorical_column_with_identity("ids", 10),
        testing.DIM,
        combiner="sum",
        trainable=False,
    )
    if device:
        frozen = kte.embedding_column(
            frozen.categorical_column,
            testing.DIM,
            combiner="sum",
            trainable=False,
            embedding_lookup_device=device,
            tensor_core_shape=[None, 2],
        )
    trained = testing.identity_column("other")
    layer = kte.TPUEmbeddingLayer(
        [frozen, trained],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(1.0)),
    )
    layer.build()
    assert layer.slot_variables("ids") == {}
    assert list(layer.slot_variables("other")) == ["accumulators"]
    before = layer.table_variable("ids").numpy().copy()
    other_before = layer.table_variable("other").numpy().copy()
    for dense_ids in ([[1, 2]], [[3, 1]]):
        with tf.GradientTape() as tape:
            out = layer(
                {"ids": tf.constant(dense_ids), "other": tf.constant([[1]])},
                training=True,
            )
            loss = tf.reduce_sum(out["ids_embedding"]) + tf.reduce_sum(
                out["other_embedding"]
            )
        tape.gradient(loss, layer.trainable_weights)
    np.testing.assert_array_equal(layer.table_variable("ids").numpy(), before)
    assert not np.array_equal(
        layer.table_variable("other").numpy(), other_before
    )
    names = [w.name for w in layer.weights]
    assert "ids_accumulators" not in names


def test_kte_embedding_column_takes_trainable():
    column = testing.identity_column(trainable=False)
    assert column.trainable is False
    assert group_into_tables([column])[0].trainable is False


def test_local_tables_answer_activations_for_every_column():
    item = kte.categorical_column_with_identity("item", 10)
    layer = kte.TPUEmbeddingLayer([kte.embedding_column(item, 4)])
    layer.build()
    local = layer._local
    phase = Phase(
        training=False, serving=False, devices={"item": LookupDevice.CPU}
    )
    answer = local.activations({"item": tf.constant([[1, 2]])}, phase)
    assert isinstance(answer, Activations)
    assert sorted(answer.values) == ["item_embedding"]
    table = layer.table_variable("item").numpy()
    np.testing.assert_allclose(
        answer.values["item_embedding"], [(table[1] + table[2]) / 2]
    )


@pytest.mark.parametrize("device", [None, "tpu_tensor_core"])
def test_a_replicated_step_reads_the_rows_it_needs_not_the_table(device):
    # `tf.gather` on a MirroredVariable in a replica context converts the
    # whole variable to a tensor: 232 ms a step on a 2,000,000-row table,
    # against 2 ms from the replica's own copy. No step may read a
    # [vocabulary, dim] tensor of the table (training or not).
    vocabulary = 997  # a shape nothing else in the step has
    column = kte.embedding_column(
        kte.categorical_column_with_identity("ids", vocabulary),
        DIM,
        embedding_lookup_device=device,
        tensor_core_shape=[None, 2] if device else None,
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        layer = kte.TPUEmbeddingLayer(
            [column],
            config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
        )
        layer.build()

    @tf.function
    def step(ids):
        def replica(ids):
            with tf.GradientTape() as tape:
                out = layer({"ids": ids}, training=True)["ids_embedding"]
                loss = tf.reduce_sum(out)
            return tape.gradient(loss, layer.trainable_variables)

        return strategy.run(replica, args=(ids,))

    ids = tf.constant([[1, 996], [5, -1]], tf.int64)
    before = layer.table_variable("ids").numpy().copy()
    step(ids)
    graphs = [step.get_concrete_function(ids).graph]
    graphs += [f.graph for f in graphs[0]._functions.values()]  # noqa: SLF001
    whole = [
        f"{graph.name}: {op.type} {op.name}"
        for graph in graphs
        for op in graph.get_operations()
        if op.type == "ReadVariableOp"
        and op.outputs[0].shape.as_list() == [vocabulary, DIM]
    ]
    assert whole == [], whole
    after = layer.table_variable("ids").numpy()
    assert sorted(np.where(np.any(before != after, axis=1))[0]) == [1, 5, 996]
