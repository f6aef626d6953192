"""Training under `MirroredStrategy`: N replicas make one device's update.

Two logical CPU devices stand in for two GPUs: they must be configured
before TensorFlow initializes, so the cases run in a fresh process, one for
all of them (a module fixture). They share this machine's cores, so these
tests prove the numbers, not a speed-up.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_tpu_embed.backends import replicas
from tests import testing

# Trains the same model on one device and under MirroredStrategy over two
# logical CPUs, on the same global batches; prints what the test compares.
SCRIPT = r"""
import json, sys
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)
import keras
import keras_tpu_embed as kte

# One strategy for every scenario: each MirroredStrategy numbers its
# collectives from the same keys, so a second one's all-gather would meet
# the first's in the runtime ("Shape mismatch in the collective instance").
MIRRORED = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def scenario(optimizer_name, path, form, loop):
    OPTIMIZERS = {
        "sgd": lambda: kte.optimizers.SGD(0.3, weight_decay_factor=0.01),
        "adagrad": lambda: kte.optimizers.Adagrad(0.4, clipvalue=0.5),
        "adam": lambda: kte.optimizers.Adam(0.1, beta_1=0.8, epsilon=1e-3),
        # Non-lazy: every row moves each step, a dense update of each copy.
        "adam_dense": lambda: kte.optimizers.Adam(0.05, lazy_adam=False),
        "ftrl": lambda: kte.optimizers.FTRL(
            0.5, l1_regularization_strength=0.01, l2_regularization_strength=0.1
        ),
    }
    device = "tpu_tensor_core" if path == "tensor_core" else None
    rng = np.random.default_rng(0)
    # "short": a last batch of 3, which Keras splits 2 + 1 over the replicas.
    N, BATCH, VOCAB = 35 if form == "short" else 32, 8, 12


    def padded(width, low=-1):
        return rng.integers(low, VOCAB, size=(N, width)).astype(np.int64)


    features = {
        "item": padded(2),
        "hist": padded(3),
        "tag": padded(2),
        "tag_w": rng.uniform(0.5, 2.0, size=(N, 2)).astype(np.float32),
    }
    labels = rng.normal(size=(N, 1)).astype(np.float32)


    def columns():
        item = kte.categorical_column_with_identity("item", VOCAB)
        hist = kte.sequence_categorical_column_with_identity("hist", VOCAB)
        shared = kte.shared_embedding_columns(
            [item, hist],
            4,
            combiner="sum",
            max_sequence_lengths=[0, 3],
            # The step each replica reads must be the global one.
            learning_rate_fn=lambda step: 0.2
            / (1.0 + tf.cast(step, tf.float32)),
            embedding_lookup_device=device,
            tensor_core_shape=[None, 2] if device else None,
        )
        tag = kte.weighted_categorical_column(
            kte.categorical_column_with_identity("tag", VOCAB), "tag_w"
        )
        tagged = kte.embedding_column(
            tag,
            3,
            combiner="mean",
            embedding_lookup_device=device,
            tensor_core_shape=[None, 2] if device else None,
        )
        return shared + [tagged]


    def model_and_layer():
        config = kte.EmbeddingConfig(
            optimizer=OPTIMIZERS[optimizer_name](),
            gradient_multiplier_fn=lambda step: 1.0 + 0.5 * tf.cast(
                step % 2, tf.float32
            ),
        )
        layer = kte.TPUEmbeddingLayer(columns(), config=config)
        inputs = {
            "item": keras.Input((2,), dtype="int64", name="item"),
            "hist": keras.Input((3,), dtype="int64", name="hist"),
            "tag": keras.Input((2,), dtype="int64", name="tag"),
            "tag_w": keras.Input((2,), dtype="float32", name="tag_w"),
        }
        out = layer(inputs)
        flat = keras.layers.Concatenate()(
            [keras.layers.Flatten()(out[key]) for key in sorted(out)]
        )
        model = keras.Model(inputs, keras.layers.Dense(1)(flat))
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model, layer


    def dataset():
        data = tf.data.Dataset.from_tensor_slices((features, labels))
        data = data.batch(BATCH)
        if form == "ragged":
            def to_ragged(x, y):
                x = dict(x)
                for key in ("item", "hist", "tag"):
                    x[key] = tf.RaggedTensor.from_tensor(x[key], padding=-1)
                x["tag_w"] = tf.RaggedTensor.from_tensor(
                    x["tag_w"], lengths=x["tag"].row_lengths()
                )
                return x, y
            data = data.map(to_ragged)
        if form == "sparse":
            # What the preprocessor makes of raw ids on the host path.
            preprocessor = kte.FeaturePreprocessor(columns())
            data = data.map(lambda x, y: (preprocessor(x), y))
        return data


    def custom_loop(strategy, model):
        # Keras' model.fit cannot take sparse or ragged inputs under
        # MirroredStrategy: a replica step of our own, as a user would write.
        @tf.function
        def step(x, y):
            def replica(x, y):
                with tf.GradientTape() as tape:
                    errors = tf.square(model(x, training=True) - y)[:, 0]
                    loss = tf.nn.compute_average_loss(
                        errors, global_batch_size=BATCH
                    )
                gradients = tape.gradient(loss, model.trainable_variables)
                model.optimizer.apply(gradients, model.trainable_variables)

            strategy.run(replica, args=(x, y))

        for _ in range(2):
            for x, y in strategy.experimental_distribute_dataset(dataset()):
                step(x, y)


    def tables_and_slots(strategy, layer):
        variables = {}
        for spec in layer.local_table_specs:
            variables[spec.name] = layer.table_variable(spec.name)
            for slot, var in layer.slot_variables(spec.name).items():
                variables[f"{spec.name}/{slot}"] = var
        return {
            name: [np.asarray(v) for v in
                   strategy.experimental_local_results(var.value)]
            for name, var in variables.items()
        }


    def train(strategy):
        keras.utils.set_random_seed(1)
        with strategy.scope():
            model, layer = model_and_layer()
        before = tables_and_slots(strategy, layer)
        initial = {k: v[0] for k, v in before.items()}
        if loop == "custom":
            custom_loop(strategy, model)
            predictions = np.zeros([1])
        elif loop == "distribute_dataset":
            model.fit(kte.distribute_dataset(strategy, dataset()), epochs=2,
                      verbose=0)
            predictions = model.predict(dataset(), verbose=0)
        else:
            model.fit(dataset(), epochs=2, verbose=0)
            model.evaluate(dataset(), verbose=0)
            predictions = model.predict(dataset(), verbose=0)
        copies = tables_and_slots(strategy, layer)
        state = {k: v[0] for k, v in copies.items()}
        # What training left untouched: every table and slot must move.
        unmoved = sorted(
            k for k in state if np.array_equal(state[k], initial[k])
        )
        step = [int(v) for v in strategy.experimental_local_results(
            layer.embedding_step.value)]
        return state, copies, step, np.asarray(predictions), model, unmoved


    one_state, _, one_step, one_pred, one_model, _ = train(
        tf.distribute.OneDeviceStrategy("/cpu:0")
    )
    mirrored = MIRRORED
    state, copies, step, pred, model, unmoved = train(mirrored)
    saved = {}
    if loop == "save":
        import tempfile

        # Each trained model's checkpoint, restored into a fresh model built
        # on one device, and its serving export, loaded with TensorFlow alone.
        serve_inputs = {k: tf.constant(v) for k, v in features.items()}
        for name, trained in (("one", one_model), ("mirrored", model)):
            directory = tempfile.mkdtemp()
            checkpoint = tf.train.Checkpoint(model=trained)
            prefix = checkpoint.write(directory + "/ckpt")
            fresh, fresh_layer = model_and_layer()
            tf.train.Checkpoint(model=fresh).read(prefix).expect_partial()
            tables = {
                spec.name: np.asarray(fresh_layer.table_variable(spec.name))
                for spec in fresh_layer.local_table_specs
            }
            exported = kte.export_saved_model(
                trained, directory + "/export", inputs="ids"
            )
            serve = tf.saved_model.load(exported).signatures["serving_default"]
            outputs = serve(**serve_inputs)
            saved[name] = (tables, np.asarray(list(outputs.values())[0]))
        saved = {
            "checkpoint_difference": max(
                float(np.max(np.abs(
                    saved["one"][0][k] - saved["mirrored"][0][k]
                )))
                for k in saved["one"][0]
            ),
            "checkpoint_matches_training": max(
                float(np.max(np.abs(saved["mirrored"][0][k] - state[k])))
                for k in saved["one"][0]
            ),
            "export_difference": float(
                np.max(np.abs(saved["one"][1] - saved["mirrored"][1]))
            ),
            "export_matches_predict": float(
                np.max(np.abs(saved["mirrored"][1] - pred))
            ),
        }
    return {
        "replicas": mirrored.num_replicas_in_sync,
        "max_difference": max(
            float(np.max(np.abs(state[k] - one_state[k]))) for k in one_state
        ),
        "copies_differ": [
            k for k, v in copies.items()
            if len(v) != 2 or not np.array_equal(v[0], v[1])
        ],
        "unmoved": unmoved,
        "steps": step,
        "one_device_steps": one_step,
        "prediction_difference": float(np.max(np.abs(pred - one_pred))),
        **saved,
    }


