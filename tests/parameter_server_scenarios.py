"""The coordinator of `parameter_server_test.py`: trains, checkpoints and
exports on a cluster of local servers, and replays each training on one
device in the same process; prints one JSON line of what it found.

Run as `python -m tests.parameter_server_scenarios CLUSTER OUT [KILL]`:
CLUSTER is the cluster spec as JSON, OUT a directory for files, KILL the
process id of a worker (or `ps:` and a parameter server's) to kill after
the second step (the fault scenarios).
"""

import json
import os
import signal
import sys

import keras
import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte

VOCAB, DIM, BATCH = 11, 4, 4
STEPS, EPOCHS = 3, 2


def columns(kind="pooled"):
    seed = keras.initializers.RandomUniform(-1.0, 1.0, seed=3)
    if kind == "shared_tensor_core":
        # Two features sharing one table, and a table on the tensor-core
        # (dense) path.
        shared = kte.shared_embedding_columns(
            [
                kte.categorical_column_with_identity("item", VOCAB),
                kte.categorical_column_with_identity("tag", VOCAB),
            ],
            DIM,
            combiner="sum",
            initializer=seed,
        )
        history = kte.categorical_column_with_identity("history", VOCAB)
        return [
            *shared,
            kte.embedding_column(
                history,
                DIM,
                initializer=seed,
                embedding_lookup_device="tpu_tensor_core",
                tensor_core_shape=[None, 3],
            ),
        ]
    item = kte.categorical_column_with_identity("item", VOCAB)
    tag = kte.weighted_categorical_column(
        kte.categorical_column_with_identity("tag", VOCAB), "tag_weight"
    )
    history = kte.sequence_categorical_column_with_identity("history", VOCAB)
    return [
        kte.embedding_column(item, DIM, combiner="mean", initializer=seed),
        kte.embedding_column(tag, DIM, combiner="sum", initializer=seed),
        kte.embedding_column(
            history, DIM, initializer=seed, max_sequence_length=3
        ),
    ]


OPTIMIZERS = {
    "sgd": lambda: kte.optimizers.SGD(0.1),
    "adagrad": lambda: kte.optimizers.Adagrad(0.2),
    "adam": lambda: kte.optimizers.Adam(0.05),
    "adam_dense": lambda: kte.optimizers.Adam(0.05, lazy_adam=False),
    "shared_tensor_core": lambda: kte.optimizers.Adagrad(0.2),
}


class Ranker(keras.Model):
    """Three embedding columns (pooled, weighted, sequence) and a dense
    head; its train step also logs which batch it trained on, so that one
    device can replay the cluster's order."""

    def __init__(self, optimizer):
        super().__init__()
        config = kte.EmbeddingConfig(optimizer=OPTIMIZERS[optimizer]())
        kind = optimizer if optimizer == "shared_tensor_core" else "pooled"
        self.embedding = kte.TPUEmbeddingLayer(columns(kind), config=config)
        self.head = keras.layers.Dense(
            1, kernel_initializer=keras.initializers.GlorotUniform(seed=1)
        )

    def call(self, features):
        out = self.embedding({k: features[k] for k in FEATURES})
        # The sequence column's [batch, length, dim] summed over time.
        pooled = [
            tf.reduce_sum(v, axis=1) if v.shape.rank == 3 else v
            for _, v in sorted(out.items())
        ]
        return self.head(tf.concat(pooled, axis=1))

    def train_step(self, data):
        logs = super().train_step(data)
        logs["batch"] = data[0]["batch"][0]
        return logs


FEATURES = ("item", "tag", "tag_weight", "history")


def batches():
    rng = np.random.default_rng(0)
    out = []
    for index in range(STEPS):
        history = rng.integers(0, VOCAB, (BATCH, 3))
        history[1, 1:] = -1  # a shorter sequence
        out.append(
            (
                {
                    "item": rng.integers(-1, VOCAB, (BATCH, 2)),
                    "tag": rng.integers(0, VOCAB, (BATCH, 2)),
                    "tag_weight": rng.uniform(0.5, 2.0, (BATCH, 2)).astype(
                        "f4"
                    ),
                    "history": history,
                    "batch": np.full([BATCH], index),
                },
                rng.normal(size=(BATCH, 1)).astype("f4"),
            )
        )
    return out


BATCHES = batches()


def dataset_fn(context=None):
    stacked = tf.nest.map_structure(lambda *b: np.stack(b), *BATCHES)
    return tf.data.Dataset.from_tensor_slices(stacked).repeat()


def built(optimizer):
    model = Ranker(optimizer)
    model(dict(BATCHES[0][0]))
    model.compile(
        optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"]
    )
    return model


def state(model):
    """Every table, slot and dense weight, and the step, as arrays."""
    tables = model.embedding.embedding_tables
    found = {
        name: tf.convert_to_tensor(value).numpy()
        for name, value in tables.table_variables().items()
    }
    found.update(
        {f"head_{i}": w.numpy() for i, w in enumerate(model.head.weights)}
    )
    found["embedding_step"] = model.embedding.embedding_step.numpy()
    return found


def error_of(model, features):
    """The message of the error calling `model` raises, or None."""
    try:
        model(features)
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"
    return None


def tables_of(model):
    """The embedding tables and slots only."""
    found = state(model)
    return {k: v for k, v in found.items() if not k.startswith("head_")}


def largest_difference(a, b):
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


