"""Finding the embedding layers of a model, at any depth.

Serving exports, checkpoints and warm starts act on every
`TPUEmbeddingLayer` of a model, nested models and layers included; they
find them here.
"""

from __future__ import annotations

from typing import Any

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import nested_layers
from keras_tpu_embed.layers import TPUEmbeddingLayer


def embedding_layers(model_or_layers: Any) -> list[TPUEmbeddingLayer]:
    """The embedding layers of a model, a layer, or a list of either.

    Example:

    >>> item = categorical_column_with_identity("item", 10)
    >>> layer = TPUEmbeddingLayer([embedding_column(item, 4)])
    >>> inputs = {"item": keras.Input((None,), dtype="int64", name="item")}
    >>> model = keras.Model(inputs, layer(inputs))
    >>> embedding_layers(model) == [layer]
    True
    """
    if isinstance(model_or_layers, TPUEmbeddingLayer):
        return [model_or_layers]
    if isinstance(model_or_layers, keras.layers.Layer):
        return [
            layer
            for layer in nested_layers(model_or_layers)
            if isinstance(layer, TPUEmbeddingLayer)
        ]
    return [
        layer for item in model_or_layers for layer in embedding_layers(item)
    ]
