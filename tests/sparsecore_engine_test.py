"""SparseCore (`TPUEmbeddingV2`): what it cannot honour is refused by name.

These run the pure checks of `engines/sparsecore/sparsecore_engine.py` on the
`tf.tpu.experimental.embedding` configs the layers would hand to
`TPUEmbeddingV2` (`tpu_embedding_v3.py`), without a TPU or an emulation.
"""

import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.engines.sparsecore import sparsecore_engine


def _column(name="item", **kwargs):
    return kte.embedding_column(
        kte.categorical_column_with_identity(name, 10), 4, **kwargs
    )


def _check(columns, config):
    sparsecore_engine.refuse_what_sparse_core_cannot_honour(
        "embed", columns, config
    )


def _refusal(columns, config):
    with pytest.raises(ValueError) as raised:
        _check(columns, config)
    return str(raised.value)


def test_what_sparse_core_honours_passes():
    for optimizer in (
        kte.optimizers.SGD(0.1),
        kte.optimizers.Adagrad(0.1),
        kte.optimizers.AdagradMomentum(0.1, momentum=0.9),
        kte.optimizers.Adam(0.1),
        kte.optimizers.FTRL(0.1, l1_regularization_strength=0.01),
    ):
        _check(
            [_column(combiner=c, name=f"f_{c}") for c in ("sum", "mean")]
            + [_column(combiner="sqrtn", name="s")],
            kte.EmbeddingConfig(optimizer=optimizer),
        )
    # A learning-rate schedule: TPUEmbeddingV2 calls a callable rate in
    # every apply_gradients (`_wrap_param`).
    _check(
        [_column(learning_rate_fn=lambda step: 0.1 / (1.0 + step))],
        kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
    )


def test_clipping_limit_is_refused_by_column():
    message = _refusal(
        [_column(), _column("user")],
        kte.EmbeddingConfig(clipping_limit=1.0),
    )
    for needed in (
        "'embed'",
        "item_embedding",
        "user_embedding",
        "clipping_limit",
        "TPUEmbeddingV2",
        "tpu_tensor_core",
    ):
        assert needed in message


def test_optimizer_gradient_clip_is_refused():
    message = _refusal(
        [_column()],
        kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.1, clipvalue=2.0)),
    )
    assert "item_embedding" in message and "clipvalue" in message


def test_weight_clipping_is_refused():
    message = _refusal(
        [_column()],
        kte.EmbeddingConfig(
            optimizer=kte.optimizers.Adagrad(0.1, clip_weight_max=1.0)
        ),
    )
    assert "item_embedding" in message and "clip_weight_max" in message


def test_weight_decay_is_refused():
    # TF raises NotImplementedError in the constructor, naming the table
    # only; said here at build with the column and the fix.
    message = _refusal(
        [_column()],
        kte.EmbeddingConfig(
            optimizer=kte.optimizers.SGD(0.1, weight_decay_factor=0.01)
        ),
    )
    assert "item_embedding" in message and "weight_decay_factor" in message


def test_non_lazy_adam_is_refused():
    message = _refusal(
        [_column()],
        kte.EmbeddingConfig(
            optimizer=kte.optimizers.Adam(0.1, lazy_adam=False)
        ),
    )
    assert "item_embedding" in message and "lazy_adam" in message


def test_ftrl_allow_zero_accumulator_is_refused():
    message = _refusal(
        [_column()],
        kte.EmbeddingConfig(
            optimizer=kte.optimizers.FTRL(0.1, allow_zero_accumulator=True)
        ),
    )
    assert "item_embedding" in message and "allow_zero_accumulator" in message


def test_mod_partition_strategy_is_refused_for_sparse_core():
    message = _refusal(
        [_column()], kte.EmbeddingConfig(partition_strategy="mod")
    )
    assert "partition_strategy" in message and "SparseCore" in message
    assert "item_embedding" in message


def test_raw_feature_configs_v2_cannot_honour_are_refused():
    embedding = tf.tpu.experimental.embedding
    table = embedding.TableConfig(
        10,
        4,
        name="raw_table",
        optimizer=embedding.SGD(0.1, clip_weight_min=-1.0),
    )
    config = kte.EmbeddingConfig(
        feature_to_config_dict={"raw": embedding.FeatureConfig(table)}
    )
    message = _refusal([_column()], config)
    assert "'raw'" in message and "clip_weight_min" in message
    custom = embedding.TableConfig(
        10,
        4,
        name="custom_table",
        optimizer=embedding.CustomOptimizer(lambda *a: a[0], learning_rate=0.1),
    )
    message = _refusal(
        [_column()],
        kte.EmbeddingConfig(
            feature_to_config_dict={"raw": embedding.FeatureConfig(custom)}
        ),
    )
    assert "'raw'" in message and "CustomOptimizer" in message


def test_sequence_positions_become_samples_truncated_on_the_host():
    # Example 0 has 4 positions, example 1 has 1, example 2 none; a
    # max_sequence_length of 2 keeps positions 0 and 1.
    ids = tf.ragged.constant([[5, 6, 7, 8], [9], []], dtype=tf.int64)
    weights = tf.ragged.constant([[1.0, 2.0, 3.0, 4.0], [0.5], []])
    samples, sample_weights = sparsecore_engine._positions_as_samples(
        ids, weights, length=2, batch=3
    )
    assert samples.dense_shape.numpy().tolist() == [6, 1]
    # Sample b * 2 + p for position p of example b.
    assert samples.indices.numpy().tolist() == [[0, 0], [1, 0], [2, 0]]
    assert samples.values.numpy().tolist() == [5, 6, 9]
    assert sample_weights.indices.numpy().tolist() == [[0, 0], [1, 0], [2, 0]]
    assert sample_weights.values.numpy().tolist() == [1.0, 2.0, 0.5]
    sparse, none = sparsecore_engine._positions_as_samples(
        ids.to_sparse(), None, length=3, batch=3
    )
    assert none is None
    assert sparse.indices.numpy()[:, 0].tolist() == [0, 1, 2, 3]
    assert sparse.values.numpy().tolist() == [5, 6, 7, 9]
