"""`export_saved_model(jit_compile=True)`: the model compiled with XLA,
its lookups' checks kept.

A served call spends most of its host time outside the lookups, in the
model's own layers run op by op (the Criteo-shaped W4 of `benchmarks/`:
87 TensorFlow ops per call, its DLRM interaction and MLP among them),
where a peer compiled with XLA runs one program. XLA drops assertions, so
the lookups' id and weight checks cannot simply be compiled in. Two ways:

- **The whole model as one program**, when every lookup is the fused
  host lookup of dense ids of declared widths (`lookups/fused_host.py`):
  inside the program the lookups hand their checks over as data
  (`lookups/returned_checks.py`), folded into one verdict; outside it, one
  `Assert` raises naming the feature and the bad value when a check
  failed. The inputs' batch sizes are one more check there, named by
  every input and its size; the inputs are conformed to the first one's
  batch inside the program, so that a call that mixes them compiles to
  reach the check (cutting or padding nothing when they agree). A W4
  call is then one program, one assertion and one shape check per input.
- **Otherwise the model cut at its embedding layers' outputs** (a
  functional model, each embedding layer called once by the model
  itself): the lookups, and any layers before them, run as without
  `jit_compile`, with their own compiled gather and checks; every layer
  after them runs as one program, given the lookups' activations and the
  model's inputs.

XLA compiles a program once per batch size it serves, as Keras'
`jit_compile` does: the first call at a new batch size waits for the
compile. The model's batch is never padded to fewer sizes, since a layer
that mixes rows would then answer from the padding.
"""

from __future__ import annotations

from typing import Any
from typing import Callable

import numpy as np

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.layers import TPUEmbeddingLayer
from keras_tpu_embed.layers_in_model import embedding_layers
from keras_tpu_embed.lookups.returned_checks import Verdict
from keras_tpu_embed.lookups.returned_checks import assert_clear
from keras_tpu_embed.lookups.returned_checks import messages_of
from keras_tpu_embed.lookups.returned_checks import returned_checks
from keras_tpu_embed.lookups.returned_checks import verdict
from keras_tpu_embed.serving.serving_inputs import conform_rows
from keras_tpu_embed.serving.serving_inputs import ensure_one_batch
from keras_tpu_embed.serving.serving_inputs import ensure_shapes
from keras_tpu_embed.serving.serving_inputs import input_keys
from keras_tpu_embed.serving.serving_inputs import one_batch_in_program
from keras_tpu_embed.types import Tensor


def compiled_call(
    model: keras.Model, check_shapes: bool = False
) -> Callable[[Any], Any]:
    """`model`'s serving call compiled with XLA (see module doc): the whole
    model as one program when every lookup hands its checks over
    (`lookups/returned_checks.py`), else every layer after the embedding
    layers as one program, the lookups run apart.

    Call it inside the export's serving mode (`serving.serving_lookups`),
    with what the model takes, while tracing the serving function. With
    `check_shapes` (a signature's inputs), each input's declared shape is
    checked, and that the inputs share one batch size: inside the program
    when the whole model is one (`serving_inputs.ensure_shapes`,
    `one_batch_in_program`, the inputs conformed to one batch so that the
    program compiles to say so), else on the host before the model
    (`ensure_one_batch`).

    Raises:
        ValueError: (only where the whole model cannot be one program) a
            model that is not functional, or whose embedding layers are
            not each called once by the model itself (nested in another
            layer or model, or called twice); the message says to export
            without `jit_compile`.
    """

    def checked_in_program(features: Any) -> Any:
        if not check_shapes:
            return features
        features = ensure_shapes(features, in_program=True)
        flat = keras.tree.flatten(features)
        sizes = [tf.shape(value)[0] for value in flat]
        one_batch_in_program(sizes, input_keys(features))
        return keras.tree.pack_sequence_as(features, conform_rows(flat))

    def on_host(features: Any) -> Any:
        if not check_shapes:
            return features
        return ensure_one_batch(ensure_shapes(features))

    whole = CheckedProgram(
        lambda features: model(checked_in_program(features), training=False)
    )
    # Built once for every signature that needs it (`serving_default` and
    # `serve_examples` trace `call` each): one cut model, one program.
    split: list[Callable[[Any], Any]] = []

    def call(features: Any) -> Any:
        try:
            return whole.asserted(features)
        except NotWhole:
            if not split:
                split.append(_split_call(model))
            return split[0](on_host(features))

    return call


