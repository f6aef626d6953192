"""The columns' id rules, applied on the host to what the engine enqueues.

The CPU lookup applies each column's rules to its ids before the lookup
(`placement/ids.py`, `prepare_for_lookup`): an identity column maps
ids outside its range to its `default_value`, any other out-of-range id
raises naming the feature, negative ids are pruned, weights <= 0 are
pruned for `mean` / `sqrtn` (`use_safe_embedding_lookup`), and sequence
positions past `max_sequence_length` are dropped. The TPU embedding engine
has none of these rules: it trained rows of ids it should have dropped
(an optimizer with slots moves a row even for a zero gradient), took
negative weights as they were, and failed on out-of-range ids with an
error of the chip.

So the engine's enqueue applies them on the host, where TensorFlow runs
it: the V1 mid-level object builds its enqueue op from the step's inputs
under outside compilation, on the host (`TPUEmbedding._generate_enqueue_
op`, `tpu_embedding_v2.py`), and each feature's ids and weights are
rewritten there, with the CPU's own functions, as a sparse
`[batch, positions]` tensor that keeps each id's example and position.
A check that fails raises on the host, naming the feature, at the step.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import Sequence

from keras_tpu_embed._compat import tf
from keras_tpu_embed._tf_private import wrap_v1_enqueue_op
from keras_tpu_embed.columns import AnyEmbeddingColumn
from keras_tpu_embed.placement.ids import identity_default
from keras_tpu_embed.placement.ids import prepare_for_lookup
from keras_tpu_embed.placement.ids import prunes_weights
from keras_tpu_embed.placement.ids import to_id_batch
from keras_tpu_embed.types import MidLevelEmbedding
from keras_tpu_embed.types import Tensor


@dataclasses.dataclass(frozen=True)
class HostIdRule:
    """One engine feature's id rules, as its column's CPU lookup applies
    them."""

    feature: str
    weight_feature: str | None
    table: str
    vocabulary_size: int
    identity_default: int | None
    prune_weights: bool
    max_sequence_length: int

    @classmethod
    def of(cls, column: AnyEmbeddingColumn) -> HostIdRule:
        return cls(
            feature=column.feature_key,
            weight_feature=column.weight_feature_key or None,
            table=column.table_name,
            vocabulary_size=int(column.vocabulary_size),
            identity_default=identity_default(column),
            prune_weights=prunes_weights(column),
            max_sequence_length=int(
                column.max_sequence_length if column.is_sequence else 0
            ),
        )

    def apply(
        self, ids: Tensor, weights: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """The ids (and weights) to enqueue: sparse `[batch, width]`, each
        kept id at its example and position."""
        batch = prepare_for_lookup(
            to_id_batch(self.feature, ids, weights, self.weight_feature),
            feature=self.feature,
            table=self.table,
            vocabulary_size=self.vocabulary_size,
            identity_default=self.identity_default,
            prune_weights=self.prune_weights,
            max_sequence_length=self.max_sequence_length,
        )
        indices = tf.stack([batch.rows, batch.positions], axis=1)
        width = tf.maximum(
            tf.reduce_max(
                tf.concat([batch.positions, tf.constant([-1], tf.int64)], 0)
            )
            + 1,
            1,
        )
        if self.max_sequence_length:
            width = tf.constant(self.max_sequence_length, tf.int64)
        shape = tf.stack([batch.batch_size, width])
        sparse_ids = tf.SparseTensor(indices, batch.ids, shape)
        if batch.weights is None:
            return sparse_ids, None
        return sparse_ids, tf.SparseTensor(indices, batch.weights, shape)


def host_id_rules(
    columns: Sequence[AnyEmbeddingColumn],
) -> dict[str, HostIdRule]:
    """Each column's rules, by the engine feature's name (the column's)."""
    return {column.name: HostIdRule.of(column) for column in columns}


def apply_on_host(
    mid_level: MidLevelEmbedding, rules: dict[str, HostIdRule]
) -> None:
    """Makes the V1 mid-level object apply `rules` to each feature it
    enqueues (features without a rule, the user's own
    `feature_to_config_dict` entries, pass as they are)."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def generate_enqueue_op(
            flat_inputs: list[Any],
            flat_weights: list[Any],
            flat_features: list[tuple[str, Any]],
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            inputs, weights = list(flat_inputs), list(flat_weights)
            for i, (path, _) in enumerate(flat_features):
                rule = rules.get(path)
                if rule is not None:
                    inputs[i], weights[i] = rule.apply(inputs[i], weights[i])
            return original(inputs, weights, flat_features, *args, **kwargs)

        return generate_enqueue_op

    wrap_v1_enqueue_op(mid_level, wrap)
