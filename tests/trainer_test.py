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


@pytest.mark.parametrize(
    "callback",
    [
        keras.callbacks.ModelCheckpoint("/tmp/unused.keras"),
        keras.callbacks.BackupAndRestore("/tmp/unused"),
    ],
    ids=["ModelCheckpoint", "BackupAndRestore"],
)
def test_keras_file_checkpoints_are_refused_for_the_shard_by_shard_one(
    callback,
):
    from keras_tpu_embed.parameter_server.trainer import check_callbacks

    with pytest.raises(ValueError, match=type(callback).__name__) as error:
        check_callbacks([keras.callbacks.History(), callback])
    assert "kte.parameter_server.CheckpointCallback" in str(error.value)
