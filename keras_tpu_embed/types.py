"""Type aliases and option sets shared across the package."""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Literal
from typing import TypeAlias

Tensor: TypeAlias = Any
"""A `tf.Tensor`, `tf.RaggedTensor` or `tf.SparseTensor`."""

InitializerLike: TypeAlias = Callable[..., Any]
"""A Keras initializer or any callable `(shape, dtype) -> tensor`."""

LearningRateFn: TypeAlias = Callable[[Any], Any]
"""A function of the global embedding step returning a learning rate."""

Combiner: TypeAlias = Literal["mean", "sum", "sqrtn"]
SUPPORTED_COMBINERS: tuple[str, ...] = ("mean", "sum", "sqrtn")

LookupDeviceName: TypeAlias = Literal[
    "cpu", "tpu_tensor_core", "tpu_embedding_core"
]
OutputMode: TypeAlias = Literal["dict", "concat"]
SUPPORTED_OUTPUT_MODES: tuple[str, ...] = ("dict", "concat")

KerasConfig: TypeAlias = dict[str, Any]
"""A `get_config()` dictionary: serialized constructor arguments by name."""

TFFeatureColumn: TypeAlias = Any
"""A column built with `tf.feature_column.*` or TF's TPU embedding columns
(`tf.compat.v1.tpu.experimental.embedding_column`); TensorFlow ships no
type information, so this names what is expected."""

LookupTable: TypeAlias = Any
"""A `tf.lookup.StaticHashTable` or `tf.lookup.StaticVocabularyTable`."""

LookupInitializer: TypeAlias = Any
"""A `tf.lookup` table initializer: `tf.lookup.TextFileInitializer` or
`tf.lookup.KeyValueTensorInitializer`."""

MidLevelEmbedding: TypeAlias = Any
"""TF's TPU embedding mid-level object:
`tf.tpu.experimental.embedding.TPUEmbedding` (or `TPUEmbeddingV2` on
SparseCore); TensorFlow ships no type information."""

ShardedTableValue: TypeAlias = Any
"""A table on parameter servers: TF's `ShardedVariable` (exported only as
`tf.__internal__.distribute.ShardedVariable`, without type information), or
the Keras variable holding one (`parameter_server.sharded_tables`)."""