# Keras' own behaviour under MIRRORED, checked after the scenarios (each
# once had a process of its own; a failed step must not disturb a scenario).


class Ranker(keras.Model):
    def __init__(self):
        super().__init__()
        column = kte.embedding_column(
            kte.categorical_column_with_identity("i", 20), 3
        )
        self.embedding = kte.TPUEmbeddingLayer([column], output="concat")
        self.head = keras.layers.Dense(1)

    def call(self, features):  # no `training` argument
        return self.head(self.embedding(features))


def subclassed_fit():
    x = {"i": tf.constant([[1], [2], [3], [4]], tf.int64)}
    with MIRRORED.scope():
        model = Ranker()
        model(x)
        model.compile("sgd", "mse")
    before = model.embedding.table_variable("i").numpy().copy()
    data = tf.data.Dataset.from_tensors((x, np.ones((4, 1), "float32")))
    model.fit(data.repeat(3), epochs=1, verbose=0)
    table = model.embedding.table_variable("i")
    copies = [v.numpy() for v in table.value.values]
    assert np.array_equal(copies[0], copies[1])
    assert not np.allclose(before, copies[0])
    return {"step": int(model.embedding.embedding_step.numpy())}


# A plain Keras model, without this package: Keras' `model.fit` under
# MirroredStrategy averages the first batch across replicas to build the
# model (`keras/src/backend/tensorflow/trainer.py`, `_maybe_symbolic_build`),
# which fails on sparse and ragged inputs.
def plain_sparse_fit():
    with MIRRORED.scope():
        inputs = keras.Input((3,), sparse=True)
        model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
        model.compile("sgd", "mse")
    x = tf.sparse.from_dense(tf.eye(4, 3))
    data = tf.data.Dataset.from_tensor_slices((x, tf.ones([4, 1]))).batch(4)
    model.fit(data, verbose=0)
    return {"fit_ran": True}


