"""The default export's lookups: every embedding layer's in one program.

Without `jit_compile`, a served call of a model with several embedding
layers would run one XLA program per layer, each with its own host ops to
pad the batch to a power of two and cut it back, and its own branch on its
checks, where the fastest peer runs one program for the whole call.

Here, when every embedding layer of a functional model is called once,
by the model itself, on the model's own inputs, and every lookup is the
fused host lookup of dense ids of declared widths (`lookups/fused_host.py`;
an undeclared or wider width is checked per batch outside any program),
the export:

- runs every layer's lookups as one XLA program on the inputs as they
  come, which returns their activations and the verdict of their checks
  (every input of the call of one batch size, every id in range, every
  weight finite: `lookups/returned_checks.py`; XLA drops assertions); XLA
  compiles it once per batch size served, as Keras' `jit_compile` does,
  and knows the inputs' batch sizes then, so comparing them costs a call
  nothing;
- outside it, one `Assert` raises naming the inputs and their batch sizes,
  or the feature and the bad value, when a check failed: no branch, no
  padding, no cut on a served call;
- runs the layers after the lookups as the model does, op by op
  (compiling them is `jit_compile=True`'s choice, not the default's),
  after the assertion: given inputs of other batch sizes, a layer that
  combines them would fail first naming none, or broadcast one input's
  row over the others' (`Add`).

With `pad_batches=True` the inputs the lookups read are padded to the
batch's power of two first and the activations cut back after, so that a
server that sees every batch size compiles a handful of programs; their
shapes are checked on the host before (an input of another rank cannot
be padded), and the other inputs' batch sizes are handed to the program.

The program runs the same ops on the same ids as each layer's own
program, so the answers are the same. Any other model is called as it
is: each layer then runs its own program.
"""

from __future__ import annotations

from typing import Any
from typing import Callable

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import keras_call_as_in_model
from keras_tpu_embed._compat import tf
from keras_tpu_embed.lookups.fused_host import cut_rows
from keras_tpu_embed.lookups.padded_host import bucket
from keras_tpu_embed.placement.ids import PADDING_ID
from keras_tpu_embed.serving.compiled_model import CheckedProgram
from keras_tpu_embed.serving.compiled_model import NotWhole
from keras_tpu_embed.serving.compiled_model import cut_at_lookups
from keras_tpu_embed.serving.serving_inputs import conform_rows
from keras_tpu_embed.serving.serving_inputs import ensure_one_batch
from keras_tpu_embed.serving.serving_inputs import ensure_shape_in_program
from keras_tpu_embed.serving.serving_inputs import ensure_shapes
from keras_tpu_embed.serving.serving_inputs import ensure_signature_shape
from keras_tpu_embed.serving.serving_inputs import input_keys
from keras_tpu_embed.serving.serving_inputs import one_batch_in_program
from keras_tpu_embed.serving.serving_inputs import shapes_of
from keras_tpu_embed.types import Tensor


