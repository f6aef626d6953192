"""A parameter server that fails, reported by name with what it held.

`ClusterCoordinator` retries a step whose worker failed, but a lost
parameter server loses the variables it held: TF raises
`PSUnavailableError` (an `UnavailableError`, not exported) from the next
`schedule`, `join` or `fetch`, and its documented recovery is to restart
the cluster and the coordinator and restore a checkpoint
(`tensorflow/python/distribute/coordinator/cluster_coordinator.py`). The
error below says which server, which table shards lived there, and that.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed.parameter_server.sharded_tables import is_sharded
from keras_tpu_embed.parameter_server.sharded_tables import shards_of

_PS_TASK = re.compile(r"/job:ps/replica:\d+/task:(\d+)")


@contextlib.contextmanager
def reported_failures(model: keras.Model) -> Iterator[None]:
    """Re-raises an unreachable parameter server as a `RuntimeError`
    naming it and the table shards it held."""
    try:
        yield
    except tf.errors.UnavailableError as error:
        tasks = sorted({int(t) for t in _PS_TASK.findall(str(error))})
        if not tasks:
            raise
        raise RuntimeError(failure_message(model, tasks)) from error


def failure_message(model: keras.Model, tasks: list[int]) -> str:
    """What is lost and what to do, for the failed `ps` task numbers."""
    names = ", ".join(f"/job:ps/task:{t}" for t in tasks)
    held = shards_on(model, tasks)
    shards = "; ".join(held) if held else "no embedding table shards"
    return (
        f"Parameter server {names} is unreachable; it held {shards}. "
        "Training stopped: a parameter server's variables are lost with it "
        "(the steps already run are not). Restart the parameter servers "
        "and the coordinator, then restore the last checkpoint "
        "(tf.train.CheckpointManager over tf.train.Checkpoint(model=model, "
        "optimizer=model.optimizer)) and train again."
    )


def shards_on(model: keras.Model, tasks: list[int]) -> list[str]:
    """`"<table> rows a..b"` of every sharded table shard on `tasks`."""
    found = []
    for weight in model.weights:
        if not is_sharded(weight):
            continue
        start = 0
        for shard in shards_of(weight):
            size = int(shard.shape[0])
            match = _PS_TASK.search(str(shard.device))
            if match and int(match.group(1)) in tasks:
                found.append(f"{weight.path} rows {start}..{start + size - 1}")
            start += size
    return found