def jit_plain_fit():
    with MIRRORED.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse", jit_compile=True)
    model.fit(np.ones((8, 3)), np.ones((8, 1)), batch_size=4, verbose=0)
    return {"fit_ran": True}


KERAS_CHECKS = {
    "subclassed_fit": subclassed_fit,
    "plain_sparse_fit": plain_sparse_fit,
    "jit_plain_fit": jit_plain_fit,
}

# Every scenario and check asked for, in this one process (the logical
# devices can be made once per process); one JSON line each.
# A scenario that raises reports its traceback; the others still run.
import traceback

for spec in json.loads(sys.argv[1]):
    keras.backend.clear_session()
    try:
        if spec[0] in KERAS_CHECKS:
            answer = {"result": KERAS_CHECKS[spec[0]]()}
        else:
            answer = {"result": scenario(*spec)}
    except Exception:
        answer = {"error": traceback.format_exc()}
    print(json.dumps({"scenario": spec, **answer}))
"""


OPTIMIZERS = ["sgd", "adagrad", "adam", "adam_dense", "ftrl"]
PATHS = ["host", "tensor_core"]
# A "save" scenario trains as "fit" does (fit, evaluate and predict, on one
# device and on the replicas, from the same seed), then checkpoints and
# exports: its result holds every number of the "fit" one, so Adam's "fit"
# cases read it instead of training the same model a second time.
SAME_TRAINING = {
    ("adam", p, "dense", "fit"): ("adam", p, "dense", "save") for p in PATHS
}
# (optimizer, path, form, loop): every scenario this process runs.
SCENARIOS = [
    *[
        (o, p, "dense", "fit")
        for o in OPTIMIZERS
        for p in PATHS
        if (o, p, "dense", "fit") not in SAME_TRAINING
    ],
    *[("adagrad", p, "short", "fit") for p in PATHS],
    *[("adagrad", "host", f, "custom") for f in ("sparse", "ragged")],
    ("ftrl", "tensor_core", "dense", "distribute_dataset"),
    *[("adam", p, "dense", "save") for p in PATHS],
]
# Keras' own behaviour under the same strategy, run after the scenarios: the
# subclassed model that must train, then the two fits that must fail (last:
# a failed step leaves the strategy's collectives as they are).
KERAS_CHECKS = [("subclassed_fit",), ("plain_sparse_fit",), ("jit_plain_fit",)]


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """Every scenario's result, from one process: the two logical devices
    are made once, before TensorFlow starts, and shared by all."""
    # A file, not `-c`: Keras reads the source of the script's lambdas.
    script = tmp_path_factory.mktemp("replicas") / "replicated.py"
    script.write_text(SCRIPT)
    completed = testing.run_python(
        str(script),
        json.dumps(SCENARIOS + KERAS_CHECKS),
        TF_CPP_MIN_LOG_LEVEL="3",
        timeout=1800,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = {}
    for line in completed.stdout.splitlines():
        if line.startswith('{"scenario"'):
            answer = json.loads(line)
            results[tuple(answer["scenario"])] = answer
    expected = sorted(SCENARIOS + KERAS_CHECKS)
    assert sorted(results) == expected, completed.stdout[-2000:]
    return results


def _failure(scenarios, check):
    """The traceback of a Keras check that must fail."""
    answer = scenarios[(check,)]
    assert "error" in answer, answer
    return answer["error"]


def _run(scenarios, optimizer, path, form, loop="fit"):
    key = (optimizer, path, form, loop)
    answer = scenarios[SAME_TRAINING.get(key, key)]
    assert "error" not in answer, answer.get("error")
    return answer["result"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_two_replicas_train_as_one_device_on_the_global_batch(
    scenarios, optimizer, path
):
    result = _run(scenarios, optimizer, path, "dense")
    assert result["replicas"] == 2
    # 4 global batches of 8 examples, 2 epochs: 8 steps on every copy.
    assert result["one_device_steps"] == [8]
    assert result["steps"] == [8, 8]
    assert result["copies_differ"] == []
    assert result["max_difference"] < 1e-5
    assert result["prediction_difference"] < 1e-5
    assert result["unmoved"] == []  # every table and slot trained


@pytest.mark.parametrize("path", ["host", "tensor_core"])
def test_replicas_with_unequal_shares_of_a_short_batch_stay_identical(
    scenarios, path
):
    # Keras weighs the short batch per replica, so it is not compared with
    # one device; the copies must still agree after every step.
    result = _run(scenarios, "adagrad", path, "short")
    assert result["steps"] == [10, 10]
    assert result["copies_differ"] == []


def test_fit_takes_a_batched_dataset_from_distribute_dataset(scenarios):
    result = _run(
        scenarios, "ftrl", "tensor_core", "dense", "distribute_dataset"
    )
    assert result["steps"] == [8, 8]
    assert result["copies_differ"] == []
    assert result["max_difference"] < 1e-5
    assert result["prediction_difference"] < 1e-5


def test_keras_jit_compile_fails_under_mirrored_cpu_devices(scenarios):
    """Why the tensor-core path trains without `jit_compile` above.

    When this fails because `fit` ran, XLA reaches every replica's
    variables: run the tensor-core cases with `jit_compile=True`.
    """
    assert "located in device" in _failure(scenarios, "jit_plain_fit")


@pytest.mark.parametrize("path", ["host", "tensor_core"])
def test_checkpoints_and_exports_after_two_replicas_match_one_device(
    scenarios, path
):
    result = _run(scenarios, "adam", path, "dense", loop="save")
    assert result["checkpoint_difference"] < 1e-5
    assert result["checkpoint_matches_training"] == 0
    assert result["export_difference"] < 1e-5
    assert result["export_matches_predict"] < 1e-5


@pytest.mark.parametrize("form", ["sparse", "ragged"])
def test_sparse_and_ragged_ids_train_in_a_replicated_custom_loop(
    scenarios, form
):
    result = _run(scenarios, "adagrad", "host", form, loop="custom")
    assert result["steps"] == [8, 8]
    assert result["copies_differ"] == []
    assert result["max_difference"] < 1e-5
    assert result["unmoved"] == []


def test_one_device_has_nothing_to_combine():
    assert replicas.replica_count() == 1
    assert replicas.row_gradient_gather() is None
    # The default strategy's replica function has one replica as well.
    strategy = tf.distribute.get_strategy()
    assert strategy.run(replicas.row_gradient_gather) is None


def test_keras_fit_takes_no_sparse_inputs_under_mirrored_strategy(scenarios):
    """Why sparse and ragged ids are trained in a custom loop above.

    A plain Keras model, without this package: Keras' `model.fit` under
    MirroredStrategy averages the first batch across replicas to build the
    model, which fails on sparse inputs. When this fails because `fit` ran,
    Keras has fixed it: train the sparse and ragged forms through
    `model.fit` instead.
    """
    assert "'SparseTensor' object has no attribute 'device'" in _failure(
        scenarios, "plain_sparse_fit"
    )


# One worker of a MultiWorkerMirroredStrategy cluster (TF_CONFIG), or, without
# TF_CONFIG, the same training in one process. Keras' own `model.fit` cannot
# run even a plain model under this strategy on this TensorFlow (see
# `test_keras_fit_fails_under_multi_worker_mirrored_strategy`), so the step is
# a custom loop through `strategy.run`.
WORKER = r"""
import json
import sys
import traceback
import numpy as np
import tensorflow as tf
import keras
import keras_tpu_embed as kte

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.default_rng(0)
N, BATCH, VOCAB = 32, 8, 12
features = {
    "item": rng.integers(-1, VOCAB, size=(N, 2)).astype(np.int64),
    "tag": rng.integers(-1, VOCAB, size=(N, 2)).astype(np.int64),
}
labels = rng.normal(size=(N, 1)).astype(np.float32)
keras.utils.set_random_seed(1)
with strategy.scope():
    item = kte.embedding_column(
        kte.categorical_column_with_identity("item", VOCAB), 4, combiner="sum"
    )
    tag = kte.embedding_column(
        kte.categorical_column_with_identity("tag", VOCAB),
        3,
        embedding_lookup_device="tpu_tensor_core",
        tensor_core_shape=[None, 2],
    )
    layer = kte.TPUEmbeddingLayer(
        [item, tag],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.4)),
        output="concat",
    )
    inputs = {k: keras.Input((2,), dtype="int64", name=k) for k in features}
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
batches = tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH)
data = kte.distribute_dataset(strategy, batches)


