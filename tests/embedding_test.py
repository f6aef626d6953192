"""Embedding column specs: defaults, checks, properties, serialization."""

import dataclasses
import json
import math

import keras
import numpy as np
import pytest

import keras_tpu_embed as kte
from keras_tpu_embed.columns import EmbeddingColumn
from keras_tpu_embed.columns import SharedEmbeddingColumn
from tests import initializer_cases as cases
from tests import testing


def test_default_initializer_is_truncated_normal():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("a", 5), 16
    )
    init = column.initializer
    assert isinstance(init, keras.initializers.TruncatedNormal)
    assert init.mean == 0.0
    assert math.isclose(init.stddev, 1 / math.sqrt(16))


def test_invalid_initializer():
    cat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match="initializer must be callable"):
        kte.embedding_column(cat, 2, initializer="zeros")


def test_lookup_device_rules():
    cat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match="embedding_lookup_device"):
        kte.embedding_column(cat, 2, embedding_lookup_device="gpu")
    with pytest.raises(ValueError, match="requires tensor_core_shape"):
        kte.embedding_column(cat, 2, embedding_lookup_device="tpu_tensor_core")
    with pytest.raises(ValueError, match="tensor_core_shape must be size 2"):
        kte.embedding_column(cat, 2, tensor_core_shape=[1, 2, 3])
    column = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("s", 5),
        2,
        max_sequence_length=4,
        embedding_lookup_device="tpu_tensor_core",
        tensor_core_shape=[None, 4],
    )
    assert column.tensor_core_shape == (None, 4)


def test_invalid_combiner_names_allowed_values():
    cat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match=r"combiner.*'max'"):
        kte.embedding_column(cat, 2, combiner="max")


def test_specs_are_immutable():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("a", 5), 2
    )
    with pytest.raises(
        dataclasses.FrozenInstanceError,
        match="cannot assign to field 'dimension'",
    ):
        column.dimension = 3
    assert column.dimension == 2


def test_serialization_round_trip(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a\nb\n")
    cats = [
        kte.categorical_column_with_identity("i", 5, default_value=1),
        kte.categorical_column_with_vocabulary_list(
            "l", ["x", "y"], num_oov_buckets=1
        ),
        kte.categorical_column_with_vocabulary_file("f", str(path)),
        kte.sequence_categorical_column_with_hash_bucket("h", 9),
        kte.weighted_categorical_column(
            kte.categorical_column_with_hash_bucket("w", 9), "ww"
        ),
    ]
    for cat in cats:
        testing.assert_serialization_round_trip(cat)
        max_length = 3 if cat.is_sequence else 0
        column = kte.embedding_column(cat, 4, max_sequence_length=max_length)
        rebuilt = testing.assert_serialization_round_trip(column)
        assert rebuilt.name == column.name
    shared = kte.shared_embedding_columns([cats[0], cats[0]], 3)[0]
    assert testing.assert_serialization_round_trip(shared).table_name == (
        shared.table_name
    )


def test_categorical_column_must_be_a_column():
    with pytest.raises(TypeError, match="`categorical_column` must be a"):
        EmbeddingColumn(categorical_column="a", dimension=2)


def test_shared_column_names_its_table():
    cat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match="shared_embedding_collection_name"):
        SharedEmbeddingColumn(categorical_column=cat, dimension=2)
    column = SharedEmbeddingColumn(
        categorical_column=cat,
        dimension=2,
        shared_embedding_collection_name="t",
    )
    assert (column.name, column.table_name) == ("a_shared_embedding", "t")


def test_properties_come_from_the_categorical_column():
    column = kte.embedding_column(
        kte.weighted_categorical_column(
            kte.sequence_categorical_column_with_hash_bucket("tags", 7), "w"
        ),
        2,
        max_sequence_length=3,
        embedding_lookup_device="tpu_tensor_core",
    )
    assert column.is_sequence
    assert (column.feature_key, column.weight_feature_key) == ("tags", "w")
    assert column.vocabulary_size == 7
    assert column.table_name == "tags_weighted_by_w"
    assert column.lookup_device.value == "tpu_tensor_core"


