"""What a serving signature takes: its specs, and the model's inputs.

A raw feature comes into `serving_default` as `[batch]` or `[batch, n]`
(`raw_signature`) and is checked and shaped to `[batch, n]`
(`as_batch_matrix`); the padding of a crossed key is dropped before it is
crossed (`cross_padding`, `drop_padding`); the model is then given exactly
its own inputs, by name (`model_inputs`). A signature's inputs are checked
to have their declared shapes (`ensure_shapes`) and one batch size: in a
checked program (`one_batch_in_program`, its inputs conformed to one batch
by `conform_rows` so that it compiles to say so) or on the host
(`ensure_one_batch`).
"""

from __future__ import annotations

import re
from typing import Any

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.lookups import returned_checks
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    FeaturePreprocessor,
)
from keras_tpu_embed.types import Tensor


def raw_signature(preprocessor: FeaturePreprocessor) -> dict[str, Any]:
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


def as_batch_matrix(key: str, value: Tensor) -> Tensor:
    """`[b]` and `[b, n]` inputs as `[b, n]` (a scalar per row gives n=1).

    A rank-3 feature must fail, naming it, not be flattened into rows. A
    signature of known rank (`model_input_signature`) is checked here, at
    trace time, at no cost per call; one that leaves the rank open (raw
    features come as `[b]` or `[b, n]`) is checked in the graph.

    Raises:
        ValueError: a known rank other than 1 or 2.
    """
    if value.shape.rank is not None:
        if value.shape.rank not in (1, 2):
            raise ValueError(
                f"Feature '{key}' must be [batch] or [batch, n]. Received "
                f"rank {value.shape.rank}, shape {value.shape}."
            )
        return value[:, tf.newaxis] if value.shape.rank == 1 else value
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


def cross_padding(preprocessor: FeaturePreprocessor) -> dict[str, Any]:
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