@tf.function
def step(x, y):
    def replica(x, y):
        with tf.GradientTape() as tape:
            errors = tf.square(model(x, training=True) - y)[:, 0]
            loss = tf.nn.compute_average_loss(errors, global_batch_size=BATCH)
        gradients = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply(gradients, model.trainable_variables)

    strategy.run(replica, args=(x, y))


for _ in range(2):
    for x, y in data:
        step(x, y)
state = {
    name: np.asarray(layer.table_variable(name).value).tolist()
    for name in ("item", "tag")
}
state["accumulators"] = np.asarray(
    layer.slot_variables("item")["accumulators"].value
).tolist()
print(json.dumps({
    "replicas": strategy.num_replicas_in_sync,
    "step": int(layer.embedding_step.numpy()),
    "state": state,
}))
sys.stdout.flush()

# In the cluster, after training: a plain Keras model's `model.fit` under the
# same strategy (upstream: keras-team/keras#20585). It must fail; its
# traceback goes to stderr as an uncaught one would, and the worker still
# exits 0 so that the training above is judged on its own.
if "--then-plain-fit" in sys.argv:
    try:
        with strategy.scope():
            plain_inputs = keras.Input((3,))
            plain = keras.Model(
                plain_inputs, keras.layers.Dense(1)(plain_inputs)
            )
            plain.compile("sgd", "mse")
        plain_data = tf.data.Dataset.from_tensor_slices(
            (tf.ones([8, 3]), tf.ones([8, 1]))
        ).batch(4)
        plain.fit(plain_data, verbose=0)
        print("FIT RAN")
    except Exception:
        traceback.print_exc()
