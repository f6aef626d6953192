"""A TensorFlow checkpoint at the end of each epoch, one shard at a time.

Keras' `ModelCheckpoint` and `BackupAndRestore` write Keras files, which
read each variable whole onto the process that saves
(`keras/src/saving/saving_lib.py`, `save_own_variables`): a table on
parameter servers would be gathered whole onto the coordinator. A
`tf.train.Checkpoint` writes each shard's slice on its own server
(`functional_saver.py`), under the keys a table on one device has, so
this callback's files restore on one device, on a TPU (`kte.restore_tables`,
`tf.train.Checkpoint`) and back onto the servers.
"""

from __future__ import annotations

from typing import Any

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf


class CheckpointCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Saves `tf.train.Checkpoint(model=model, optimizer=model.optimizer)`
    after every epoch through a `tf.train.CheckpointManager`.

    Args:
        directory: Where the checkpoints go (with parameter servers, a
            directory every server can write: each writes its shards).
        max_to_keep: How many recent checkpoints to keep.

    Restore with `tf.train.Checkpoint(model=model,
    optimizer=model.optimizer).restore(tf.train.latest_checkpoint(
    directory))`, on the servers or on one device.

    Example:

    >>> import tempfile
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> directory = tempfile.mkdtemp()
    >>> _ = model.fit(
    ...     tf.ones((4, 2)), tf.ones((4, 1)), epochs=2, verbose=0,
    ...     callbacks=[CheckpointCallback(directory)])
    >>> tf.train.latest_checkpoint(directory).endswith("ckpt-2")
    True
    """

    def __init__(self, directory: str, max_to_keep: int = 3) -> None:
        super().__init__()
        self.directory = str(directory)
        self.max_to_keep = int(max_to_keep)
        self._manager: Any = None

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._manager is None:
            checkpoint = tf.train.Checkpoint(
                model=self.model, optimizer=self.model.optimizer
            )
            self._manager = tf.train.CheckpointManager(
                checkpoint, self.directory, max_to_keep=self.max_to_keep
            )
        self._manager.save(checkpoint_number=epoch + 1)
