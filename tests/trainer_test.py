"""`ParameterServerTrainer`'s refusals; its training on a cluster of local
servers is `parameter_server_test.py`'s."""

import keras
import pytest

import keras_tpu_embed as kte


def test_a_model_built_outside_the_strategy_is_refused():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="ParameterServerStrategy") as error:
        kte.parameter_server.ParameterServerTrainer(model)
    assert "model.fit" in str(error.value)