"""


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _start_workers(script, *args, count=2):
    addresses = [f"127.0.0.1:{port}" for port in _free_ports(count)]
    workers = []
    for index in range(count):
        config = {
            "cluster": {"worker": addresses},
            "task": {"type": "worker", "index": index},
        }
        environment = dict(
            os.environ, TF_CONFIG=json.dumps(config), TF_CPP_MIN_LOG_LEVEL="3"
        )
        workers.append(
            subprocess.Popen(
                [sys.executable, str(script), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=environment,
            )
        )
    return workers


def _finish(workers, timeout=150):
    """Every worker's (returncode, stdout, stderr); killed past `timeout`."""
    results = []
    try:
        for worker in workers:
            out, err = worker.communicate(timeout=timeout)
            results.append((worker.returncode, out, err))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    return results


def _line_starting(prefix, text):
    return next(line for line in text.splitlines() if line.startswith(prefix))


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """The worker script alone (no TF_CONFIG: one replica), then in a
    cluster of two workers that also try a plain Keras `fit` after their
    training: each run's (returncode, stdout, stderr). One cluster serves
    both tests below: starting one costs two TensorFlow processes."""
    script = tmp_path_factory.mktemp("workers") / "worker.py"
    script.write_text(WORKER)
    # In sequence: three TensorFlow processes at once on a small machine
    # could each run into their timeout.
    single = testing.run_python(
        str(script), timeout=150, TF_CPP_MIN_LOG_LEVEL="3"
    )
    cluster = _finish(_start_workers(script, "--then-plain-fit"))
    return single, cluster