def joined_call(
    model: keras.Model, pad_batches: bool = False, check_shapes: bool = False
) -> Callable[[Any], Any]:
    """`model`'s serving call with every embedding layer's lookups in one
    program where the model allows it (see module doc), else the model's
    own call.

    Call it inside the export's serving mode (`serving.serving_lookups`),
    with what the model takes, while tracing the serving function. With
    `check_shapes` (a signature's inputs), each input's declared shape is
    checked: in the program for the inputs the lookups read
    (`serving_inputs.ensure_shape_in_program`: at its compile, once per
    shape), on the host for the others (and, with `pad_batches`, for all
    of them, before the padding). Every input of a call must share one
    batch size: checked in the program (`one_batch_in_program`), or on
    the host where there is none (`ensure_one_batch`).
    """

    def plain(features: Any) -> Any:
        if check_shapes:
            features = ensure_one_batch(ensure_shapes(features))
        return model(features, training=False)

    try:
        lookups, rest = cut_at_lookups(model)
    except ValueError:  # not functional, or a layer called twice
        return plain
    inputs = keras.tree.flatten(model.input)
    read = {id(x) for layer in lookups for x in keras.tree.flatten(layer.input)}
    if not lookups or not read <= {id(x) for x in inputs}:
        return plain
    used = [i for i, x in enumerate(inputs) if id(x) in read]
    others = [i for i in range(len(inputs)) if i not in used]
    keys = input_keys(model.input)
    # Layers after the lookups wait for the assertion, so that none fails
    # first, naming no input, on inputs that disagree on the batch size.
    gated = isinstance(rest, keras.Model) and len(inputs) > 1

    def lookups_on(given: tuple[list[Tensor], Any]) -> list[Tensor]:
        """Every layer's activations, flat, on the model's inputs that the
        lookups read (`used`, in order), their batch sizes checked against
        the other inputs' (`given` besides: the other inputs themselves,
        or with `pad_batches` the first input's batch before padding and
        the other inputs' shapes)."""
        values, besides = given
        if check_shapes and not pad_batches:
            values = [
                ensure_shape_in_program(keys[i], value)
                for i, value in zip(used, values)
            ]
            besides = [
                ensure_shape_in_program(keys[i], value)
                for i, value in zip(others, besides)
            ]
        one_batch_in_program(_batch_sizes(values, besides), keys)
        values = conform_rows(values)
        by_input = {id(inputs[i]): value for i, value in zip(used, values)}
        activations: list[Tensor] = []
        for layer in lookups:
            activations += tf.nest.flatten(
                keras_call_as_in_model(layer, by_input, training=False)
            )
        return activations

    def _batch_sizes(values: list[Tensor], besides: Any) -> list[Tensor]:
        """Each input's batch size, in the model's order."""
        sizes: dict[int, Tensor] = {}
        if pad_batches:
            batch, shapes = besides
            first = tf.shape(values[0], out_type=tf.int64)[0]
            for i, value in zip(used, values):
                padded = tf.shape(value, out_type=tf.int64)[0]
                sizes[i] = padded - (first - batch)
            sizes.update({i: shape[0] for i, shape in zip(others, shapes)})
        else:
            for i, value in zip(used + others, values + list(besides)):
                sizes[i] = tf.shape(value, out_type=tf.int64)[0]
        return [sizes[i] for i in range(len(inputs))]

    program = CheckedProgram(lookups_on)

    def call(features: Any) -> Any:
        flat = keras.tree.flatten(features)
        if len(flat) != len(inputs) or not all(
            _paddable(flat[i]) for i in used
        ):
            return plain(features)
        if pad_batches and check_shapes:
            # Before padding: an input of another rank cannot be padded.
            flat = [ensure_signature_shape(k, v) for k, v in zip(keys, flat)]
        values = [flat[i] for i in used]
        besides: Any = [flat[i] for i in others]
        if pad_batches:
            batch = tf.shape(values[0], out_type=tf.int64)[0]
            shapes = shapes_of(besides)
            besides = (batch, shapes)
            values = _pad_rows(values, bucket(batch) - batch)
        try:
            served, check = program.checked((values, besides))
        except NotWhole:
            return plain(features)
        if pad_batches:
            start, step = tf.constant([0], tf.int64), tf.constant([1], tf.int64)
            end = tf.reshape(batch, [1])
            served = [cut_rows(value, start, end, step) for value in served]
        elif check_shapes:  # the inputs the program did not check
            flat = [
                value if i in used else ensure_signature_shape(keys[i], value)
                for i, value in enumerate(flat)
            ]
        if gated and check is not None:
            with tf.control_dependencies([check]):
                flat = tf.identity_n(flat)
        return rest(list(served) + list(flat), training=False)

    return call


def _paddable(value: Any) -> bool:
    """Whether an input can be padded with examples (dense, of known rank,
    ids or weights)."""
    return (
        isinstance(value, tf.Tensor)
        and value.shape.rank is not None
        and value.shape.rank >= 1
        and (value.dtype.is_integer or value.dtype.is_floating)
    )


def _pad_rows(values: list[Tensor], extra: Tensor) -> list[Tensor]:
    """`values` with `extra` examples more: -1 ids (padding), 0 weights.
    A padded id's weight is never read. One paddings tensor per rank,
    shared: each op is a measurable share of a small batch's call."""
    paddings = {}
    padded = []
    for value in values:
        rank = value.shape.rank
        if rank not in paddings:
            paddings[rank] = tf.pad(
                tf.reshape(extra, [1, 1]), [[0, rank - 1], [1, 0]]
            )
        pad = PADDING_ID if value.dtype.is_integer else 0
        grown = tf.pad(value, paddings[rank], constant_values=pad)
        # Shape inference cannot see that only the batch grows.
        grown.set_shape([None] + value.shape[1:])
        padded.append(grown)
    return padded
