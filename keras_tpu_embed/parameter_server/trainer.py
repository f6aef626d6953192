"""Training a Keras model on parameter servers, through `ClusterCoordinator`.

Keras 3's `model.fit` cannot drive `ParameterServerStrategy`: it iterates a
distributed dataset on the coordinator, which the strategy refuses
(`tensorflow/python/distribute/input_lib.py`: "To use this dataset, you need
to pass this dataset to ClusterCoordinator.create_per_worker_dataset";
keras-team/keras#18624). This trainer is the loop `fit` would be: each
step is the model's own `train_step` (so a model that overrides it, its
compiled loss, metrics and optimizer all apply), run by
`ClusterCoordinator.schedule` on whichever worker is free, on batches from
that worker's own dataset; the epochs, steps and logs go through Keras'
`CallbackList` and progress bar. The embedding tables train inside the
step, on the servers (`shard_rows.py`); the dense weights by the model's
Keras optimizer, whose variables the strategy also puts on the servers.

Steps run asynchronously, as TF's parameter-server training intends:
workers read rows that other workers' steps may be updating. With
`sequential=True` each step waits for the one before it, so training
takes the updates in the order one device would (the mode in which the
tests compare with one device; slower).

A worker that fails mid-step is TF's to handle: `ClusterCoordinator` runs
its step again on another worker, so that step's updates may be applied
twice (`cluster_coordinator.py`: "a function may be executed more than
once"). A parameter server that fails ends training with an error naming
it (`server_failures.py`): restart the cluster and restore the last checkpoint.
"""

from __future__ import annotations

from typing import Any
from typing import Callable
from typing import Sequence

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.parameter_server.server_failures import reported_failures
from keras_tpu_embed.parameter_server.sharded_tables import (
    PARAMETER_SERVER_STRATEGY,
)

DatasetFn = Callable[..., Any]
"""A function of no arguments returning a `tf.data.Dataset` of batches, run
on each worker (TF's `ClusterCoordinator.create_per_worker_dataset`)."""