class Order(keras.callbacks.Callback):
    """The batches steps trained on, in order; optionally kills a worker."""

    def __init__(self, kill=None):
        super().__init__()
        self.order, self.kill = [], kill

    def on_train_batch_end(self, step, logs=None):
        self.order.append(int(logs["batch"]))
        if self.kill and len(self.order) == 2:
            os.kill(self.kill, signal.SIGKILL)
            self.kill = None


def replay(optimizer, initial_head, order):
    """The same training on one device, batch by batch in `order`."""
    model = built(optimizer)
    for weight, value in zip(model.head.weights, initial_head):
        weight.assign(value)
    for index in order:
        model.train_on_batch(*BATCHES[index])
    return model


def train(strategy, optimizer, report, out, kill=None):
    with strategy.scope():
        model = built(optimizer)
    initial_head = [w.numpy() for w in model.head.weights]
    tables = model.embedding.embedding_tables.table_variables()
    report["shard_devices"] = {
        name: [v.device for v in table.value.variables]
        for name, table in tables.items()
    }
    one = built(optimizer)
    report["initial_difference"] = largest_difference(state(model), state(one))
    trainer = kte.parameter_server.ParameterServerTrainer(
        model, sequential=True
    )
    order = Order(kill)
    saving = kte.parameter_server.CheckpointCallback(f"{out}/{optimizer}")
    history = trainer.fit(
        dataset_fn,
        epochs=EPOCHS,
        steps_per_epoch=STEPS,
        callbacks=[order, saving],
        validation_fn=dataset_fn,
        validation_steps=1,
    )
    report["history"] = sorted(history.history)
    report["order"] = order.order
    report["losses"] = history.history["loss"]
    reference = replay(optimizer, initial_head, order.order)
    report["difference"] = largest_difference(state(model), state(reference))
    report["moved"] = largest_difference(state(model), state(one))
    return model, trainer, reference


def scenarios(strategy, out):
    report = {}
    for optimizer in OPTIMIZERS:
        found = report[optimizer] = {}
        model, trainer, reference = train(strategy, optimizer, found, out)
        if optimizer != "adagrad":
            continue
        before = state(model)
        found["evaluate"] = trainer.evaluate(dataset_fn, steps=2)
        found["evaluate_changed"] = largest_difference(before, state(model))
        features = dict(BATCHES[1][0])
        features["item"] = np.array([[VOCAB - 1, 0]] * BATCH)
        found["predict_difference"] = float(
            np.abs(model(features).numpy() - reference(features).numpy()).max()
        )
        # An id past the table: the same refusal as on one device.
        bad = dict(features, item=np.array([[VOCAB, 0]] * BATCH))
        found["out_of_range"] = [error_of(m, bad) for m in (model, reference)]
        # Checkpoints both ways, by table name: the last epoch's.
        path = tf.train.latest_checkpoint(f"{out}/{optimizer}")
        found["keys"] = sorted(k for k, _ in tf.train.list_variables(path))
        restored = built(optimizer)
        restored.optimizer.build(restored.trainable_variables)
        tf.train.Checkpoint(
            model=restored, optimizer=restored.optimizer
        ).restore(path).assert_existing_objects_matched()
        found["restored_on_one_device"] = largest_difference(
            state(restored), state(model)
        )
        found["restored_iterations"] = int(restored.optimizer.iterations)
        path = tf.train.Checkpoint(model=reference).save(f"{out}/one/ckpt")
        with strategy.scope():
            onto = built(optimizer)
        tf.train.Checkpoint(model=onto).restore(path).expect_partial()
        found["restored_on_servers"] = largest_difference(
            state(onto), state(reference)
        )
        # The engine's names (`engine_checkpoint`, `restore_tables`).
        path = tf.train.Checkpoint(
            embedding=kte.engine_checkpoint(model)
        ).write(f"{out}/engine_ps/ckpt")
        restored = built(optimizer)
        kte.restore_tables(restored, path)
        found["restore_tables_on_one_device"] = largest_difference(
            tables_of(restored), tables_of(model)
        )
        path = tf.train.Checkpoint(
            embedding=kte.engine_checkpoint(reference)
        ).write(f"{out}/engine_one/ckpt")
        with strategy.scope():
            onto = built(optimizer)
        kte.restore_tables(onto, path)
        found["restore_tables_on_servers"] = largest_difference(
            tables_of(onto), tables_of(reference)
        )
        kte.export_saved_model(model, f"{out}/export")
        np.savez(
            f"{out}/predictions.npz",
            want=model(features).numpy(),
            **{k: v for k, v in features.items() if k in FEATURES},
        )
    return report


def partitioner_refusal(resolver):
    """What building a layer under a strategy with a partitioner says."""
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver,
        variable_partitioner=(
            tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
        ),
    )
    with strategy.scope():
        try:
            kte.TPUEmbeddingLayer(columns())
        except RuntimeError as error:
            return str(error)
    return "accepted"


def main():
    cluster = tf.train.ClusterSpec(json.loads(sys.argv[1]))
    out = sys.argv[2]
    kill = sys.argv[3] if len(sys.argv) > 3 else None
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    if kill and kill.startswith("ps:"):
        report = {}
        try:
            train(strategy, "adagrad", report, out, kill=int(kill[3:]))
            report["error"] = None
        except RuntimeError as error:
            report["error"] = str(error)
    elif kill:
        report = {}
        train(strategy, "adagrad", report, out, kill=int(kill))
    else:
        report = scenarios(strategy, out)
        report["partitioner_refusal"] = partitioner_refusal(resolver)
    print("\n" + json.dumps(report), flush=True)
    # The coordinator's threads keep polling the servers: leave at once.
    os._exit(0)


if __name__ == "__main__":
    main()
