"""Finding the embedding layers of a model, at any depth."""

import keras

import keras_tpu_embed as kte
from keras_tpu_embed.layers_in_model import embedding_layers


def _layer(key):
    column = kte.categorical_column_with_identity(key, 10)
    return kte.TPUEmbeddingLayer([kte.embedding_column(column, 2)])


def test_finds_layers_in_nested_models_lists_and_alone():
    a, b = _layer("a"), _layer("b")
    inputs = {"a": keras.Input((None,), dtype="int64", name="a")}
    inner = keras.Model(inputs, a(inputs))
    outer_inputs = {
        "a": keras.Input((None,), dtype="int64", name="a"),
        "b": keras.Input((None,), dtype="int64", name="b"),
    }
    outer = keras.Model(
        outer_inputs,
        [inner({"a": outer_inputs["a"]}), b({"b": outer_inputs["b"]})],
    )
    assert set(map(id, embedding_layers(outer))) == {id(a), id(b)}
    assert embedding_layers(b) == [b]
    assert embedding_layers([inner, b]) == [a, b]
    assert embedding_layers(keras.layers.Dense(2)) == []