def drop_padding(
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
    if not has_input_tensors(model):
        # A subclassed model declares no inputs: its `call` reads the dict
        # by key itself.
        return features
    names = list(model_input_specs(model))
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


def has_input_tensors(model: keras.Model) -> bool:
    try:
        return bool(model.inputs)
    except (AttributeError, ValueError):
        return False


def model_input_specs(model: keras.Model) -> dict[str, Any]:
    inputs = model.inputs
    if isinstance(model.input, dict):
        return {name: tensor for name, tensor in model.input.items()}
    return {tensor.name: tensor for tensor in inputs}


def model_input_signature(model: keras.Model) -> dict[str, Any]:
    """A dense TensorSpec per model input, of the input's own shape.

    The shapes are the model's declared contract, so a call of another
    rank or width is refused by the signature itself, naming the input;
    with every shape known, no rank check or reshape runs per call, and the
    lookups see static widths.

    Raises:
        ValueError: a model that declares no inputs (subclassed); an input
            of rank 3 or more.
    """
    if not has_input_tensors(model):
        raise ValueError(
            "inputs='ids' exports the inputs a model declares, but "
            f"{type(model).__name__} '{model.name}' is subclassed and "
            "declares none. Export with inputs='raw' (the default: raw "
            "features through the columns' preprocessor), or build the "
            "model functionally: keras.Model(inputs, outputs)."
        )
    specs = {}
    for name, tensor in model_input_specs(model).items():
        shape = tf.TensorShape(tensor.shape)
        if shape.rank is not None and shape.rank not in (1, 2):
            raise ValueError(
                f"inputs='ids' serves inputs of shape [batch] or [batch, n], "
                f"but the model input '{name}' has shape {shape}. Give the "
                "model [batch, n] inputs, or export with inputs='raw'."
            )
        specs[name] = tf.TensorSpec(shape, tensor.dtype, name=name)
    return specs


def ensure_signature_shape(key: str, value: Tensor) -> Tensor:
    """`value`, checked in the graph to have its static (signature) shape.

    A loaded SavedModel's signature runs its graph on tensors of any shape:
    the graph traced for `[batch, 1]` would take `[batch]` or `[batch, 2]`
    and fail deep inside, or answer from the wrong cells. One `EnsureShape`
    op per feature refuses them first, naming the feature.
    """
    # The op names the input in its error: "Shape of tensor {key} [...]".
    del key
    return tf.ensure_shape(value, value.shape)


def ensure_shape_in_program(key: str, value: Tensor) -> Tensor:
    """`ensure_signature_shape` inside an XLA program: XLA compiles a
    program for the shapes it is called with, and the check runs at that
    compile, so another shape is refused there (naming the feature), and
    a call of the declared shape pays nothing."""
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", key)
    if not re.match(r"[A-Za-z0-9.]", name):  # TensorFlow's op names
        name = f"input{name}"
    return tf.ensure_shape(tf.identity(value, name=name), value.shape)


def ensure_shapes(features: Any, in_program: bool = False) -> Any:
    """Every input of `features` (a signature's inputs, or those a model
    takes) checked to have its static shape, named by its key:
    `ensure_signature_shape`, or `ensure_shape_in_program` inside an XLA
    program."""
    check = ensure_shape_in_program if in_program else ensure_signature_shape
    flat = keras.tree.flatten(features)
    checked = [check(key, v) for key, v in zip(input_keys(features), flat)]
    return keras.tree.pack_sequence_as(features, checked)


def input_keys(structure: Any) -> list[str]:
    """The key of each input of `structure` (a dict, or a nest of them) in
    flattening order: its path, joined by "/"."""
    return [
        "/".join(str(key) for key in path)
        for path, _ in keras.tree.flatten_with_path(structure)
    ]


def batch_sizes_message(keys: list[str]) -> str:
    """What a call whose inputs `keys` disagree on the batch size says,
    before their batch sizes (in the same order)."""
    names = ", ".join(f"'{key}'" for key in keys)
    return (
        f"Features {names} must each hold one row per example of the call, "
        "but their batch sizes differ: give each the same number of rows. "
        "Batch sizes, in that order:"
    )


def ensure_one_batch(features: Any) -> Any:
    """`features` (a signature's inputs, each of rank 1 or more) checked on
    the host to share one batch size: one `Assert` naming every input and
    its batch size, which the returned tensors wait for (so that no layer
    fails first on rows that do not line up, or broadcasts one input's
    row over the others'). For the calls that run no checked program
    (`one_batch_in_program`)."""
    flat = keras.tree.flatten(features)
    if len(flat) < 2:
        return features
    ranks = {value.shape.rank for value in flat}
    if len(ranks) == 1 and None not in ranks:
        sizes = tf.stack(shapes_of(flat))[:, 0]
    else:
        sizes = tf.stack([tf.shape(v, out_type=tf.int64)[0] for v in flat])
    check = tf.raw_ops.Assert(
        condition=tf.reduce_all(tf.equal(sizes, sizes[0])),
        data=[tf.constant(batch_sizes_message(input_keys(features))), sizes],
        summarize=len(flat),
    )
    with tf.control_dependencies([check]):
        waiting = tf.identity_n(flat)
    return keras.tree.pack_sequence_as(features, waiting)


def shapes_of(values: list[Tensor]) -> list[Tensor]:
    """Each of `values`' shapes (int64), from one `ShapeN` op per dtype
    among them (the op takes tensors of one dtype): a served call's host
    ops are most of a small batch's time."""
    by_dtype: dict[Any, list[int]] = {}
    for i, value in enumerate(values):
        by_dtype.setdefault(value.dtype, []).append(i)
    shapes: dict[int, Tensor] = {}
    for indices in by_dtype.values():
        group = [values[i] for i in indices]
        shapes.update(zip(indices, tf.shape_n(group, out_type=tf.int64)))
    return [shapes[i] for i in range(len(values))]


def one_batch_in_program(sizes: list[Tensor], keys: list[str]) -> None:
    """Hands the check that `sizes` (the batch sizes of the inputs `keys`,
    scalars) are equal to the checked program being traced
    (`lookups/returned_checks.py`), its message naming every input and its
    batch size. XLA knows the sizes of its inputs when it compiles, so the
    comparison of static sizes costs a served call nothing."""
    handed = returned_checks.active()
    if handed is None or len(sizes) < 2:
        return
    stacked = tf.stack([tf.cast(size, tf.int64) for size in sizes])
    differ = tf.not_equal(stacked, stacked[0])
    handed.own(
        returned_checks.Checks(
            worst=tf.cast(tf.reduce_any(differ), tf.int64) - 1,
            details=lambda: (
                tf.reshape(tf.logical_not(tf.reduce_any(differ)), [1]),
                tf.reshape(stacked, [1, len(sizes)]),
            ),
            messages=(batch_sizes_message(keys),),
            shows=len(sizes),
        )
    )


def conform_rows(values: list[Tensor]) -> list[Tensor]:
    """`values` cut or padded (with zeros) to the first one's batch size,
    inside an XLA program: a program whose inputs disagree on the batch
    would fail at its compile, naming none, before its checks could name
    them (`one_batch_in_program`). For inputs of one batch size, as XLA
    knows when it compiles, the cut and the pad are of nothing and cost
    nothing."""
    rows = tf.shape(values[0])[0]
    conformed = [values[0]]
    for value in values[1:]:
        kept = value[:rows]
        grow = tf.stack([0, rows - tf.shape(kept)[0]])
        others = tf.zeros([value.shape.rank - 1, 2], tf.int32)
        grown = tf.pad(kept, tf.concat([grow[tf.newaxis], others], 0))
        grown.set_shape([None] + value.shape[1:])
        conformed.append(grown)
    return conformed
