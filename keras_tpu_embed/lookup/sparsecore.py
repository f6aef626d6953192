"""SparseCore (`TPUEmbeddingV2`, embedding_feature V2): what it honours.

TensorFlow's SparseCore mid-level API (`tpu_embedding_v3.py`,
`TPUEmbeddingV2`) builds from the same `tf.tpu.experimental.embedding`
configs as the V1 engine but reads fewer of their fields. Its update ops
(`xla_sparse_dense_matmul_grad_with_{sgd,adagrad,adagrad_momentum,adam,
ftrl}_and_static_buffer_size`, called from `TPUEmbeddingV2.apply_gradients`)
take the learning rate (a callable is called every step) and each rule's
own hyperparameters, and nothing else: no gradient clipping
(`clipvalue`, and so no `EmbeddingConfig.clipping_limit`), no weight
clipping, no FTRL `allow_zero_accumulator`; the Adam op updates the rows of
the batch only (lazy Adam). Weight decay makes its constructor raise
`NotImplementedError`; any other optimizer class makes `apply_gradients`
raise "Unsupported optimizer". Its input op
(`convert_to_list_of_sparse_core_coo_tensors`) takes the combiner as a
string: `sum`, `mean` and `sqrtn` are TF's built-in three.

`refuse_what_sparse_core_cannot_honour` says each of these at build, by
column, with what to do instead: a table trained without a clip it was
given would answer differently from the same model on CPU.
"""

from __future__ import annotations

from typing import Any
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.config import EmbeddingConfig
from keras_tpu_embed.tpu_conversion import to_tpu_feature_configs

# `TPUEmbeddingV2.apply_gradients` has one update op for each of these.
_V2_OPTIMIZERS = ("SGD", "Adagrad", "AdagradMomentum", "Adam", "FTRL")
_V2_COMBINERS = ("sum", "mean", "sqrtn")

_WHAT_WORKS = (
    "give those columns embedding_lookup_device='tpu_tensor_core' and "
    "tensor_core_shape=[None, ids_per_example] (dense lookups on the "
    "TensorCore, which apply it), or train on a TPU whose embedding_feature "
    "is V1 (e.g. TPU v4)"
)


def _table_problems(table: Any, config: EmbeddingConfig) -> list[str]:
    """What `TPUEmbeddingV2` would ignore or refuse in one `TableConfig`."""
    optimizer = table.optimizer
    kind = type(optimizer).__name__
    embedding = tf.tpu.experimental.embedding
    known = kind in _V2_OPTIMIZERS and isinstance(
        optimizer, getattr(embedding, kind)
    )
    if optimizer is not None and not known:
        return [
            f"its optimizer {kind}, which TPUEmbeddingV2.apply_gradients "
            "has no update for ('Unsupported optimizer'); use one of "
            f"{list(_V2_OPTIMIZERS)}"
        ]
    problems = []
    if table.combiner not in _V2_COMBINERS:
        problems.append(
            f"combiner={table.combiner!r}; SparseCore combines with one of "
            f"{list(_V2_COMBINERS)}"
        )
    if optimizer is None:
        return problems
    clip = (optimizer.clip_gradient_min, optimizer.clip_gradient_max)
    if clip != (None, None):
        source = (
            f"EmbeddingConfig.clipping_limit={config.clipping_limit}"
            if config.clipping_limit is not None
            and clip[1] == float(config.clipping_limit)
            else f"the optimizer's clipvalue={clip}"
        )
        problems.append(
            f"gradient clipping ({source}); drop it (SparseCore's update "
            "ops take no clip bounds)"
        )
    for bound in ("clip_weight_min", "clip_weight_max"):
        value = getattr(optimizer, bound)
        if value is not None:
            problems.append(
                f"the optimizer's {bound}={value}; drop it (SparseCore's "
                "update ops do not clip weights)"
            )
    if (
        optimizer.weight_decay_factor is not None
        or optimizer.multiply_weight_decay_factor_by_learning_rate
    ):
        problems.append(
            "the optimizer's weight_decay_factor="
            f"{optimizer.weight_decay_factor} (with "
            "multiply_weight_decay_factor_by_learning_rate="
            f"{optimizer.multiply_weight_decay_factor_by_learning_rate}); "
            "TPUEmbeddingV2 raises NotImplementedError for weight decay"
        )
    if kind == "Adam" and not optimizer.lazy_adam:
        problems.append(
            "Adam with lazy_adam=False; SparseCore's Adam updates only the "
            "rows of the batch: use lazy_adam=True"
        )
    if kind == "FTRL" and optimizer.allow_zero_accumulator:
        problems.append(
            "FTRL with allow_zero_accumulator=True, which SparseCore's FTRL "
            "update has no field for: use allow_zero_accumulator=False"
        )
    return problems


def refuse_what_sparse_core_cannot_honour(
    layer_name: str,
    columns: Sequence[AnyEmbeddingColumn],
    config: EmbeddingConfig,
    step: Any = None,
) -> None:
    """Raises if `TPUEmbeddingV2` would not train the columns as asked.

    Args:
        layer_name: The layer's name, for the message.
        columns: The layer's columns on the SparseCore engine.
        config: The layer's `EmbeddingConfig` (its optimizer, clipping,
            partition strategy and raw `feature_to_config_dict`).
        step: The layer's embedding step, for `learning_rate_fn`s.

    Raises:
        ValueError: naming each column (or raw feature) and what SparseCore
            cannot honour for it, with the fix.

    Example:

    >>> item = categorical_column_with_identity("item", 10)
    >>> refuse_what_sparse_core_cannot_honour(
    ...     "embed", [embedding_column(item, 4)],
    ...     EmbeddingConfig(clipping_limit=1.0))
    Traceback (most recent call last):
    ...
    ValueError: Layer 'embed' cannot put these on the SparseCore ...
    """
    if config.partition_strategy != "div":
        names = sorted(c.name for c in columns)
        raise ValueError(
            f"Layer '{layer_name}' has partition_strategy="
            f"{config.partition_strategy!r} for the columns {names}, but "
            "SparseCore (TPUEmbeddingV2) places rows itself (row r of a "
            "table on SparseCore (r + rotation) mod the number of "
            "SparseCores, stacked with other tables), and keras_tpu_embed "
            "checkpoints each table whole, by table name. The partition "
            "strategy would change nothing: use partition_strategy='div' "
            "(the default)."
        )
    features = to_tpu_feature_configs(columns, config, step=step)
    by_table: dict[str, tuple[Any, list[str]]] = {}
    for name, feature in features.items():
        entry = by_table.setdefault(feature.table.name, (feature.table, []))
        entry[1].append(name)
    lines = []
    for table_name, (table, names) in sorted(by_table.items()):
        for problem in _table_problems(table, config):
            lines.append(
                f"- columns {sorted(names)} (table '{table_name}'): {problem}"
            )
    if lines:
        raise ValueError(
            f"Layer '{layer_name}' cannot put these on the SparseCore "
            "embedding engine of this TPU (embedding_feature V2, "
            "tf.tpu.experimental.embedding.TPUEmbeddingV2), which would "
            "train them differently from the same model on CPU:\n"
            + "\n".join(lines)
            + f"\nFix each as said, or {_WHAT_WORKS}."
        )
