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
from typing import Iterator

import numpy as np

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import nested_layers
from keras_tpu_embed._compat import print_msg
from keras_tpu_embed._compat import tf
from keras_tpu_embed.export.export_records import record_table_dtype
from keras_tpu_embed.export.export_records import write_digests
from keras_tpu_embed.export.export_records import write_export_info
from keras_tpu_embed.export.quantization import check_table_dtype
from keras_tpu_embed.export.quantization import dequantize_rows
from keras_tpu_embed.export.quantization import quantize_rows
from keras_tpu_embed.layers_in_model import embedding_layers
from keras_tpu_embed.lookup.devices import SUPPORTED_SERVING_DEVICES
from keras_tpu_embed.lookup.devices import LookupDevice
from keras_tpu_embed.lookup.devices import parse_lookup_device
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    FeaturePreprocessor,
)
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    make_parse_example_spec,
)
from keras_tpu_embed.types import Tensor


def _raw_signature(preprocessor: FeaturePreprocessor) -> dict[str, Any]:
    """A TensorSpec per raw feature; rank left open for `[b]` or `[b, n]`."""
    specs = {}
    for column in preprocessor.categorical_columns:
        # Bucketized and crossed columns read other (numeric) features.
        for key, dtype_name in column.raw_inputs.items():
            if dtype_name == "string":
                dtype = tf.string
            elif tf.as_dtype(dtype_name).is_floating:
                dtype = tf.float32
            else:
                dtype = tf.int64
            specs[key] = tf.TensorSpec(None, dtype, name=key)
        if column.weight_feature_key:
            specs[column.weight_feature_key] = tf.TensorSpec(
                None, tf.float32, name=column.weight_feature_key
            )
    return specs


def _as_batch_matrix(key: str, value: Tensor) -> Tensor:
    """`[b]` and `[b, n]` inputs as `[b, n]` (a scalar per row gives n=1).

    The signature leaves the rank open, so the check runs in the graph:
    a rank-3 feature must fail, naming it, not be flattened into rows.
    """
    rank = tf.rank(value)
    check = tf.debugging.Assert(
        tf.logical_and(rank >= 1, rank <= 2),
        [
            f"Feature '{key}' must be [batch] or [batch, n]. Received rank",
            rank,
            "shape",
            tf.shape(value),
        ],
    )
    with tf.control_dependencies([check]):
        shape = tf.shape(value)
    return tf.reshape(value, tf.stack([shape[0], tf.reduce_prod(shape[1:])]))


def _cross_padding(preprocessor: FeaturePreprocessor) -> dict[str, Any]:
    """Raw keys crossed by a crossed column -> their padding in the
    `serving_default` signature (`""`, or -1 for integer keys).

    A dense input reaches TF's cross op with every value, padding included
    (`columns.id_mapping.crossed_ids`); the signature's padding is not a
    value, so it is dropped before crossing, as `serve_examples` and ragged
    or sparse training inputs have none.

    Raises:
        ValueError: a crossed key also read by a weighted column, whose ids
            and weights must keep one shape.
    """
    pads: dict[str, Any] = {}
    crossed_by: dict[str, str] = {}
    for column in preprocessor.categorical_columns:
        crossed = column.base.crossed_padding
        pads.update(crossed)
        crossed_by.update(dict.fromkeys(crossed, column.base.name))
    for column in preprocessor.categorical_columns:
        if not column.weight_feature_key:
            continue
        shared = sorted(
            {column.key, column.weight_feature_key} & set(crossed_by)
        )
        if shared:
            raise ValueError(
                f"Feature '{shared[0]}' is crossed by '{crossed_by[shared[0]]}'"
                f" and read by the weighted column '{column.name}': the "
                "serving signature drops a crossed key's padding, which "
                "would part the weighted column's ids from its weights. "
                "Give the crossed column a copy of the feature under "
                "another key."
            )
    return pads


def _drop_padding(
    features: dict[str, Tensor], pads: dict[str, Any]
) -> dict[str, Tensor]:
    """`features` with each key of `pads` sparse, its padding dropped."""
    result = dict(features)
    for key, pad in pads.items():
        if key not in result:
            continue  # the preprocessor names the missing key
        value = result[key]
        keep = tf.where(tf.not_equal(value, tf.constant(pad, value.dtype)))
        result[key] = tf.SparseTensor(
            keep, tf.gather_nd(value, keep), tf.shape(value, tf.int64)
        )
    return result


def _output_dict(model: keras.Model, outputs: Any) -> dict[str, Tensor]:
    if isinstance(outputs, dict):
        return dict(outputs)
    flat = tf.nest.flatten(outputs)
    names = list(getattr(model, "output_names", None) or [])
    if len(names) != len(flat):
        names = [f"output_{i}" for i in range(len(flat))]
    return dict(zip(names, flat))


def model_inputs(model: keras.Model, features: dict[str, Any]) -> Any:
    """Exactly the model's inputs, taken from `features` by name.

    A functional model given a dict with extra keys warns and then matches
    its inputs by position (keras/src/models/functional.py,
    `Functional._standardize_inputs`): an extra `a` would give `b` the
    values of `a`. So the model gets its own keys only, and a missing one
    is an error.

    Raises:
        KeyError: a model input that `features` does not hold.
    """
    if not _has_input_tensors(model):
        # A subclassed model declares no inputs: its `call` reads the dict
        # by key itself.
        return features
    names = list(_model_input_specs(model))
    missing = [name for name in names if name not in features]
    if missing:
        raise KeyError(
            f"The model takes the inputs {names}, but the preprocessor does "
            f"not produce {missing}. Give the preprocessor the columns "
            f"reading {missing}. It produces: {sorted(features)}."
        )
    selected = {name: features[name] for name in names}
    if isinstance(model.input, dict):
        return selected
    return [selected[name] for name in names]


