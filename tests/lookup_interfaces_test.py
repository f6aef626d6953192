"""The lookup interface: every lookup answers through the one call path."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.backends.local_tables import LocalTables
from keras_tpu_embed.backends.table_backend import Phase
from keras_tpu_embed.lookups import dense_xla
from keras_tpu_embed.lookups import fused_host
from keras_tpu_embed.lookups import padded_host
from keras_tpu_embed.lookups import sparse
from keras_tpu_embed.lookups.lookup_interfaces import Lookup
from keras_tpu_embed.lookups.lookup_interfaces import TrainableLookup
from keras_tpu_embed.lookups.lookup_interfaces import trainable
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.tables.table_specs import group_into_tables

DENSE = {
    "user": tf.constant([[1, 2], [3, -1]], tf.int64),
    "item": tf.constant([[4], [5]], tf.int64),
}
# Ragged ids: the host's serving lookup cannot fuse them.
RAGGED = {
    "user": tf.ragged.constant([[1, 2], [3]], tf.int64),
    "item": tf.ragged.constant([[4], [5]], tf.int64),
}


def _tables(optimizer=None):
    """LocalTables of an own and a shared table, each column with a
    tensor-core width so that every lookup can read it."""
    ident = kte.categorical_column_with_identity
    columns = [
        kte.embedding_column(
            ident("user", 8), 3, combiner="sum", tensor_core_shape=[None, 2]
        ),
        *kte.shared_embedding_columns(
            [ident("item", 6), ident("other", 6)],
            2,
            tensor_core_shape=[None, 1],
        )[:1],
    ]
    config = kte.EmbeddingConfig(optimizer=optimizer or kte.optimizers.SGD(1))
    tables = LocalTables(group_into_tables(columns), config, False)
    owner = keras.layers.Layer()
    # The columns declare no device, so every table trains on the CPU; the
    # tensor-core lookups run without a dedupe scratch.
    tables.create_variables(
        owner, {name: LookupDevice.CPU for name in tables.table_names}
    )
    step = owner.add_weight(
        name="step", shape=(), dtype="int64", initializer="zeros"
    )
    trap = owner.add_weight(name="trap", shape=(), initializer="zeros")
    tables.bind(step, trap)
    return tables, trap


def _phase(tables, device, training=False, serving=False):
    devices = {name: device for name in tables.table_names}
    return Phase(training=training, serving=serving, devices=devices)


CASES = {
    # name: (device, serving, features, the lookup classes LocalTables picks)
    "sparse": (LookupDevice.CPU, False, RAGGED, sparse.SparseTableLookup),
    "dense_xla": (
        LookupDevice.TPU_TENSOR_CORE,
        False,
        DENSE,
        dense_xla.DenseTableLookup,
    ),
    "padded_host": (
        LookupDevice.CPU,
        True,
        RAGGED,
        padded_host.PaddedHostLookup,
    ),
    "fused_host": (LookupDevice.CPU, True, DENSE, fused_host.FusedHostLookup),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_lookup_answers_through_the_one_call_path(case):
    device, serving, features, kind = CASES[case]
    tables, _ = _tables()
    phase = _phase(tables, device, serving=serving)
    lookups = tables.lookups(features, phase)
    assert {type(lookup) for lookup in lookups} == {kind}
    assert all(isinstance(lookup, Lookup) for lookup in lookups)
    # The training lookups are the ones that are not serving's.
    assert all(
        isinstance(lookup, TrainableLookup) is (not serving)
        for lookup in lookups
    )
    covered = [name for lookup in lookups for name in lookup.table_names]
    assert sorted(covered) == sorted(tables.table_names)
    got = tables.activations(features, phase).values
    # Every table row by hand: the sum of each example's rows.
    user = tables.table_variable("user").numpy()
    item = tables.table_variable(tables.table_names[1]).numpy()
    np.testing.assert_allclose(
        got["user_embedding"], [user[1] + user[2], user[3]], rtol=1e-6
    )
    np.testing.assert_allclose(
        got["item_shared_embedding"], [item[4], item[5]], rtol=1e-6
    )


@pytest.mark.parametrize(
    "device", [LookupDevice.CPU, LookupDevice.TPU_TENSOR_CORE]
)
def test_training_lookups_update_through_the_one_call_path(device):
    tables, trap = _tables()
    before = tables.table_variable("user").numpy().copy()
    with tf.GradientTape() as tape:
        out = tables.activations(DENSE, _phase(tables, device, training=True))
        loss = tf.reduce_sum(out.values["user_embedding"])
    tape.gradient(loss, trap)
    after = tables.table_variable("user").numpy()
    np.testing.assert_allclose(after[[1, 2, 3]], before[[1, 2, 3]] - 1.0)
    np.testing.assert_array_equal(after[[0, 4]], before[[0, 4]])


@pytest.mark.parametrize("case", ["padded_host", "fused_host"])
def test_serving_lookups_refuse_to_train_naming_the_columns(case):
    device, serving, features, _ = CASES[case]
    tables, _ = _tables()
    [lookup, *_] = tables.lookups(
        features, _phase(tables, device, serving=serving)
    )
    variables = {
        name: tables.table_variable(name).value for name in tables.table_names
    }
    # A serving lookup has no training method: the type says it, and a
    # training call that met one would refuse it by its columns' names.
    assert not isinstance(lookup, TrainableLookup)
    assert not hasattr(lookup, "training_rows")
    message = r"'user_embedding'.*serves only.*training=False"
    specs = {t.name: t for t in tables.tables}
    with pytest.raises(RuntimeError, match=message):
        trainable([lookup], specs)
    with pytest.raises(RuntimeError, match=message):
        lookup.outputs(variables, {"user": tf.ones([3, 3])})
