"""Column specs: which raw feature becomes which ids, and which table.

`categorical_base.py` holds what every categorical kind gives,
`categorical.py` the categorical specs, `id_mapping.py` and
`derived_ids.py` how each kind maps raw values to ids, and
`categorical_factories.py` their `tf.feature_column`-style factories;
`embedding.py` the embedding specs and `embedding_factories.py` theirs;
`tf_categorical.py` and `tf_embedding.py` convert `tf.feature_column` /
`tf.compat.v1.tpu.experimental` columns; `derived.py` holds bucketized and
crossed columns; `vocabulary_files.py` reads vocabulary files and
`vocabulary_assets.py` carries them inside `.keras` archives. This module
only re-exports.
"""

from keras_tpu_embed.columns.categorical import HashedColumn
from keras_tpu_embed.columns.categorical import IdentityColumn
from keras_tpu_embed.columns.categorical import VocabularyFileColumn
from keras_tpu_embed.columns.categorical import VocabularyListColumn
from keras_tpu_embed.columns.categorical import WeightedColumn
from keras_tpu_embed.columns.categorical_base import CategoricalColumn
from keras_tpu_embed.columns.categorical_factories import (
    categorical_column_with_hash_bucket,
)
from keras_tpu_embed.columns.categorical_factories import (
    categorical_column_with_identity,
)
from keras_tpu_embed.columns.categorical_factories import (
    categorical_column_with_vocabulary_file,
)
from keras_tpu_embed.columns.categorical_factories import (
    categorical_column_with_vocabulary_list,
)
from keras_tpu_embed.columns.categorical_factories import input_keys
from keras_tpu_embed.columns.categorical_factories import (
    sequence_categorical_column_with_hash_bucket,
)
from keras_tpu_embed.columns.categorical_factories import (
    sequence_categorical_column_with_identity,
)
from keras_tpu_embed.columns.categorical_factories import (
    sequence_categorical_column_with_vocabulary_file,
)
from keras_tpu_embed.columns.categorical_factories import (
    sequence_categorical_column_with_vocabulary_list,
)
from keras_tpu_embed.columns.categorical_factories import (
    weighted_categorical_column,
)
from keras_tpu_embed.columns.derived import BucketizedColumn
from keras_tpu_embed.columns.derived import CrossedColumn
from keras_tpu_embed.columns.derived import NumericColumn
from keras_tpu_embed.columns.derived import bucketized_column
from keras_tpu_embed.columns.derived import crossed_column
from keras_tpu_embed.columns.derived import numeric_column
from keras_tpu_embed.columns.embedding import AnyEmbeddingColumn
from keras_tpu_embed.columns.embedding import EmbeddingColumn
from keras_tpu_embed.columns.embedding import SharedEmbeddingColumn
from keras_tpu_embed.columns.embedding_factories import embedding_column
from keras_tpu_embed.columns.embedding_factories import shared_embedding_columns
from keras_tpu_embed.columns.tf_categorical import to_categorical_column
from keras_tpu_embed.columns.tf_embedding import to_embedding_column
from keras_tpu_embed.columns.tf_embedding import to_embedding_columns
from keras_tpu_embed.columns.vocabulary_files import read_vocabulary_file
from keras_tpu_embed.columns.vocabulary_files import (
    vocabulary_files_from_archive,
)

__all__ = [
    "CategoricalColumn",
    "HashedColumn",
    "IdentityColumn",
    "VocabularyFileColumn",
    "VocabularyListColumn",
    "WeightedColumn",
    "categorical_column_with_hash_bucket",
    "categorical_column_with_identity",
    "categorical_column_with_vocabulary_file",
    "categorical_column_with_vocabulary_list",
    "input_keys",
    "sequence_categorical_column_with_hash_bucket",
    "sequence_categorical_column_with_identity",
    "sequence_categorical_column_with_vocabulary_file",
    "sequence_categorical_column_with_vocabulary_list",
    "weighted_categorical_column",
    "BucketizedColumn",
    "CrossedColumn",
    "NumericColumn",
    "bucketized_column",
    "crossed_column",
    "numeric_column",
    "AnyEmbeddingColumn",
    "EmbeddingColumn",
    "SharedEmbeddingColumn",
    "embedding_column",
    "shared_embedding_columns",
    "to_categorical_column",
    "to_embedding_column",
    "to_embedding_columns",
    "read_vocabulary_file",
    "vocabulary_files_from_archive",
]
