"""The backends a layer can put its tables in, for `layers.py` to build.

The layer decides per table where it lives for training (`lookup/devices.py`),
then asks here for the backends: `LocalTables` for the tables it holds
itself, and the TPU system's `SharedEngine` for the embedding-core ones.
It talks to them through the `TableBackend` protocol only.
"""

from __future__ import annotations

from keras_tpu_embed.lookup.embedding_core import EngineTables
from keras_tpu_embed.lookup.embedding_core import SharedEngine
from keras_tpu_embed.lookup.embedding_core import engine_for
from keras_tpu_embed.lookup.embedding_core import note_dataset_batch
from keras_tpu_embed.lookup.embedding_core import registered_engine
from keras_tpu_embed.lookup.local_tables import LocalTables

__all__ = [
    "EngineTables",
    "LocalTables",
    "SharedEngine",
    "engine_for",
    "note_dataset_batch",
    "registered_engine",
]
