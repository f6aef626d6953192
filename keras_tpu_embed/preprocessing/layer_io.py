"""What goes into an embedding layer and what comes out of it.

In: a dict of ids (and weights) keyed by feature key, or one tensor when the
layer reads one unweighted feature; extra keys are ignored by name, never by
position. Out: per column name its activation (cast to the layer's compute
dtype), plus `<name>_sequence_length` for sequence columns when asked, as a
dict, or all of them concatenated in name order like `DenseFeatures`.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Sequence

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.columns import input_keys
from keras_tpu_embed.types import SUPPORTED_OUTPUT_MODES
from keras_tpu_embed.types import Tensor

SEQUENCE_LENGTH_SUFFIX = "_sequence_length"


def check_output_mode(
    output: Any, columns: Sequence[AnyEmbeddingColumn]
) -> str:
    """Validates a layer's `output` argument against its columns."""
    if output not in SUPPORTED_OUTPUT_MODES:
        raise ValueError(
            "Invalid value for argument `output`. Expected one of "
            f"{SUPPORTED_OUTPUT_MODES}. Received: output={output!r}"
        )
    sequence = [c.name for c in columns if c.is_sequence]
    if output == "concat" and sequence:
        raise ValueError(
            "`output='concat'` joins `[batch, dim]` activations and cannot "
            f"hold the sequence columns {sequence}; use `output='dict'`."
        )
    return str(output)


@dataclasses.dataclass
class LayerInputs:
    """Reads a layer's feature dict; warns once about extra keys."""

    owner: str  # "TPUEmbeddingLayer 'name'", for messages
    columns: Sequence[AnyEmbeddingColumn]

    @property
    def expected(self) -> list[str]:
        return input_keys(self.columns)

    def features(self, inputs: Any) -> dict[str, Tensor]:
        """`inputs` as a dict holding every key the columns read.

        Raises:
            TypeError: not a dict, and the layer reads several features.
            KeyError: a feature is missing (the message lists the keys).
        """
        expected = self.expected
        if not isinstance(inputs, dict):
            if len(expected) == 1:
                return {expected[0]: inputs}
            raise TypeError(
                f"{self.owner} reads the features {expected}: pass a dict "
                f"keyed by them. Received: {type(inputs).__name__}"
            )
        missing = [key for key in expected if key not in inputs]
        if missing:
            raise KeyError(
                f"Missing feature '{missing[0]}' in the input of "
                f"{self.owner}. Expected keys: {expected}. Received keys: "
                f"{sorted(inputs)}."
            )
        # Other keys are ignored by name, without a word: one preprocessor
        # output feeding several embedding layers is the documented usage.
        return inputs

    def keys_from_shape(self, input_shape: Any) -> frozenset[str] | None:
        """The feature keys the layer is called with, when build knows."""
        if isinstance(input_shape, dict):
            return frozenset(input_shape)
        expected = self.expected
        if input_shape is not None and len(expected) == 1:
            return frozenset(expected)
        return None


@dataclasses.dataclass(frozen=True)
class LayerOutputs:
    """Assembles a layer's output from its backends' activations."""

    columns: Sequence[AnyEmbeddingColumn]
    raw_features: dict[str, Any]  # the engine's own FeatureConfigs, by name
    concat: bool
    return_sequence_lengths: bool
    dtype: str

    def assemble(
        self, values: dict[str, Tensor], lengths: dict[str, Tensor]
    ) -> Any:
        outputs = {}
        for column in self.columns:
            outputs[column.name] = tf.cast(values[column.name], self.dtype)
            if column.name in lengths:
                name = column.name + SEQUENCE_LENGTH_SUFFIX
                outputs[name] = lengths[column.name]
        for name in self.raw_features:
            outputs[name] = tf.cast(values[name], self.dtype)
        if self.concat:
            return tf.concat(
                [outputs[name] for name in sorted(outputs)], axis=-1
            )
        return outputs

    def placeholder(self, features: dict[str, Tensor]) -> Any:
        """Zeros shaped like the output, for Keras' symbolic traces."""
        first = tf.nest.flatten(next(iter(features.values())))[0]
        batch = tf.shape(first)[0]

        def zeros(spec: tf.TensorSpec) -> Tensor:
            shape = [batch, *spec.shape[1:]]
            return tf.zeros(tf.stack(shape), spec.dtype)

        return tf.nest.map_structure(zeros, self.spec())

    def spec(self) -> Any:
        """The output's `keras.KerasTensor`s, for Keras' symbolic calls."""
        specs = {}
        for column in self.columns:
            shape: tuple[Any, ...] = (None, column.dimension)
            if column.is_sequence:
                shape = (None, column.max_sequence_length, column.dimension)
            specs[column.name] = keras.KerasTensor(shape, dtype=self.dtype)
            if column.is_sequence and self.return_sequence_lengths:
                specs[column.name + SEQUENCE_LENGTH_SUFFIX] = keras.KerasTensor(
                    (None,), dtype="int64"
                )
        for name, feature in self.raw_features.items():
            shape = (None, feature.table.dim)
            if feature.max_sequence_length:
                shape = (None, feature.max_sequence_length, feature.table.dim)
            specs[name] = keras.KerasTensor(shape, dtype=self.dtype)
        if self.concat:
            width = sum(c.dimension for c in self.columns)
            return keras.KerasTensor((None, width), dtype=self.dtype)
        return specs
