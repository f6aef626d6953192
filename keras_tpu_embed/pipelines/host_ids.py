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

Under `MirroredStrategy` with several replicas, Keras' `model.fit` cannot
take sparse or ragged inputs, so sparse and ragged ids (and weights) are
made dense here too, with the answer of the layer kept (`keras_dense_ids`).
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import to_embedding_column
from keras_tpu_embed.columns.embedding import ColumnLike
from keras_tpu_embed.columns.embedding import EmbeddingColumnLike
from keras_tpu_embed.engines import engine_registry
from keras_tpu_embed.placement import hardware as tpu_hardware
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.placement.ids import PADDING_ID
from keras_tpu_embed.placement.ids import densify
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    categorical_columns_of,
)
from keras_tpu_embed.preprocessing.feature_preprocessor import (
    tensor_core_widths,
)


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


# A negative id other than the -1 padding. A dense input drops its -1
# entries as padding, where a sparse or ragged input keeps every entry, its
# -1 ids (the preprocessor's out-of-vocabulary values without OOV buckets)
# included: the host lookup counts them in sequence lengths, maps them to an
# identity column's default, or prunes them. A dense input keeps -2, and the
# host lookup does with it all it does with a sparse -1.
KEPT_INVALID_ID = -2


def keras_dense_ids(
    strategy: Any,
    preprocessor: Any,
    columns: Sequence[EmbeddingColumnLike] | None,
) -> Callable[[Any], Any] | None:
    """Under `MirroredStrategy` with several replicas: sparse and ragged
    features dense, for Keras' `model.fit`.

    Keras reads the first batch of every replica before `fit`'s first step
    (`_maybe_symbolic_build` in keras/src/backend/tensorflow/trainer.py,
    which averages it over the replicas) and fails on a `tf.SparseTensor`.
    The function returned takes a batch of several steps' per-replica
    batches stacked (`[replicas, batch, n]`), so that the replicas of a
    step get one width. Ids are padded with -1 and weights with 0, which
    the layers read as "no id"; on the host lookup a -1 id the input holds
    becomes `KEPT_INVALID_ID`, so the layer's answer (sequence lengths
    included) is the sparse input's. Tensor-core columns densify sparse
    ids with -1 themselves, so theirs are padded the same way, as they are.

    `MultiWorkerMirroredStrategy` keeps its sparse ids: Keras' `fit` does
    not run there (docs/multi-device.md), and the custom loop that does
    takes them.

    Raises:
        ValueError: (when the function is traced) a sparse or ragged
            feature that no known column reads, one that a host column
            and a tensor-core column both read, or a sequence or
            `default_value` identity feature known only by its
            categorical column (its lookup decides how a -1 reads).
    """
    if (
        not isinstance(strategy, tf.distribute.MirroredStrategy)
        or strategy.num_replicas_in_sync < 2
    ):
        return None
    known = list(columns or []) + list(
        getattr(preprocessor, "columns", None) or []
    )
    return dense_ids_of(known)


def dense_ids_of(columns: Sequence[ColumnLike]) -> Callable[[Any], Any]:
    """Sparse and ragged features dense, each as the layers of `columns`
    read it: see `keras_dense_ids`."""
    host: set[str] = set()
    tensor_core: set[str] = set()
    weights: set[str] = set()
    # Keys known only from a categorical column, whose lookup is not known
    # here: the host one runs unless an embedding column says otherwise,
    # and reads a -1 as the tensor core does, but for sequence lengths and
    # identity columns' defaults.
    undecided: set[str] = set()
    categorical_host: set[str] = set()
    for column in columns:
        try:
            embedding = to_embedding_column(column)
        except TypeError:
            (categorical,) = categorical_columns_of([column])
            key = categorical.feature_key
            weight_key = categorical.weight_feature_key
            if (
                categorical.is_sequence
                or categorical.out_of_range_id is not None
            ):
                undecided.add(key)
            categorical_host.add(key)
        else:
            key, weight_key = (
                embedding.feature_key,
                embedding.weight_feature_key,
            )
            if embedding.lookup_device is LookupDevice.TPU_TENSOR_CORE:
                tensor_core.add(key)
            else:
                host.add(key)
        if weight_key:
            weights.add(weight_key)
    undecided -= host | tensor_core
    host |= categorical_host

    def dense(features: Any) -> Any:
        if not isinstance(features, dict):
            return features
        composite = sorted(
            key
            for key, value in features.items()
            if isinstance(value, (tf.SparseTensor, tf.RaggedTensor))
        )
        unknown = [
            k for k in composite if k not in host | tensor_core | weights
        ]
        if unknown:
            raise ValueError(
                "Keras' model.fit under MirroredStrategy cannot take sparse "
                "or ragged inputs, so distribute_dataset makes them dense, "
                f"but no column it knows reads the features {unknown}. Pass "
                "preprocessor=kte.FeaturePreprocessor(columns) or columns=[...]"
                " (the model's embedding columns); or, for a custom loop "
                "through strategy.run, distribute the dataset with "
                "strategy.distribute_datasets_from_function."
            )
        both = [k for k in composite if k in host and k in tensor_core]
        if both:
            raise ValueError(
                f"The features {both} are read by a host column and by a "
                "tpu_tensor_core column, which read a -1 in sparse ids "
                "differently, so distribute_dataset cannot make them dense "
                "for Keras' model.fit under MirroredStrategy with one answer "
                "for both. Give each column its own feature, or train in a "
                "custom loop through strategy.run, which takes sparse ids."
            )
        unsure = [k for k in composite if k in undecided]
        if unsure:
            raise ValueError(
                f"distribute_dataset knows only the categorical columns of "
                f"the features {unsure}, not whether the layers read them "
                "on the host or on the tensor core, which read a -1 in "
                "sparse ids differently (sequence lengths, identity "
                "columns' default_value), so it cannot make them dense for "
                "Keras' model.fit under MirroredStrategy. Pass the model's "
                "embedding columns: preprocessor=kte.FeaturePreprocessor("
                "embedding_columns) or columns=[...]."
            )
        out = dict(features)
        for key in composite:
            value = features[key]
            if key in weights:
                out[key] = _to_dense(value, tf.zeros([], value.dtype))
            elif key in host:
                out[key] = _to_dense(_keep_invalid_ids(value), PADDING_ID)
            else:
                out[key] = _to_dense(value, PADDING_ID)
        return out

    return dense


def _to_dense(value: Any, pad: Any) -> Any:
    if isinstance(value, tf.SparseTensor):
        return tf.sparse.to_dense(value, default_value=pad)
    return value.to_tensor(default_value=pad)


def _keep_invalid_ids(value: Any) -> Any:
    """A sparse or ragged id of -1 as `KEPT_INVALID_ID`."""

    def kept(ids: Any) -> Any:
        invalid = tf.constant(KEPT_INVALID_ID, ids.dtype)
        return tf.where(tf.equal(ids, PADDING_ID), invalid, ids)

    if isinstance(value, tf.SparseTensor):
        return value.with_values(kept(value.values))
    return value.with_flat_values(kept(value.flat_values))


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
