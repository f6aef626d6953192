"""The embedding layers' constructor arguments as a Keras config, and back.

Columns and the `EmbeddingConfig` travel as registered Keras objects;
vocabulary files are looked up in the `.keras` archive being loaded
(`vocabulary_files_from_archive`), and the config carries the hint that
names `keras_tpu_embed.load_model` when Keras' own loader meets it without
the package imported.
"""

from __future__ import annotations

from typing import Sequence

from keras_tpu_embed._compat import keras
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.columns import vocabulary_files_from_archive
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.serialization import with_load_hint
from keras_tpu_embed.serialization import without_load_hint
from keras_tpu_embed.types import KerasConfig


def layer_config(
    base: KerasConfig,
    columns: Sequence[AnyEmbeddingColumn],
    config: EmbeddingConfig,
    serving_lookup_device: LookupDevice | None,
    output: str,
    return_sequence_lengths: bool,
) -> KerasConfig:
    """`base` (the Keras layer's own config) with the layer's arguments."""
    return with_load_hint(
        {
            **base,
            "columns": [
                keras.saving.serialize_keras_object(c) for c in columns
            ],
            "config": keras.saving.serialize_keras_object(config),
            "serving_lookup_device": (
                None
                if serving_lookup_device is None
                else serving_lookup_device.value
            ),
            "output": output,
            "return_sequence_lengths": return_sequence_lengths,
        }
    )


def layer_arguments(config: KerasConfig) -> KerasConfig:
    """The constructor's keyword arguments from a `layer_config` result.

    >>> import keras_tpu_embed as kte
    >>> column = kte.embedding_column(
    ...     kte.categorical_column_with_identity("item_id", 10), 4
    ... )
    >>> saved = layer_config(
    ...     {"name": "embed"}, [column], kte.EmbeddingConfig(), None,
    ...     "dict", False,
    ... )
    >>> [c.name for c in layer_arguments(saved)["columns"]]
    ['item_id_embedding']
    """
    config = without_load_hint(config)
    with vocabulary_files_from_archive():
        config["columns"] = [
            keras.saving.deserialize_keras_object(c) for c in config["columns"]
        ]
    config["config"] = keras.saving.deserialize_keras_object(config["config"])
    return config