def test_two_workers_train_as_one_process(two_workers):
    single, results = two_workers
    for code, _, err in results:
        assert code == 0, err[-4000:]
    assert single.returncode == 0, single.stderr[-4000:]
    one = json.loads(single.stdout.strip().splitlines()[-1])
    # A worker's stdout: its training's line, then "FIT RAN" if Keras ran.
    first, second = (
        json.loads(_line_starting('{"replicas"', out)) for _, out, _ in results
    )
    assert one["replicas"] == 1 and first["replicas"] == 2
    # 4 global batches, 2 epochs: 8 steps everywhere.
    assert one["step"] == first["step"] == second["step"] == 8
    for name, want in one["state"].items():
        assert first["state"][name] == second["state"][name], name
        np.testing.assert_allclose(first["state"][name], want, atol=1e-5)
    # The tables did train: the accumulators left their initial 0.1.
    accumulators = np.array(one["state"]["accumulators"])
    assert np.max(np.abs(accumulators - 0.1)) > 0.01


def test_keras_fit_fails_under_multi_worker_mirrored_strategy(two_workers):
    """Why the two workers above train in a custom loop.

    When this fails because `fit` ran on both workers, Keras has fixed it:
    train the workers above with `model.fit` instead.
    """
    _, results = two_workers
    assert all("FIT RAN" not in out for _, out, _ in results)
    assert any(
        "unsupported type" in err and "PerReplica" in err
        for _, _, err in results
    )


def test_subclassed_model_trains_under_mirrored_strategy(scenarios):
    """Keras traces such a model on float32 placeholders under
    MirroredStrategy; that trace must not reach the id checks, and `fit`
    must train both copies of the table (checked in the script)."""
    answer = scenarios[("subclassed_fit",)]
    assert "error" not in answer, answer.get("error")
    assert answer["result"]["step"] == 3
