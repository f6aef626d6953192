"""The protocol between a layer and the places its tables live."""

import dataclasses
import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.backends import table_backend
from keras_tpu_embed.backends.local_tables import LocalTables
from keras_tpu_embed.engines.engine import EngineTables
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.tables.table_specs import group_into_tables
from tests import testing


def test_local_tables_have_the_protocols_signature():
    ours = inspect.signature(LocalTables.activations)
    protocol = inspect.signature(table_backend.TableBackend.activations)
    assert list(ours.parameters) == list(protocol.parameters)
    assert ours.return_annotation == protocol.return_annotation


def test_local_tables_answer_activations_for_every_column():
    sequence = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("s", 5),
        2,
        max_sequence_length=2,
    )
    columns = [testing.identity_column("a"), testing.identity_column("b")]
    columns.append(sequence)
    tables: table_backend.TableBackend = LocalTables(
        group_into_tables(columns), kte.EmbeddingConfig(), True
    )
    tables.create_variables(
        keras.layers.Layer(),
        {name: LookupDevice.CPU for name in tables.table_names},
    )
    phase = table_backend.Phase(
        training=False,
        serving=False,
        devices={name: LookupDevice.CPU for name in tables.table_names},
    )
    features = {
        "a": tf.constant([[1], [2]]),
        "b": tf.constant([[3, 4], [-1, -1]]),
        "s": tf.constant([[1, 2, 3], [4, -1, -1]]),
    }
    answer = tables.activations(features, phase)
    assert isinstance(answer, table_backend.Activations)
    assert sorted(answer.values) == sorted(c.name for c in columns)
    a = tables.table_variable("a").numpy()
    b = tables.table_variable("b").numpy()
    s = tables.table_variable("s").numpy()
    # testing.identity_column sums; the sequence column keeps positions.
    np.testing.assert_allclose(answer.values["a_embedding"], a[[1, 2]])
    np.testing.assert_allclose(
        answer.values["b_embedding"], [b[3] + b[4], np.zeros(3)]
    )
    np.testing.assert_allclose(
        answer.values["s_embedding"], [s[[1, 2]], [s[4], np.zeros(2)]]
    )
    assert list(answer.lengths) == ["s_embedding"]
    np.testing.assert_array_equal(answer.lengths["s_embedding"], [2, 1])


def test_phase_and_activations_are_frozen_values():
    phase = table_backend.Phase(training=True, serving=False, devices={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        phase.training = False
    first, second = (
        table_backend.Activations(values={}),
        table_backend.Activations({}),
    )
    assert first.lengths == {} and first.lengths is not second.lengths


def test_backends_answer_the_protocol():
    wanted = inspect.signature(table_backend.TableBackend.activations)
    for implementation in (LocalTables, EngineTables):
        got = inspect.signature(implementation.activations)
        assert list(got.parameters) == list(wanted.parameters)
