"""The engine's rules that need no TPU (`engines/v1/v1_engine.py`).

The host path's weights under mixed precision, why SparseCore's engine is
made at the first step (TF's own function, on CPU), and what the engine
refuses or passes through at `register`. The engine path on a TPU (the
layers' build, their refusals and what reaches TF's enqueue) runs under
TF's own `TPUEmbedding` in `tests/emulated/engine_layers_test.py`,
`engine_protocol_test.py` and `sparsecore_refusals_test.py`.
"""

import keras
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.engines.v1.v1_engine import V1Engine
from keras_tpu_embed.placement import hardware as tpu_hardware
from tests.engine_models import N
from tests.engine_models import engine_columns
from tests.engine_models import examples


def test_mixed_precision_host_path_combines_float32_weights(mixed_bfloat16):
    columns, _ = engine_columns()
    layer = kte.TPUEmbeddingLayer(columns[1:])  # the weighted column
    features, _ = next(iter(examples().batch(N)))
    seen = []
    original = layer._inputs.features

    def record(inputs):
        seen.append(inputs["tag_w"].dtype)
        return original(inputs)

    layer._inputs.features = record
    layer({"tags": features["tags"], "tag_w": features["tag_w"]})
    assert seen == [tf.float32]


def test_why_sparse_core_is_made_at_the_first_step():
    """TF's TPUEmbeddingV2 constructor stacks tables by sample count, the
    product of each FeatureConfig.output_shape (tpu_embedding_v3.py,
    _stack_tables_with_same_table_dim_and_optimizer), which the configs of
    `to_tpu_feature_configs` leave unset: so SparseCoreEngine makes it at
    the first step, with the per-replica batch. Run on CPU with TF's own
    function."""
    from tensorflow.python.tpu import tpu_embedding_v3
    from tensorflow.python.util import nest

    columns, shared = engine_columns()
    features = kte.to_tpu_feature_configs(columns + shared)
    tables = list({id(f.table): f.table for f in features.values()}.values())
    with pytest.raises(ValueError, match="unknown rank"):
        tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer(
            tables,
            nest.flatten_with_joined_string_paths(features),
            8,  # replicas
            4,  # SparseCores per chip
            None,
        )


def _register(engine, columns, config=None, **kwargs):
    step = keras.Variable(0, dtype="int64", trainable=False)
    trigger = keras.Variable(0.0, trainable=True)
    return engine.register(
        "shared",
        columns,
        None,
        config=config or kte.EmbeddingConfig(),
        step=step,
        trigger=trigger,
        counts_step=True,
        **kwargs,
    )


def test_the_engine_refuses_to_return_sequence_lengths():
    _, shared = engine_columns()
    engine = V1Engine(tpu_hardware.EmbeddingHardware.V1)
    with pytest.raises(
        ValueError,
        match=r"^SharedTPUEmbedding 'shared': the TPU embedding engine "
        r"returns no sequence lengths, .* sequence columns "
        r"\['hist_shared_embedding'\] on it\. Feed the lengths",
    ):
        _register(
            engine,
            shared,
            return_sequence_lengths=True,
            layer_description="SharedTPUEmbedding 'shared'",
        )
    assert engine.layer_names == []  # refused before joining
    # Without sequence columns there are no lengths to refuse.
    _register(
        engine,
        shared[:1],
        return_sequence_lengths=True,
        layer_description="SharedTPUEmbedding 'shared'",
    )
    assert engine.layer_names == ["shared"]


def test_the_engine_serves_the_users_own_feature_configs():
    raw = tf.tpu.experimental.embedding.FeatureConfig(
        table=tf.tpu.experimental.embedding.TableConfig(
            vocabulary_size=10, dim=2, name="their_table"
        ),
        name="their_feature",
    )
    columns, _ = engine_columns()
    config = kte.EmbeddingConfig(feature_to_config_dict={"their_feature": raw})
    tables = _register(
        V1Engine(tpu_hardware.EmbeddingHardware.V1),
        columns,
        config,
        return_sequence_lengths=False,
        layer_description="TPUEmbeddingLayer 'shared'",
    )
    assert tables.raw_features == {"their_feature": raw}
