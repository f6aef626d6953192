"""What SparseCore cannot honour is refused at build, by column.

On a SparseCore TPU (`emulated_tpu(embedding_feature="V2")`) the layers
build their own engine for TF's `TPUEmbeddingV2`, which they make at the
first step (`engines/sparsecore/sparsecore_engine.py`). Options
`TPUEmbeddingV2` cannot honour (clipping, a weighted column on the
engine) are refused when the layer is built, naming the columns and the way out
(`embedding_lookup_device='tpu_tensor_core'`), and that way out trains on
the same hardware. The emulated SparseCore counts the lookups and updates
it was given: none, for a refused layer or a tensor-core one.
"""

import keras
import numpy as np
import pytest

import keras_tpu_embed as kte
from keras_tpu_embed.engines.sparsecore.sparsecore_engine import (
    SparseCoreEngine,
)
from keras_tpu_embed.testing import emulated_tpu
from tests.engine_models import build_model
from tests.engine_models import single_table_model
from tests.engine_models import user_examples


def _untouched(chip):
    return (chip.lookups, chip.updates) == (0, 0)


def test_sparse_core_builds_its_own_engine_and_refuses_by_column():
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        with strategy.scope():
            model = build_model()
        engine = model.get_layer("embed").engine
        assert isinstance(engine, SparseCoreEngine)
        assert model.get_layer("shared").engine is engine
        # TPUEmbeddingV2 is made at the first step, when the batch is known.
        assert engine.mid_level is None
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        with strategy.scope():
            with pytest.raises(ValueError) as raised:
                build_model(kte.EmbeddingConfig(clipping_limit=1.0))
        assert _untouched(strategy.emulated_chip)
    message = str(raised.value)
    for needed in (
        "SparseCore",
        "TPUEmbeddingV2",
        "['tags_weighted_by_tag_w_embedding']",
        "['user_embedding']",
        "clipping_limit",
        "embedding_lookup_device='tpu_tensor_core'",
    ):
        assert needed in message


def test_a_layer_built_on_sparse_core_refuses_clipping_by_column():
    # Through the layer's build (the engine's `register`): the refusal
    # names the column.
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 10), 4
    )
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        with strategy.scope():
            layer = kte.TPUEmbeddingLayer(
                [column],
                config=kte.EmbeddingConfig(clipping_limit=1.0),
                name="embed",
            )
            with pytest.raises(ValueError) as raised:
                layer({"item": keras.Input([1], dtype="int64", batch_size=4)})
    assert "item_embedding" in str(raised.value)
    assert "clipping_limit" in str(raised.value)


def test_sparse_core_tensor_core_columns_still_train():
    # What the refusal recommends works on the same hardware.
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20),
        4,
        embedding_lookup_device="tpu_tensor_core",
        tensor_core_shape=[None, 1],
    )
    with emulated_tpu(2, embedding_feature="V2") as strategy:
        with strategy.scope():
            model = single_table_model(column, kte.EmbeddingConfig())
        layer = model.get_layer("embed")
        assert layer.engine is None
        before = layer.table_variable("user").numpy()
        model.fit(
            kte.distribute_dataset(strategy, user_examples(), 8),
            epochs=1,
            verbose=0,
        )
        assert np.abs(layer.table_variable("user").numpy() - before).max() > 0
        # Trained on the tensor core: the SparseCores saw no lookup.
        assert _untouched(strategy.emulated_chip)
