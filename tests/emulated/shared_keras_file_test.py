"""A `.keras` file of shared columns with an explicit initializer loads
under a strategy, as it does outside one.

Issue 41, item 9: `keras.models.load_model` under the emulated V1
strategy refused it ("Columns ... share the table ... but disagree on
it"), the columns' signatures differing only in Keras' `shared_object_id`;
the demo model has a shared table, so the documented CPU -> TPU `.keras`
path failed for it.
"""

import keras
import numpy as np
import pytest

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu


def _model():
    shared = kte.shared_embedding_columns(
        [
            kte.categorical_column_with_identity("item", 20),
            kte.categorical_column_with_identity("seen", 20),
        ],
        4,
        initializer=keras.initializers.RandomNormal(seed=7),
    )
    inputs = {
        key: keras.Input((1,), dtype="int64", name=key, sparse=True)
        for key in ("item", "seen")
    }
    embedded = kte.SharedTPUEmbedding(shared, name="shared", output="concat")(
        inputs
    )
    return keras.Model(inputs, keras.layers.Dense(1)(embedded))


@pytest.mark.parametrize("feature", ["V1", "V2"])
def test_a_keras_file_of_shared_columns_loads_under_a_strategy(
    tmp_path, feature
):
    path = str(tmp_path / "shared.keras")
    model = _model()
    model.save(path)
    table = model.get_layer("shared").table_variable(
        "item_seen_shared_embedding"
    )
    outside = keras.models.load_model(path)
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        with strategy.scope():
            inside = keras.models.load_model(path)
        assert inside.get_layer("shared").engine is not None
    np.testing.assert_array_equal(
        outside.get_layer("shared")
        .table_variable("item_seen_shared_embedding")
        .numpy(),
        table.numpy(),
    )
