"""Keras 3 layers for TPU embeddings with feature-column semantics."""

from keras_tpu_embed import optimizers as optimizers
from keras_tpu_embed import parameter_server as parameter_server
from keras_tpu_embed.columns import bucketized_column as bucketized_column
from keras_tpu_embed.columns import (
    categorical_column_with_hash_bucket as categorical_column_with_hash_bucket,
)
from keras_tpu_embed.columns import (
    categorical_column_with_identity as categorical_column_with_identity,
)
from keras_tpu_embed.columns import (
    categorical_column_with_vocabulary_file as categorical_column_with_vocabulary_file,  # noqa: E501
)
from keras_tpu_embed.columns import (
    categorical_column_with_vocabulary_list as categorical_column_with_vocabulary_list,  # noqa: E501
)
from keras_tpu_embed.columns import crossed_column as crossed_column
from keras_tpu_embed.columns import embedding_column as embedding_column
from keras_tpu_embed.columns import numeric_column as numeric_column
from keras_tpu_embed.columns import (
    sequence_categorical_column_with_hash_bucket as sequence_categorical_column_with_hash_bucket,  # noqa: E501
)
from keras_tpu_embed.columns import (
    sequence_categorical_column_with_identity as sequence_categorical_column_with_identity,  # noqa: E501
)
from keras_tpu_embed.columns import (
    sequence_categorical_column_with_vocabulary_file as sequence_categorical_column_with_vocabulary_file,  # noqa: E501
)
from keras_tpu_embed.columns import (
    sequence_categorical_column_with_vocabulary_list as sequence_categorical_column_with_vocabulary_list,  # noqa: E501
)
from keras_tpu_embed.columns import (
    shared_embedding_columns as shared_embedding_columns,
)
from keras_tpu_embed.columns import (
    weighted_categorical_column as weighted_categorical_column,
)
from keras_tpu_embed.config import EmbeddingConfig as EmbeddingConfig
from keras_tpu_embed.engines.conversion import (
    to_tpu_feature_configs as to_tpu_feature_configs,
)
from keras_tpu_embed.layers import TPUEmbeddingLayer as TPUEmbeddingLayer
from keras_tpu_embed.pipelines.distribute import (
    distribute_dataset as distribute_dataset,
)
from keras_tpu_embed.pipelines.profiling import (
    profile_lookups as profile_lookups,
)
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    FeaturePreprocessor as FeaturePreprocessor,
)
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    make_parse_example_spec as make_parse_example_spec,
)
from keras_tpu_embed.saving.checkpoints import (
    engine_checkpoint as engine_checkpoint,
)
from keras_tpu_embed.saving.checkpoints import restore_tables as restore_tables
from keras_tpu_embed.saving.checkpoints import (
    validate_tables as validate_tables,
)
from keras_tpu_embed.saving.loading import load_model as load_model
from keras_tpu_embed.saving.loading import load_saved_model as load_saved_model
from keras_tpu_embed.saving.loading import load_weights as load_weights
from keras_tpu_embed.saving.warm_start import warm_start as warm_start
from keras_tpu_embed.serving.serving import (
    export_saved_model as export_saved_model,
)
from keras_tpu_embed.serving.serving import (
    quantization_error as quantization_error,
)
from keras_tpu_embed.shared_layer import (
    SharedTPUEmbedding as SharedTPUEmbedding,
)
from keras_tpu_embed.tables import quantization
from keras_tpu_embed.version import __version__ as __version__

__all__ = [
    "EmbeddingConfig",
    "FeaturePreprocessor",
    "SharedTPUEmbedding",
    "TPUEmbeddingLayer",
    "__version__",
    "bucketized_column",
    "categorical_column_with_hash_bucket",
    "categorical_column_with_identity",
    "categorical_column_with_vocabulary_file",
    "categorical_column_with_vocabulary_list",
    "crossed_column",
    "embedding_column",
    "distribute_dataset",
    "engine_checkpoint",
    "export_saved_model",
    "quantization_error",
    "load_model",
    "load_saved_model",
    "load_weights",
    "make_parse_example_spec",
    "numeric_column",
    "optimizers",
    "parameter_server",
    "profile_lookups",
    "quantization",
    "restore_tables",
    "sequence_categorical_column_with_hash_bucket",
    "sequence_categorical_column_with_identity",
    "sequence_categorical_column_with_vocabulary_file",
    "sequence_categorical_column_with_vocabulary_list",
    "shared_embedding_columns",
    "to_tpu_feature_configs",
    "validate_tables",
    "warm_start",
    "weighted_categorical_column",
]
