"""`export_saved_model(jit_compile=True)`: the model past its lookups as
one XLA program.

A served call spends most of its host time outside the lookups, in the
model's own layers run op by op (the Criteo-shaped W4 of `benchmarks/`:
87 TensorFlow ops per call, its DLRM interaction and MLP among them),
where a peer compiled with XLA runs one program. The lookups cannot join
that program: XLA drops assertions, and their id and weight checks must
stand. So a functional model is cut at its embedding layers' outputs:

- the lookups, and any layers before them, run as they do without
  `jit_compile` (the lookups' own compiled gather and checks);
- every layer after them runs as one XLA program (`jit_compile=True`),
  given the lookups' activations and the model's inputs.

XLA compiles that program once per batch size it serves, as Keras'
`jit_compile` does: the first call at a new batch size waits for the
compile. The batch is never padded to fewer sizes, since a layer that
mixes rows would then answer from the padding.
"""

from __future__ import annotations

from typing import Any
from typing import Callable

import numpy as np

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.layers_in_model import embedding_layers
from keras_tpu_embed.types import Tensor


def compiled_call(model: keras.Model) -> Callable[[Any], Any]:
    """`model`'s serving call with every layer after the embedding layers
    compiled as one XLA program (see module doc).

    Call it inside the export's serving mode (`serving.serving_lookups`),
    with what the model takes.

    Raises:
        ValueError: a model that is not functional, or whose embedding
            layers are not each called once by the model itself (nested
            in another layer or model, or called twice); the message says
            to export without `jit_compile`.
    """
    inputs = _functional_inputs(model)
    lookups = embedding_layers(model)
    if not lookups:
        whole: Callable[[Any], Any] = tf.function(
            lambda x: model(x, training=False), jit_compile=True
        )
        return whole
    activations = []
    for layer in lookups:
        if layer not in model.layers:
            raise _refusal(
                model,
                f"its embedding layer '{layer.name}' is inside another "
                "layer or model, not called by the model itself",
            )
        activations.append(layer.output)
    flat_activations = tf.nest.flatten(activations)
    lookups_part = keras.Model(model.input, flat_activations)
    try:
        rest = keras.Model(flat_activations + list(inputs), model.output)
    except ValueError as e:
        # Keras' own words: the rest reads a tensor that is neither an
        # embedding layer's first output nor a model input.
        raise _refusal(
            model,
            "its layers after the embedding layers read more than the "
            "embedding layers' outputs and the model's inputs (is an "
            f"embedding layer called more than once?): Keras says: {e}",
        ) from e
    twice = embedding_layers(rest)
    if twice:
        raise _refusal(
            model,
            f"its embedding layer '{twice[0].name}' is called more than once",
        )
    program = tf.function(
        lambda values: rest(values, training=False), jit_compile=True
    )

    def call(features: Any) -> Any:
        values = tf.nest.flatten(lookups_part(features, training=False))
        return program(values + keras.tree.flatten(features))

    return call


def check_compiles(serve: Callable[[Any], Any], signature: Any) -> None:
    """Runs the traced serving function `serve` once on `signature`'s
    `example_inputs`, so that a model XLA cannot compile fails the export,
    not the first served call.

    Raises:
        ValueError: XLA cannot compile the layers past the lookups.
    """
    try:
        serve(example_inputs(signature))
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as e:
        raise ValueError(
            "jit_compile=True: compiling the model's layers after its "
            "embedding layers with XLA failed at export (one call, batch 1 "
            f"of zeros): {e.message.strip().splitlines()[0]} Export without "
            "jit_compile."
        ) from e


def example_inputs(signature: Any) -> Any:
    """One example of every input of `signature` (TensorSpecs), batch 1:
    zeros (a valid id of every column) or empty strings."""

    def one(spec: tf.TensorSpec) -> Tensor:
        if spec.shape.rank is None:  # raw features: `[batch]` will do
            shape = [1]
        else:
            shape = [1 if d is None else d for d in spec.shape.as_list()]
        if spec.dtype == tf.string:
            return tf.constant(np.full(shape, ""), tf.string)
        return tf.zeros(shape, spec.dtype)

    return tf.nest.map_structure(one, signature)


def _functional_inputs(model: keras.Model) -> list[Any]:
    try:
        inputs = list(model.inputs or [])
    except (AttributeError, ValueError):
        inputs = []
    if not inputs:
        raise _refusal(
            model,
            f"it is a subclassed {type(model).__name__}, which declares no "
            "inputs to cut it at",
        )
    return inputs


def _refusal(model: keras.Model, why: str) -> ValueError:
    return ValueError(
        "jit_compile=True compiles the layers after the embedding layers "
        "of a functional model (keras.Model(inputs, outputs)) as one XLA "
        f"program, but model '{model.name}' cannot be cut there: {why}. "
        "Export without jit_compile, or build the model with each embedding "
        "layer called once on the model's inputs."
    )