@contextlib.contextmanager
def serving_lookups(
    model: keras.Model,
    lookup_device: LookupDevice | None,
    table_dtype: str = "float32",
) -> Iterator[None]:
    """Puts every embedding layer of `model` in serving mode while tracing,
    its tables stored as `table_dtype` (`export/quantization.py`)."""
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
    for a serving system that maps raw values to ids itself.

    Outputs: a dict with one key per model output, named after it
    (`model.output_names`: the output layer's name, such as `"score"` for
    `Dense(1, name="score")`; Keras names an unnamed layer `dense_1`); a
    model returning a dict keeps its keys. With `verbose`, the signatures,
    their inputs and their output keys are printed (through Keras'
    `print_msg`, as `model.summary()` prints).

    Each layer's lookups run on its `serving_lookup_device` (or
    `lookup_device` for all): `"cpu"` for host lookups,
    `"tpu_tensor_core"` for the dense lookup compiled with XLA. Columns
    without a serving choice serve on the CPU. On the CPU a batch is padded
    and looked up by one compiled gather and combiner per column, or, when
    padding would cost more than it saves (one very long row), by sparse
    ops; both give the same answer. Nothing is truncated on the CPU.

    `table_dtype` stores the exported tables as `"float32"` (as trained),
    `"bfloat16"` or `"int8"` (uint8 codes with a float32 scale and offset
    per row); rows are dequantized right after the gather, before
    `max_norm` and the combiner. Per element, a served row differs from
    the trained one by at most `2**-8 * |x|` (bfloat16) or
    `(row max - row min) / 510` (int8); a combined output by at most the
    weighted sum of its rows' bounds over the combiner's normalizer. Only
    the quantized tables are saved; the model's own stay float32.

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

    Returns:
        The path written.

    Raises:
        ValueError: an unknown `inputs`, `lookup_device` or `table_dtype`;
            `preprocessor` with `inputs="ids"`; without `preprocessor`, a
            model with no embedding layer or with inputs its columns do not
            produce; a table with NaN or inf values quantized; a column on
            `tpu_embedding_core` with no serving choice; the tensor core for
            a column without `tensor_core_shape`.

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
    path = os.fspath(path)
    signatures = {}
    with serving_lookups(model, device, table_dtype):
        # Inside: a layer that cannot serve at all says so first.
        if inputs == "raw" and preprocessor is None:
            preprocessor = preprocessor_from_columns(model)
        if preprocessor is not None:
            signatures = _raw_signatures(model, preprocessor)
        else:
            signature = {
                name: tf.TensorSpec(None, spec.dtype, name=name)
                for name, spec in _model_input_specs(model).items()
            }

            def serve(features: dict[str, Tensor]) -> dict[str, Tensor]:
                dense = {k: _as_batch_matrix(k, v) for k, v in features.items()}
                return _output_dict(model, model(dense, training=False))

            signatures["serving_default"] = tf.function(
                serve, input_signature=[signature], autograph=False
            ).get_concrete_function()
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


def _raw_signatures(
    model: keras.Model, preprocessor: FeaturePreprocessor
) -> dict[str, Any]:
    """`serving_default` on raw features and `serve_examples`, traced."""
    pads = _cross_padding(preprocessor)

    def serve(features: dict[str, Tensor]) -> dict[str, Tensor]:
        dense = {k: _as_batch_matrix(k, v) for k, v in features.items()}
        dense = _drop_padding(dense, pads)
        ids = model_inputs(model, preprocessor(dense))
        return _output_dict(model, model(ids, training=False))

    spec = make_parse_example_spec(preprocessor.categorical_columns)

    def serve_examples(examples: Tensor) -> dict[str, Tensor]:
        features = tf.io.parse_example(examples, spec)
        ids = model_inputs(model, preprocessor(features))
        return _output_dict(model, model(ids, training=False))

    # serving_default first: the printed summary lists it first.
    return {
        "serving_default": tf.function(
            serve,
            input_signature=[_raw_signature(preprocessor)],
            autograph=False,
        ).get_concrete_function(),
        "serve_examples": tf.function(
            serve_examples,
            input_signature=[tf.TensorSpec([None], tf.string, "examples")],
            autograph=False,
        ).get_concrete_function(),
    }


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
            layer._check_not_on_engine(table.name)
    columns = [column for layer in layers for column in layer.columns]
    try:
        preprocessor = FeaturePreprocessor(columns)
    except ValueError as error:
        raise ValueError(
            f"The embedding layers' columns do not make one preprocessor: "
            f"{error} " + what_to_pass
        ) from error
    if not _has_input_tensors(model):
        return preprocessor
    produced = preprocessor.compute_output_spec(None)
    unfed = {}
    for name, tensor in _model_input_specs(model).items():
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


def quantization_error(model: Any, table_dtype: str) -> dict[str, float]:
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


def _has_input_tensors(model: keras.Model) -> bool:
    try:
        return bool(model.inputs)
    except (AttributeError, ValueError):
        return False


def _model_input_specs(model: keras.Model) -> dict[str, Any]:
    inputs = model.inputs
    if isinstance(model.input, dict):
        return {name: tensor for name, tensor in model.input.items()}
    return {tensor.name: tensor for tensor in inputs}