class ParameterServerTrainer:
    """`fit` and `evaluate` for a Keras model on parameter servers.

    The model (and so its embedding layers' tables) must be created, built
    and compiled inside `strategy.scope()` of a
    `tf.distribute.experimental.ParameterServerStrategy` made without a
    `variable_partitioner` (the layers shard their own tables over the
    servers). The optimizer is built there too, so that its variables live
    on the servers.

    Args:
        model: The compiled Keras model.
        sequential: Run one step at a time (every step sees all earlier
            updates, the order of one device); default: asynchronous.

    Example (docs/multi-device.md has a complete one that starts a cluster
    of local servers):

        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        with strategy.scope():
            model = make_model()  # uses kte.TPUEmbeddingLayer
            model.compile(optimizer="adam", loss="mse")
        trainer = kte.parameter_server.ParameterServerTrainer(model)
        history = trainer.fit(dataset_fn, epochs=2, steps_per_epoch=100)
    """

    def __init__(self, model: keras.Model, sequential: bool = False) -> None:
        strategy = model.distribute_strategy
        if not isinstance(strategy, PARAMETER_SERVER_STRATEGY):
            raise ValueError(
                "ParameterServerTrainer trains a model created under "
                "tf.distribute.experimental.ParameterServerStrategy; this "
                f"model was created under {type(strategy).__name__}. Build "
                "and compile it inside strategy.scope(), or train it with "
                "model.fit."
            )
        if model.optimizer is None:
            raise ValueError(
                "ParameterServerTrainer needs a compiled model: call "
                "model.compile(optimizer=..., loss=...) inside "
                "strategy.scope() first."
            )
        self.model = model
        self.strategy = strategy
        self.sequential = bool(sequential)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(
            strategy
        )
        with strategy.scope():
            # Its variables on the servers now, not in a step's trace.
            model.optimizer.build(model.trainable_variables)
        self._train_step = self._step_function(model.train_step)
        self._test_step = self._step_function(model.test_step)
        self._iterators: dict[int, Any] = {}

    def _step_function(self, step: Callable[[Any], Any]) -> Any:
        strategy = self.strategy

        def run(iterator: Any) -> Any:
            return strategy.run(step, args=(next(iterator),))

        # `schedule` takes a `tf.function` only.
        return tf.function(run)

    def _iterator(self, dataset_fn: DatasetFn) -> Any:
        """One per-worker iterator per dataset function, kept across
        epochs (each worker's dataset should repeat)."""
        key = id(dataset_fn)
        if key not in self._iterators:
            per_worker = self.coordinator.create_per_worker_dataset(dataset_fn)
            self._iterators[key] = (dataset_fn, iter(per_worker))
        return self._iterators[key][1]

    def fit(
        self,
        dataset_fn: DatasetFn,
        epochs: int = 1,
        steps_per_epoch: int | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        verbose: int | str = "auto",
        validation_fn: DatasetFn | None = None,
        validation_steps: int | None = None,
        initial_epoch: int = 0,
    ) -> keras.callbacks.History:
        """Trains for `epochs` epochs of `steps_per_epoch` steps.

        Args:
            dataset_fn: Makes each worker's dataset of `(x, y)` or
                `(x, y, sample_weight)` batches; it should repeat.
            epochs: The epoch to end at (as `model.fit`).
            steps_per_epoch: Steps per epoch (required: per-worker datasets
                have no end the coordinator can see).
            callbacks: Keras callbacks, called from the coordinator with
                the logs of each step and epoch (`History`, `EarlyStopping`,
                `CSVLogger`, `LambdaCallback`, `TerminateOnNaN`, ...); for
                checkpoints, `CheckpointCallback` (`ModelCheckpoint` and
                `BackupAndRestore` are refused: `check_callbacks`).
            verbose: `"auto"` or 1 for Keras' progress bar, 0 for none.
            validation_fn: A dataset function for validation at the end of
                each epoch (logs prefixed `val_`).
            validation_steps: Steps of each validation (required with
                `validation_fn`).
            initial_epoch: The epoch to start at.

        Returns:
            The `History` callback, as `model.fit` returns it.
        """
        check_callbacks(callbacks or ())
        steps = _required_steps(steps_per_epoch, "steps_per_epoch")
        if validation_fn is not None:
            _required_steps(validation_steps, "validation_steps")
        iterator = self._iterator(dataset_fn)
        callback_list = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            model=self.model,
            verbose=1 if verbose == "auto" else verbose,
            epochs=epochs,
            steps=steps,
        )
        with reported_failures(self.model):
            self.model.stop_training = False
            callback_list.on_train_begin()
            epoch_logs: dict[str, Any] = {}
            for epoch in range(initial_epoch, epochs):
                self.model.reset_metrics()
                callback_list.on_epoch_begin(epoch)
                self._run_steps(
                    self._train_step, iterator, steps, callback_list
                )
                epoch_logs = self._metric_results()
                if validation_fn is not None:
                    validation = self.evaluate(
                        validation_fn, steps=validation_steps
                    )
                    epoch_logs.update(
                        {f"val_{key}": v for key, v in validation.items()}
                    )
                callback_list.on_epoch_end(epoch, epoch_logs)
                if self.model.stop_training:
                    break
            callback_list.on_train_end(epoch_logs)
        history: keras.callbacks.History = self.model.history
        return history

    def evaluate(
        self, dataset_fn: DatasetFn, steps: int | None = None
    ) -> dict[str, float]:
        """The model's compiled loss and metrics over `steps` batches of
        each worker's `dataset_fn` dataset; tables and weights unchanged.

        Returns:
            `{"loss": ..., <metric>: ...}` as `model.evaluate(...,
            return_dict=True)` returns them.
        """
        count = _required_steps(steps, "steps")
        with reported_failures(self.model):
            iterator = self._iterator(dataset_fn)
            self.model.reset_metrics()
            self._run_steps(self._test_step, iterator, count, None)
            return self._metric_results()

    def _run_steps(
        self,
        function: Any,
        iterator: Any,
        steps: int,
        callback_list: keras.callbacks.CallbackList | None,
    ) -> None:
        """Schedules `steps` steps; reports each in order as it ends (in
        sequential mode, each before the next is scheduled)."""
        pending: list[tuple[int, Any]] = []
        for step in range(steps):
            if callback_list is not None:
                callback_list.on_train_batch_begin(step)
            remote = self.coordinator.schedule(function, args=(iterator,))
            pending.append((step, remote))
            if self.sequential:
                _report(pending, callback_list)
            if self.model.stop_training:
                break
        _report(pending, callback_list)
        self.coordinator.join()

    def _metric_results(self) -> dict[str, float]:
        return _floats(self.model.get_metrics_result())


def check_callbacks(callbacks: Sequence[keras.callbacks.Callback]) -> None:
    """Refuses the callbacks that would gather whole tables onto the
    coordinator: Keras' own checkpoints write Keras files, which read each
    variable whole (`epoch_checkpoints.py`).

    Raises:
        ValueError: naming the callback and what to use instead.
    """
    whole = (keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore)
    for callback in callbacks:
        if isinstance(callback, whole):
            raise ValueError(
                f"{type(callback).__name__} writes Keras files, which read "
                "every table whole onto the coordinator; on parameter "
                "servers use kte.parameter_server.CheckpointCallback(directory)"
                ", which writes a TensorFlow checkpoint one shard per server "
                "(restore it with tf.train.Checkpoint(model=model, "
                "optimizer=model.optimizer).restore(...))."
            )


def _report(
    pending: list[tuple[int, Any]],
    callback_list: keras.callbacks.CallbackList | None,
) -> None:
    """Waits for each pending step in order and hands its logs to the
    callbacks; empties `pending`."""
    for step, remote in pending:
        logs = _floats(remote.fetch())
        if callback_list is not None:
            callback_list.on_train_batch_end(step, logs)
    pending.clear()


def _floats(logs: Any) -> dict[str, Any]:
    return {
        key: float(value) if getattr(value, "shape", ()) == () else value
        for key, value in dict(logs).items()
    }


def _required_steps(steps: int | None, argument: str) -> int:
    if steps is None or int(steps) < 1:
        raise ValueError(
            f"{argument}={steps!r}: on parameter servers each worker reads "
            "its own repeating dataset, whose end the coordinator cannot "
            f"see; give {argument} as a positive number of steps."
        )
    return int(steps)