def test_table_signature_is_what_a_table_is_made_of():
    cat = kte.categorical_column_with_identity("a", 5)
    initializer = keras.initializers.Zeros()
    signature = kte.embedding_column(
        cat, 2, initializer=initializer, combiner="sum"
    ).table_signature()
    # The combiner is the column's business, not the table's.
    assert (
        signature
        == kte.embedding_column(
            cat, 2, initializer=initializer
        ).table_signature()
    )
    assert sorted(signature) == [
        "ckpt_to_load_from",
        "dimension",
        "initializer",
        "learning_rate_fn",
        "max_norm",
        "tensor_name_in_ckpt",
        "trainable",
        "vocabulary_size",
    ]
    assert signature["vocabulary_size"] == 5 and signature["dimension"] == 2


@pytest.mark.parametrize(
    "shape, message",
    [
        ([0, 2], "batch dimension of tensor_core_shape"),
        ([None, 0], "second dimension of tensor_core_shape"),
    ],
)
def test_tensor_core_shape_checks(shape, message):
    cat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match=message):
        kte.embedding_column(cat, 2, tensor_core_shape=shape)
    column = kte.embedding_column(cat, 2, tensor_core_shape=[-1, 3])
    assert column.tensor_core_shape == (None, 3)


def test_learning_rate_fn_must_be_callable():
    cat = kte.categorical_column_with_identity("a", 5)
    with pytest.raises(ValueError, match="`learning_rate_fn` of column 'a'"):
        kte.embedding_column(cat, 2, learning_rate_fn=0.1)


# Any callable that returns the table (issue 41, item 7): Keras' own
# pretrained recipe, a lambda over a matrix or another initializer, a
# functools.partial, an object with __call__. Cases: tests/initializer_cases.py.

# TF's initializers serialize, but Keras cannot find their class to load.
_SAVED = {"Constant_matrix"}


def _pretrained_column(name, shape=(6, 4)):
    return kte.embedding_column(
        kte.categorical_column_with_identity("item", shape[0]),
        shape[1],
        initializer=cases.PRETRAINED[name](shape),
    )


@pytest.mark.parametrize("name", sorted(cases.PRETRAINED))
def test_any_callable_initializer_makes_a_signature(name):
    """Comparing tables `json.dumps`ed the initializer: a closure over a
    matrix or an initializer, a partial and a plain object raised a bare
    `TypeError: Object of type ... is not JSON serializable`."""
    column = _pretrained_column(name)
    json.dumps(column.table_signature())
    assert column.agrees_on_table(column)


@pytest.mark.parametrize("name", sorted(_SAVED))
def test_pretrained_constants_round_trip_through_the_config(name):
    column = _pretrained_column(name)
    rebuilt = EmbeddingColumn.from_config(
        json.loads(json.dumps(column.get_config()))
    )
    np.testing.assert_array_equal(
        rebuilt.initializer((6, 4), "float32"),
        cases.pretrained_values(name, (6, 4)),
    )
    assert rebuilt.agrees_on_table(column)


@pytest.mark.parametrize("name", sorted(set(cases.PRETRAINED) - _SAVED))
def test_unserializable_initializers_are_refused_at_save_naming_the_column(
    name, tmp_path
):
    column = _pretrained_column(name)
    message = (
        r"Column 'item_embedding': its initializer .* cannot be saved in a "
        r"model's config.*keras.initializers.Constant\(matrix\)"
    )
    with pytest.raises(TypeError, match=message):
        column.get_config()
    inputs = {"item": keras.Input((1,), dtype="int64", name="item")}
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    model = keras.Model(inputs, layer(inputs))
    model.predict({"item": np.array([[5]])}, verbose=0)
    with pytest.raises(TypeError, match=message):
        model.save(tmp_path / "model.keras")


def test_equal_matrices_agree_and_different_ones_do_not():
    first = _pretrained_column("Constant_matrix")
    equal = _pretrained_column("Constant_matrix")
    assert first.initializer is not equal.initializer
    assert first.agrees_on_table(equal)
    other = kte.embedding_column(
        kte.categorical_column_with_identity("item", 6),
        4,
        initializer=keras.initializers.Constant(cases.matrix((6, 4)) + 1),
    )
    assert not first.agrees_on_table(other)
