"""A model trained under `TPUStrategy` exports in one call.

`kte.export_saved_model` reads the engine's tables from the TPU into
serving tables a block of rows at a time, with no optimizer slot and no
CPU training model; the SavedModel serves with TensorFlow alone what the
trained model predicts.
"""

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

# Per served element: 0 for float32; the quantized schemes' stated bounds
# are relative to the rows, which stay within a few units here.
TOLERANCES = {"float32": 1e-6, "bfloat16": 0.05, "int8": 0.05}


def _served(path, model, strategy):
    """The export's answers and the model's, on the same examples."""
    features, _ = next(iter(models.dataset().batch(models.ROWS)))
    predicted = model.predict(models.batches(strategy), verbose=0)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    served = serve(**features)["head"].numpy()
    return served, predicted


@pytest.mark.parametrize(
    "feature, table_dtype",
    [
        ("V1", "float32"),
        ("V1", "int8"),
        ("V1", "bfloat16"),
        ("V2", "float32"),
        ("UNSUPPORTED", "float32"),
    ],
)
def test_a_model_trained_on_the_tpu_exports_in_one_call(
    tmp_path, feature, table_dtype
):
    path = str(tmp_path / "serving")
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.fit(models.batches(strategy), epochs=2, verbose=0)
        kte.export_saved_model(
            model, path, table_dtype=table_dtype, inputs="ids", verbose=False
        )
        served, predicted = _served(path, model, strategy)
    np.testing.assert_allclose(
        served, predicted, atol=TOLERANCES[table_dtype], rtol=0
    )
    saved = tf.train.list_variables(f"{path}/variables/variables")
    # Tables, no optimizer slots.
    assert not [name for name, _ in saved if "accumulator" in name], saved
