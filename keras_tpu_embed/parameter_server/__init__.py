"""Embedding tables on TensorFlow's parameter servers (no TPU needed).

Under `tf.distribute.experimental.ParameterServerStrategy` the layers shard
each table over the parameter servers (`sharded_tables.py`), read and
update its rows in id order where they live (`shard_rows.py`), and train
through `ParameterServerTrainer` (`trainer.py`), since Keras 3's
`model.fit` cannot drive this strategy; `CheckpointCallback`
(`epoch_checkpoints.py`) saves each epoch one shard at a time.
"""

from keras_tpu_embed.parameter_server.epoch_checkpoints import (
    CheckpointCallback,
)
from keras_tpu_embed.parameter_server.trainer import ParameterServerTrainer

__all__ = ["CheckpointCallback", "ParameterServerTrainer"]