class NotWhole(Exception):
    """A lookup traced in a checked program kept its checks to itself."""


class CheckedProgram:
    """`function` (a call of layers with lookups in it) as one XLA program
    returning its outputs and the `Verdict` of every lookup's checks
    (`lookups/returned_checks.py`).

    Traced on its first call, which raises `NotWhole` when some lookup
    cannot hand its checks over (its checks would be dropped by XLA).
    """

    def __init__(self, function: Callable[[Any], Any]) -> None:
        self._function = function
        self.messages: tuple[str, ...] = ()
        """The checks' messages, known once traced (a traced program
        called again is not traced again, so they are kept here)."""
        self._compiled = tf.function(
            self._program, jit_compile=True, autograph=False
        )

    def _program(self, features: Any) -> Any:
        with returned_checks() as checks:
            outputs = self._function(features)
        if not checks.complete:
            raise NotWhole(checks.refused)
        if not checks.handed:
            self.messages = ()
            return outputs, ()
        self.messages = messages_of(checks.handed)
        folded = verdict(checks.handed)
        returned = (folded.clear, folded.first, folded.evidence)
        if folded.shown is not None:
            return outputs, returned + (folded.shown,)
        return outputs, returned

    def __call__(self, features: Any) -> tuple[Any, Verdict | None]:
        """The program's outputs and its checks' verdict (None when it
        has no checks)."""
        outputs, folded = self._compiled(features)
        return outputs, (Verdict(*folded) if folded else None)

    def asserted(self, features: Any) -> Any:
        """The program's outputs, its verdict asserted outside it: the
        call raises naming the first failed check's feature and value."""
        outputs, _ = self.checked(features)
        return outputs

    def checked(self, features: Any) -> tuple[Any, Any]:
        """`asserted`'s outputs and its assertion (None when there is
        none, or eagerly), for ops that must run only after it."""
        outputs, folded = self(features)
        if folded is None:
            return outputs, None
        return outputs, assert_clear(folded, self.messages)


def _split_call(model: keras.Model) -> Callable[[Any], Any]:
    """Every layer after the embedding layers as one XLA program, the
    lookups (and the layers before them) run as without `jit_compile`."""
    if not embedding_layers(model):
        whole: Callable[[Any], Any] = tf.function(
            lambda x: model(x, training=False), jit_compile=True
        )
        return whole
    lookups, rest = cut_at_lookups(model)
    lookups_part = keras.Model(model.input, lookup_outputs(lookups))
    program = tf.function(
        lambda values: rest(values, training=False), jit_compile=True
    )

    def call(features: Any) -> Any:
        values = tf.nest.flatten(lookups_part(features, training=False))
        return program(values + keras.tree.flatten(features))

    return call


def lookup_outputs(lookups: list[TPUEmbeddingLayer]) -> list[Any]:
    """The embedding layers' symbolic outputs in a model, each layer's
    flat, layer after layer: the first values `rest` of `cut_at_lookups`
    takes."""
    return [
        output for layer in lookups for output in tf.nest.flatten(layer.output)
    ]


def cut_at_lookups(
    model: keras.Model,
) -> tuple[list[TPUEmbeddingLayer], Callable[..., Any]]:
    """A functional model cut at its embedding layers' outputs: the layers,
    and the rest of the model (a model of every layer after them, or, when
    there is none, the outputs picked), which takes the layers' outputs
    (`lookup_outputs`) followed by the model's inputs (flat), and
    `training`.

    Raises:
        ValueError: a model that is not functional, or whose embedding
            layers are not each called once by the model itself; the
            message says to export without `jit_compile`.
    """
    inputs = _functional_inputs(model)
    lookups = embedding_layers(model)
    for layer in lookups:
        if layer not in model.layers:
            raise _refusal(
                model,
                f"its embedding layer '{layer.name}' is inside another "
                "layer or model, not called by the model itself",
            )
    cut = lookup_outputs(lookups) + list(inputs)
    at = {id(tensor): i for i, tensor in enumerate(cut)}
    outputs = keras.tree.flatten(model.output)
    if all(id(output) in at for output in outputs):
        # Nothing after the lookups (Keras builds no model whose outputs
        # are its inputs): the model's outputs picked from the cut.
        def picked(values: list[Any], training: bool = False) -> Any:
            del training
            chosen = [values[at[id(output)]] for output in outputs]
            return keras.tree.pack_sequence_as(model.output, chosen)

        return lookups, picked
    try:
        rest = keras.Model(cut, model.output)
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
    return lookups, rest


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
