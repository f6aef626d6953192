"""The host-side clean-up of ids before a TPU step.

On a TPU with an embedding engine, negative ids are dealt with on the
host: the engine has no rule for them (the host lookups skip them), and
nothing can be computed between the dataset and TF's enqueue, which only
takes direct inputs of the step (`tpu_embedding_v2.py`,
`TPUEmbedding._raise_error_for_non_direct_inputs`). Sparse and ragged ids
lose their negative values (and the matching weights), as the host lookups
skip them; dense engine ids have no padding to drop to, so a negative one
is an error naming the feature. On a TPU without an engine, tensor-core
ids are made dense and static here. `distribute_dataset` maps both over
each per-replica batch.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import to_embedding_column
from keras_tpu_embed.columns.embedding import EmbeddingColumnLike
from keras_tpu_embed.lookup import engine_registry
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    tensor_core_widths,
)
from keras_tpu_embed.preprocessing.ids import PADDING_ID
from keras_tpu_embed.preprocessing.ids import densify
from keras_tpu_embed.tpu import hardware as tpu_hardware


def engine_id_filter(
    strategy: Any, preprocessor: Any
) -> Callable[[Any], Any] | None:
    """The host-side clean-up of negative ids, on engine hardware only."""
    if not tpu_hardware.embedding_hardware(strategy).has_engine:
        return None
    weight_of: dict[str, str | None] = {}
    for column in getattr(preprocessor, "categorical_columns", None) or []:
        weight_of[column.feature_key] = column.weight_feature_key or None
    engine = engine_registry.registered_engine(strategy)
    dense_engine_keys: set[str] = set()
    if engine is not None:
        weight_of.update(engine.input_features)
        dense_engine_keys = set(engine.input_features)
    known = engine is not None or bool(weight_of)

    def clean(features: Any) -> Any:
        if not isinstance(features, dict):
            return features
        return drop_negative_ids(
            features, weight_of, dense_engine_keys, pairing_known=known
        )

    return clean


def tensor_core_padding(
    strategy: Any,
    preprocessor: Any,
    columns: Sequence[EmbeddingColumnLike] | None,
    per_replica: int,
) -> Callable[[Any], Any] | None:
    """On a TPU without an engine: tensor-core ids dense and static."""
    hardware = tpu_hardware.embedding_hardware(strategy)
    if hardware is not tpu_hardware.EmbeddingHardware.NO_ENGINE:
        return None
    known = list(columns or []) + list(
        getattr(preprocessor, "columns", None) or []
    )
    widths = tensor_core_widths(known, engine_falls_back=True)
    weight_of: dict[str, str] = {}
    for column in known:
        try:
            column = to_embedding_column(column)
        except TypeError:
            continue
        if column.feature_key in widths and column.weight_feature_key:
            weight_of[column.feature_key] = column.weight_feature_key

    def padded(value: Any, width: int, pad: Any) -> Any:
        # The same densify the replica would run (`DenseTableLookup`), with
        # the batch size it cannot see made static.
        return tf.ensure_shape(densify(value, width, pad), [per_replica, width])

    def pad(features: Any) -> Any:
        if not isinstance(features, dict):
            return features
        if not widths:
            unknown = sorted(
                key
                for key, value in features.items()
                if isinstance(value, (tf.SparseTensor, tf.RaggedTensor))
            )
            if unknown:
                raise ValueError(
                    "This TPU has no embedding engine, so its lookups run "
                    "on the tensor core, which needs dense ids of static "
                    f"shape; the features {unknown} are sparse or ragged, "
                    "and distribute_dataset knows no columns to pad them "
                    "to. Pass preprocessor=kte.FeaturePreprocessor(columns) "
                    "or columns=[...] (the model's embedding columns)."
                )
            return features
        out = dict(features)
        for key, width in widths.items():
            if key in features:
                out[key] = padded(features[key], width, PADDING_ID)
            weights_key = weight_of.get(key)
            if weights_key and weights_key in features:
                out[weights_key] = padded(features[weights_key], width, 0.0)
        return out

    return pad


def drop_negative_ids(
    features: dict[str, Any],
    weight_of: dict[str, str | None],
    dense_keys: set[str],
    pairing_known: bool = True,
) -> dict[str, Any]:
    """Drops negative sparse/ragged ids; checks dense ones. Host side.

    Args:
        features: A batch of features keyed by input key.
        weight_of: Ids key -> the key of its weights (or None).
        dense_keys: Dense features that must not hold negative ids.
        pairing_known: Whether `weight_of` lists every weighted feature;
            when not, float sparse/ragged features that no ids key claims
            are an error, since their ids cannot be told.

    Returns:
        The features with negative ids (and their weights) removed.

    Raises:
        ValueError: unclaimed float sparse/ragged features, with
            `pairing_known=False`.
    """
    weight_keys = {w for w in weight_of.values() if w}
    if not pairing_known:
        orphans = sorted(
            key
            for key, value in features.items()
            if isinstance(value, (tf.SparseTensor, tf.RaggedTensor))
            and value.dtype.is_floating
            and key not in weight_keys
        )
        if orphans:
            raise ValueError(
                f"The features {orphans} look like weights, but "
                "distribute_dataset cannot tell their ids, so it cannot drop "
                "negative ids together with their weights before the TPU "
                "embedding engine. Pass preprocessor=kte.FeaturePreprocessor"
                "(columns), or build the model under strategy.scope() before "
                "calling distribute_dataset."
            )
    cleaned = dict(features)
    for key, value in features.items():
        if key in weight_keys or not value.dtype.is_integer:
            continue
        weights_key = weight_of.get(key) or ""
        weights = features.get(weights_key)
        if isinstance(value, tf.SparseTensor):
            keep = value.values >= 0
            cleaned[key] = tf.sparse.retain(value, keep)
            if weights is not None:
                cleaned[weights_key] = tf.sparse.retain(weights, keep)
        elif isinstance(value, tf.RaggedTensor):
            keep = value >= 0
            cleaned[key] = tf.ragged.boolean_mask(value, keep)
            if weights is not None:
                cleaned[weights_key] = tf.ragged.boolean_mask(weights, keep)
        elif key in dense_keys:
            check = tf.debugging.assert_non_negative(
                value,
                message=(
                    f"Feature '{key}' has negative ids, which the TPU "
                    "embedding engine cannot skip in dense ids (the host "
                    "lookups treat -1 as padding). Feed it as a "
                    "tf.SparseTensor or tf.RaggedTensor without the "
                    "padding, or give its vocabulary column num_oov_buckets "
                    "or default_value"
                ),
            )
            with tf.control_dependencies([check]):
                cleaned[key] = tf.identity(value)
    return cleaned
