"""The preprocessor of a model's own columns, for an export without one.

A preprocessor is a function of its columns, so the columns of a model's
embedding layers rebuild the mapping of its training: a model reloaded from
a `.keras` file exports on raw features without the `tf.data` code that fed
it (`export_saved_model(model, path)`).
"""

from __future__ import annotations

from typing import Any

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import nested_layers
from keras_tpu_embed.layers_in_model import embedding_layers
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    FeaturePreprocessor,
)
from keras_tpu_embed.serving.serving_inputs import has_input_tensors
from keras_tpu_embed.serving.serving_inputs import model_input_specs


def preprocessor_from_columns(model: keras.Model) -> FeaturePreprocessor | None:
    """The `FeaturePreprocessor` of the columns of `model`'s embedding
    layers, or None when the model holds a preprocessor itself (then it
    takes raw features as its inputs).

    Raises:
        ValueError: no embedding layer; two columns map one feature
            differently; a model input the columns do not produce, or
            produce with another dtype or sparsity.
    """
    what_to_pass = (
        "Pass preprocessor= (the FeaturePreprocessor that fed the model in "
        "training), or inputs='ids' to serve the model's own inputs."
    )
    layers = embedding_layers(model)
    if not layers:
        raise ValueError(
            "export_saved_model builds its preprocessor from the columns of "
            f"the model's embedding layers, but '{model.name}' has no "
            "embedding layer (TPUEmbeddingLayer or SharedTPUEmbedding). "
            + what_to_pass
        )
    if isinstance(model, keras.layers.Layer) and any(
        isinstance(layer, FeaturePreprocessor) for layer in nested_layers(model)
    ):
        return None
    for layer in layers:
        # A model whose tables live in the TPU engine cannot be served at
        # all: say how to get them out before judging its inputs.
        for table in layer.table_specs:
            layer.check_not_on_engine(table.name)
    columns = [column for layer in layers for column in layer.columns]
    try:
        preprocessor = FeaturePreprocessor(columns)
    except ValueError as error:
        raise ValueError(
            f"The embedding layers' columns do not make one preprocessor: "
            f"{error} " + what_to_pass
        ) from error
    if not has_input_tensors(model):
        return preprocessor
    produced = preprocessor.compute_output_spec(None)
    unfed = {}
    for name, tensor in model_input_specs(model).items():
        made = produced.get(name)
        if (
            made is None
            or made.dtype != tensor.dtype
            or bool(made.sparse) != bool(getattr(tensor, "sparse", False))
        ):
            unfed[name] = (
                f"the model takes {_describe(tensor)}, the columns produce "
                + ("nothing" if made is None else _describe(made))
            )
    if unfed:
        raise ValueError(
            "export_saved_model builds its preprocessor from the columns of "
            "the model's embedding layers, but they do not produce the "
            f"model's inputs {list(unfed)} ("
            + "; ".join(f"'{k}': {v}" for k, v in unfed.items())
            + "). "
            + what_to_pass
        )
    return preprocessor


def _describe(tensor: Any) -> str:
    sparse = "sparse" if getattr(tensor, "sparse", False) else "dense"
    return f"{sparse} {tensor.dtype}"
