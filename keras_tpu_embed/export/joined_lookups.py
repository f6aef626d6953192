"""The default export's lookups: every embedding layer's in one program.

Without `jit_compile`, a served call of a model with several embedding
layers ran one XLA program per layer, each with its own host ops to pad
the batch to a power of two and cut it back, and its own `If` on its
checks. In the W1 workload of `benchmarks/` that was 2 programs and 9
executor steps at batch 1, where the fastest peer runs one program.

Here, when every embedding layer of a functional model is called once,
by the model itself, on the model's own inputs, and every lookup is the
fused host lookup of dense ids of declared widths (`lookup/fused_host.py`;
an undeclared or wider width is checked per batch outside any program),
the export:

- pads the inputs the lookups read to the batch's power of two, once
  (XLA then compiles a handful of programs, as for one layer);
- runs every layer's lookups as one XLA program, which returns their
  activations and one flag: every id in range, every weight finite
  (`lookup/returned_checks.py`; XLA drops assertions);
- cuts the activations back to the batch and, in one `If`, takes them
  when the flag is clear and the inputs share one batch size; otherwise
  the layers run as they do alone, which raises naming the feature and
  the bad value, or answers each input of its own batch size;
- runs the layers after the lookups as the model does, op by op
  (compiling them is `jit_compile=True`'s choice, not the default's).

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
from keras_tpu_embed._compat import tf_fast_cond
from keras_tpu_embed.export.compiled_model import NotWhole
from keras_tpu_embed.export.compiled_model import checked_program
from keras_tpu_embed.export.compiled_model import cut_at_lookups
from keras_tpu_embed.lookup.fused_host import cut_rows
from keras_tpu_embed.lookup.padded_host import bucket
from keras_tpu_embed.preprocessing.ids import PADDING_ID
from keras_tpu_embed.types import Tensor


def joined_call(model: keras.Model) -> Callable[[Any], Any]:
    """`model`'s serving call with every embedding layer's lookups in one
    program where the model allows it (see module doc), else the model's
    own call.

    Call it inside the export's serving mode (`serving.serving_lookups`),
    with what the model takes, while tracing the serving function.
    """

    def plain(features: Any) -> Any:
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

    def lookups_on(flat: dict[int, Tensor]) -> list[Tensor]:
        """Every layer's activations, flat, on the model's inputs `flat`
        (by position)."""
        values = {id(inputs[i]): value for i, value in flat.items()}
        activations: list[Tensor] = []
        for layer in lookups:
            activations += tf.nest.flatten(
                keras_call_as_in_model(layer, values, training=False)
            )
        return activations

    def joined(padded: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """The activations, and whether the inputs share one batch size
        (padded alike, they do only if their batches did): the cut takes
        one batch size. XLA folds the comparison of its static shapes."""
        sizes = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in padded])
        return lookups_on(dict(zip(used, padded))), tf.reduce_all(
            tf.equal(sizes, sizes[0])
        )

    program = checked_program(joined)

    def call(features: Any) -> Any:
        flat = keras.tree.flatten(features)
        if len(flat) != len(inputs) or not all(
            _paddable(flat[i]) for i in used
        ):
            return plain(features)
        batch = tf.shape(flat[used[0]], out_type=tf.int64)[0]
        extra = bucket(batch) - batch
        try:
            (values, one_batch), clear = program(
                _pad_rows([flat[i] for i in used], extra)
            )
        except NotWhole:
            return plain(features)
        start, step = tf.constant([0], tf.int64), tf.constant([1], tf.int64)
        end = tf.reshape(batch, [1])
        served = [cut_rows(value, start, end, step) for value in values]
        # Not clear: the layers alone, whose lookups raise naming the
        # feature, or answer inputs of other batch sizes each as its own.
        chosen = tf_fast_cond(
            tf.logical_and(clear, one_batch),
            lambda: served,
            lambda: lookups_on(dict(enumerate(flat))),
        )
        return rest(list(chosen) + flat, training=False)

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
