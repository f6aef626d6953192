"""Serving export: raw features in, predictions out, tables without slots.

The exported SavedModel needs only TensorFlow to load: its
`serving_default` signature takes raw features named by feature key (and
weight key), runs the preprocessor's `tf.lookup` tables and the model in one
graph, and returns the model's outputs. Vocabulary files travel inside the
SavedModel as assets. Only the variables the serving function reads are
saved — tables and dense weights, never optimizer slots. The SHA-256 of
every file is recorded in `assets.extra/` for `kte.load_saved_model` to
verify.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any
from typing import Callable
from typing import Iterator

import numpy as np

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import nested_layers
from keras_tpu_embed._compat import print_msg
from keras_tpu_embed._compat import tf
from keras_tpu_embed.layers_in_model import embedding_layers
from keras_tpu_embed.placement.devices import SUPPORTED_SERVING_DEVICES
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.placement.devices import parse_lookup_device
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    FeaturePreprocessor,
)
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    make_parse_example_spec,
)
from keras_tpu_embed.saving.export_records import record_table_dtype
from keras_tpu_embed.saving.export_records import write_digests
from keras_tpu_embed.saving.export_records import write_export_info
from keras_tpu_embed.serving.column_preprocessor import (
    preprocessor_from_columns,
)
from keras_tpu_embed.serving.compiled_model import check_compiles
from keras_tpu_embed.serving.compiled_model import compiled_call
from keras_tpu_embed.serving.joined_lookups import joined_call
from keras_tpu_embed.serving.serving_inputs import as_batch_matrix
from keras_tpu_embed.serving.serving_inputs import cross_padding
from keras_tpu_embed.serving.serving_inputs import drop_padding
from keras_tpu_embed.serving.serving_inputs import ensure_one_batch
from keras_tpu_embed.serving.serving_inputs import ensure_signature_shape
from keras_tpu_embed.serving.serving_inputs import model_input_signature
from keras_tpu_embed.serving.serving_inputs import model_inputs
from keras_tpu_embed.serving.serving_inputs import raw_signature
from keras_tpu_embed.tables.quantization import check_table_dtype
from keras_tpu_embed.tables.quantization import dequantize_rows
from keras_tpu_embed.tables.quantization import quantize_rows
from keras_tpu_embed.types import Tensor


def _output_dict(model: keras.Model, outputs: Any) -> dict[str, Tensor]:
    if isinstance(outputs, dict):
        return dict(outputs)
    flat = tf.nest.flatten(outputs)
    names = list(getattr(model, "output_names", None) or [])
    if len(names) != len(flat):
        names = [f"output_{i}" for i in range(len(flat))]
    return dict(zip(names, flat))


@contextlib.contextmanager
def serving_lookups(
    model: keras.Model,
    lookup_device: LookupDevice | None,
    table_dtype: str = "float32",
) -> Iterator[None]:
    """Puts every embedding layer of `model` in serving mode while tracing,
    its tables stored as `table_dtype` (`tables/quantization.py`)."""
    with contextlib.ExitStack() as stack:
        for layer in embedding_layers(model):
            stack.enter_context(
                layer.serving_lookups(lookup_device, table_dtype)
            )
        yield


EXPORT_INPUTS = ("raw", "ids")


def export_saved_model(
    model: keras.Model,
    path: str | os.PathLike[str],
    preprocessor: FeaturePreprocessor | None = None,
    lookup_device: str | None = None,
    table_dtype: str = "float32",
    inputs: str = "raw",
    verbose: bool = True,
    jit_compile: bool = False,
    pad_batches: bool = False,
) -> str:
    """Writes a serving SavedModel of `model` to `path`.

    Signatures (with `inputs="raw"`, the default):
        `serving_default`: raw features by feature key (and weight key),
            as they came into training (strings as strings), `[batch]` or
            `[batch, n]`, multi-valued ones padded with `""` or -1 (their
            weights with anything: a padded id's weight is never read).
        `serve_examples`: `examples`, a `[batch]` string tensor of
            serialized `tf.Example`s, parsed with
            `make_parse_example_spec(columns)`.

    The raw features go through `preprocessor`, or, when it is None, a
    `FeaturePreprocessor` built from the columns of the model's embedding
    layers: the same mapping, since a preprocessor is a function of its
    columns, so a model reloaded from a `.keras` file exports without the
    `tf.data` code of its training. A model whose inputs those columns do
    not produce (a numeric input beside the ids, say) is refused: pass its
    preprocessor, or `inputs="ids"`. A model that holds its preprocessor
    as a layer takes raw features itself and is exported with its inputs.

    `inputs="ids"` exports the model's own inputs instead (ids and weights
    as the embedding layers take them, dense), with no `serve_examples`:
    for a serving system that maps raw values to ids itself. Each input
    has the model's declared shape (`keras.Input((1,))`: `[batch, 1]`);
    another rank or width is refused in the graph, naming the input.

    Outputs: a dict with one key per model output, named after it
    (`model.output_names`: the output layer's name, such as `"score"` for
    `Dense(1, name="score")`; Keras names an unnamed layer `dense_1`); a
    model returning a dict keeps its keys. With `verbose`, the signatures,
    their inputs and their output keys are printed (through Keras'
    `print_msg`, as `model.summary()` prints).

    Each layer's lookups run on its `serving_lookup_device` (or
    `lookup_device` for all): `"cpu"` for host lookups,
    `"tpu_tensor_core"` for the dense lookup compiled with XLA. Columns
    without a serving choice serve on the CPU. There, dense ids of declared
    widths (the `inputs="ids"` export of a functional model that calls
    each embedding layer once on its own inputs) are looked up by one
    compiled XLA program for every layer (`serving/joined_lookups.py`),
    which XLA compiles once per batch size served, as Keras' `jit_compile`
    does: the first call at a new batch size waits for the compile (about
    0.2 s for the 4-feature model of `benchmarks/`), later ones do not.
    A server that sees every batch size from 1 to N compiles N programs:
    batch to a few sizes (TF Serving's `allowed_batch_sizes`), or pass
    `pad_batches=True`, which pads each call's batch to a power of two and
    cuts the answer back (about log2(N) programs, one pad and one cut per
    input per call). Other lookups on the CPU (raw features, ids of
    undeclared width) are padded to a power of two and looked up by one
    compiled gather and combiner per layer, or, when padding would cost
    more than it saves (one very long row), by sparse ops; both give the
    same answer. Dense ids of a declared width of at most 64 are always
    gathered as sent, as a `keras.layers.Embedding` does. Nothing is
    truncated on the CPU. Every id is checked in range and every weight
    finite on every call, in the compiled program; one assertion after it
    raises `tf.errors.InvalidArgumentError` naming the feature and the
    largest id (or the weight feature and its count of NaN or inf
    values).

    Every feature of a `serving_default` call must hold one row per
    example: a call whose features disagree on the batch size raises
    `tf.errors.InvalidArgumentError` naming every feature and its batch
    size, in every variant (checked in the compiled program where the
    call runs one, else on the host before the model), never answering
    with one feature's rows broadcast over the others'. `serve_examples`
    parses every feature from one `[batch]` tensor, so its features
    cannot disagree.

    `table_dtype` stores the exported tables as `"float32"` (as trained),
    `"bfloat16"` or `"int8"` (uint8 codes with a float32 scale and offset
    per row); rows are dequantized right after the gather, before
    `max_norm` and the combiner. Per element, a served row differs from
    the trained one by at most `2**-8 * |x|` (bfloat16) or
    `(row max - row min) / 510` (int8); a combined output by at most the
    weighted sum of its rows' bounds over the combiner's normalizer. Only
    the quantized tables are saved; the model's own stay float32.

    `jit_compile=True` compiles the model with XLA, every check kept
    (`serving/compiled_model.py`): the whole model, lookups included, as
    one program when every lookup serves dense ids of declared widths on
    the CPU (their checks are returned from the program and acted on
    outside it); otherwise every layer of a functional model after its
    embedding layers, the lookups run apart as without it. XLA compiles
    once per batch size served (the first call at a new size waits for
    it), and once at export, so that a model XLA cannot compile fails
    here. For servers that batch to a few sizes.

    Args:
        model: A Keras model whose inputs are the preprocessor's outputs
            (ids and weights keyed by feature key).
        path: Directory to write.
        preprocessor: The `FeaturePreprocessor` used in training; None
            builds one from the embedding layers' columns.
        lookup_device: `None` (each layer's choice) or `"cpu"` /
            `"tpu_tensor_core"` for every layer.
        table_dtype: `"float32"`, `"bfloat16"` or `"int8"`.
        inputs: `"raw"` (raw features in) or `"ids"` (the model's inputs).
        verbose: Print the signatures and output keys.
        jit_compile: Compile the layers after the embedding layers with
            XLA.
        pad_batches: Pad each call's batch to a power of two before the
            joined lookups' program (see above), so that XLA compiles
            a handful of programs whatever batch sizes are served. Not
            with `jit_compile`, whose program takes the whole model.

    Returns:
        The path written.

    Raises:
        ValueError: an unknown `inputs`, `lookup_device` or `table_dtype`;
            `preprocessor` with `inputs="ids"`; without `preprocessor`, a
            model with no embedding layer or with inputs its columns do not
            produce; a table with NaN or inf values quantized; a column on
            `tpu_embedding_core` with no serving choice; the tensor core for
            a column without `tensor_core_shape`; with `jit_compile`,
            where the lookups cannot join the program, a model that is not
            functional or an embedding layer nested in another layer or
            called twice; layers XLA cannot compile; `pad_batches` with
            `jit_compile`.

    Example:

    >>> item = categorical_column_with_identity("item_id", 10)
    >>> inputs = FeaturePreprocessor([embedding_column(item, 4)]).keras_inputs()
    >>> emb = TPUEmbeddingLayer([embedding_column(item, 4)], output="concat")
    >>> score = keras.layers.Dense(1, name="score")(emb(inputs))
    >>> model = keras.Model(inputs, score)
    >>> import tempfile
    >>> path = export_saved_model(model, tempfile.mkdtemp())
    ... # doctest: +ELLIPSIS, +NORMALIZE_WHITESPACE
    Exported SavedModel to ...
      serving_default(item_id: int64) -> {'score': float32 (None, 1)}
      serve_examples(examples: string) -> {'score': float32 (None, 1)}
      Serve with TensorFlow alone:
      tf.saved_model.load(path).signatures['serving_default'](**features)
    >>> serve = tf.saved_model.load(path).signatures["serving_default"]
    >>> serve(item_id=tf.constant([1, 2], tf.int64))["score"].shape
    TensorShape([2, 1])
    """
    if inputs not in EXPORT_INPUTS:
        raise ValueError(
            "inputs must be 'raw' (raw features in, through the "
            "preprocessor) or 'ids' (the model's own id inputs). "
            f"Received: inputs={inputs!r}."
        )
    if inputs == "ids" and preprocessor is not None:
        raise ValueError(
            "preprocessor= maps raw features to ids, and inputs='ids' exports "
            "the model's id inputs without one: pass one or the other. "
            "Received both."
        )
    device = parse_lookup_device(
        lookup_device, "lookup_device", SUPPORTED_SERVING_DEVICES
    )
    check_table_dtype(table_dtype)
    if pad_batches and jit_compile:
        raise ValueError(
            "pad_batches=True pads the batch of the embedding layers' "
            "lookups, but jit_compile=True compiles the whole model as one "
            "program, whose batch is never padded (a layer that mixes rows "
            "would answer from the padding). Pass one or the other. "
            "Received: pad_batches=True, jit_compile=True."
        )
    path = os.fspath(path)
    signatures = {}
    with serving_lookups(model, device, table_dtype):
        # Inside: a layer that cannot serve at all says so first.
        if inputs == "raw" and preprocessor is None:
            preprocessor = preprocessor_from_columns(model)
        call = _model_call(model, jit_compile, pad_batches, inputs == "ids")
        if preprocessor is not None:
            signatures = _raw_signatures(model, preprocessor, call)
        else:
            signature = model_input_signature(model)

            def serve_ids(features: dict[str, Tensor]) -> dict[str, Tensor]:
                # `call` checks each input's signature shape, and that
                # they share one batch size, in its compiled program where
                # it has one.
                dense = {k: as_batch_matrix(k, v) for k, v in features.items()}
                return _output_dict(model, call(dense))

            signatures["serving_default"] = tf.function(
                serve_ids, input_signature=[signature], autograph=False
            ).get_concrete_function()
        if jit_compile:
            # `serve_examples` runs the same program on parsed examples.
            served = signatures["serving_default"]
            check_compiles(served, served.structured_input_signature[0][0])
        # Inside: quantized tables live only while the context holds them.
        root = tf.Module()
        # Track exactly what the serving graphs read: tables (or their
        # quantized copies) and dense weights, not optimizer slots, steps
        # or the gradient trap.
        variables = {}
        for concrete in signatures.values():
            for variable in concrete.variables:
                variables[id(variable)] = variable
        root.variables_read = list(variables.values())
    # The preprocessor's tf.lookup tables, and those of a preprocessor the
    # model holds as a layer: the signatures capture them.
    held = [preprocessor] if preprocessor is not None else []
    if isinstance(model, keras.layers.Layer):
        held += [
            layer
            for layer in nested_layers(model)
            if isinstance(layer, FeaturePreprocessor)
        ]
    root.lookup_tables = [table for p in held for table in p.lookup_tables]
    record_table_dtype(root, table_dtype)
    tf.saved_model.save(root, path, signatures=signatures)
    write_export_info(path, table_dtype)
    write_digests(path)
    if verbose:
        print_msg(export_summary(path, signatures))
    return path


def _model_call(
    model: keras.Model, jit_compile: bool, pad_batches: bool, signature: bool
) -> Callable[[Any], Any]:
    """The model's serving call: its lookups joined in one program where
    it allows (`joined_lookups.py`), or compiled with XLA (`jit_compile`,
    `compiled_model.py`). With `signature`, the call takes a signature's
    inputs and checks each one's declared shape
    (`serving_inputs.ensure_signature_shape`)."""
    if jit_compile:
        return compiled_call(model, signature)
    return joined_call(model, pad_batches, signature)


def _raw_signatures(
    model: keras.Model,
    preprocessor: FeaturePreprocessor,
    call: Callable[[Any], Any],
) -> dict[str, Any]:
    """`serving_default` on raw features and `serve_examples`, traced."""
    pads = cross_padding(preprocessor)

    def serve(features: dict[str, Tensor]) -> dict[str, Tensor]:
        dense = {k: as_batch_matrix(k, v) for k, v in features.items()}
        # Before the preprocessor, whose ids of another batch size a layer
        # would broadcast or fail on, naming no feature.
        dense = ensure_one_batch(dense)
        dense = drop_padding(dense, pads)
        ids = model_inputs(model, preprocessor(dense))
        return _output_dict(model, call(ids))

    spec = make_parse_example_spec(preprocessor.categorical_columns)

    def serve_examples(examples: Tensor) -> dict[str, Tensor]:
        # Parsed from one `[batch]` tensor, every feature has its batch
        # size; a scalar would parse into features of no batch, which the
        # lookups would fail on naming nothing.
        examples = ensure_signature_shape("examples", examples)
        features = tf.io.parse_example(examples, spec)
        ids = model_inputs(model, preprocessor(features))
        return _output_dict(model, call(ids))

    # serving_default first: the printed summary lists it first.
    return {
        "serving_default": tf.function(
            serve,
            input_signature=[raw_signature(preprocessor)],
            autograph=False,
        ).get_concrete_function(),
        "serve_examples": tf.function(
            serve_examples,
            input_signature=[tf.TensorSpec([None], tf.string, "examples")],
            autograph=False,
        ).get_concrete_function(),
    }


def export_summary(path: str, signatures: dict[str, Any]) -> str:
    """What an export takes and returns, per signature, as printed."""
    lines = [f"Exported SavedModel to {path}"]
    for name, concrete in signatures.items():
        # Specs are named after their feature (see `_raw_signature`).
        taken = ", ".join(
            f"{spec.name}: {spec.dtype.name}"
            for spec in tf.nest.flatten(concrete.structured_input_signature)
        )
        given = ", ".join(
            f"'{key}': {tensor.dtype.name} {tuple(tensor.shape)}"
            for key, tensor in concrete.structured_outputs.items()
        )
        lines.append(f"  {name}({taken}) -> {{{given}}}")
    lines.append("  Serve with TensorFlow alone:")
    lines.append(
        "  tf.saved_model.load(path).signatures['serving_default'](**features)"
    )
    return "\n".join(lines)


def quantization_error(
    model: keras.layers.Layer, table_dtype: str
) -> dict[str, float]:
    """Per table of `model`'s embedding layers, the largest `|x̂ - x|` over
    its elements if exported with `table_dtype` (see `export_saved_model`).

    Example:

    >>> item = categorical_column_with_identity("item", 100)
    >>> layer = TPUEmbeddingLayer([embedding_column(item, 8)])
    >>> _ = layer({"item": tf.constant([[1]], tf.int64)})
    >>> errors = quantization_error(layer, "int8")
    >>> list(errors), errors["item"] < 0.01
    (['item'], True)

    Raises:
        ValueError: an unknown `table_dtype`; a table with NaN or inf.
    """
    check_table_dtype(table_dtype)
    errors = {}
    for layer in embedding_layers(model):
        for spec in layer.table_specs:
            values = np.asarray(layer.table_variable(spec.name).numpy())
            codes, scale_offset = quantize_rows(values, table_dtype, spec.name)
            served = np.asarray(dequantize_rows(codes, scale_offset))
            errors[spec.name] = float(np.max(np.abs(served - values)))
    return errors
