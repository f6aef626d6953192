"""`distribute_dataset`: host-side ids, global batch sizes, static shapes."""

import json
import types

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte


def _examples(n=10):
    ids = tf.ragged.constant([[i] * (1 + i % 3) for i in range(n)], tf.int64)
    return tf.data.Dataset.from_tensor_slices(
        ({"item": ids.to_sparse()}, tf.zeros(n))
    )


def test_batches_are_global_static_and_stay_on_the_host():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    batches = kte.distribute_dataset(strategy, _examples(), 4)
    assert batches._options.experimental_fetch_to_device is False
    sizes = [int(x["item"].dense_shape[0]) for x, _ in batches]
    assert sizes == [4, 4]  # the last 2 examples are dropped
    spec = batches.element_spec[0]["item"]
    assert spec.shape[0] == 4  # static per-replica batch


def test_a_function_reads_its_own_host_share():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    contexts = []

    def host_dataset(context):
        contexts.append(context)
        return _examples(6)

    batches = kte.distribute_dataset(strategy, host_dataset, 3)
    assert [int(y.shape[0]) for _, y in batches] == [3, 3]
    assert contexts[0].num_input_pipelines == 1


def test_distributed_datasets_that_fetch_to_device_are_refused():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    on_device = strategy.experimental_distribute_dataset(_examples().batch(2))
    with pytest.raises(ValueError, match="experimental_fetch_to_device=False"):
        kte.distribute_dataset(strategy, on_device)
    on_host = strategy.experimental_distribute_dataset(
        _examples().batch(2),
        options=tf.distribute.InputOptions(experimental_fetch_to_device=False),
    )
    assert kte.distribute_dataset(strategy, on_host) is on_host


def test_a_batched_dataset_keeps_its_global_batches():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    numbers = tf.data.Dataset.range(10).map(lambda i: ({"item": i}, -i))
    batches = kte.distribute_dataset(strategy, numbers.batch(4))
    # The short last batch [8, 9] is dropped; the others stay whole.
    got = [(x["item"].numpy().tolist(), y.numpy().tolist()) for x, y in batches]
    assert got == [
        ([0, 1, 2, 3], [0, -1, -2, -3]),
        ([4, 5, 6, 7], [-4, -5, -6, -7]),
    ]
    ragged = kte.distribute_dataset(strategy, _examples().batch(3))
    sizes = [int(x["item"].dense_shape[0]) for x, _ in ragged]
    assert sizes == [3, 3, 3]


def test_bad_batch_sizes_and_inputs():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with pytest.raises(ValueError, match="scalar components"):
        kte.distribute_dataset(strategy, _examples())
    with pytest.raises(ValueError, match="`global_batch_size` is required"):
        kte.distribute_dataset(strategy, lambda context: _examples())
    with pytest.raises(ValueError, match="positive int"):
        kte.distribute_dataset(strategy, _examples(), 0)
    three_replicas = types.SimpleNamespace(num_replicas_in_sync=3)
    with pytest.raises(ValueError, match="multiple of 3"):
        kte.distribute_dataset(three_replicas, _examples(), 8)
    with pytest.raises(TypeError, match="tf.data.Dataset or a function"):
        kte.distribute_dataset(strategy, [1, 2, 3], 2)


def test_preprocessor_runs_on_each_host_batch():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    column = kte.categorical_column_with_vocabulary_list("c", ["a", "b"])
    raw = tf.data.Dataset.from_tensor_slices(
        ({"c": tf.constant([["a"], ["b"], ["z"], ["a"]])}, tf.zeros(4))
    )
    batches = kte.distribute_dataset(
        strategy, raw, 2, preprocessor=kte.FeaturePreprocessor([column])
    )
    ids = [x["c"].values.numpy().tolist() for x, _ in batches]
    assert ids == [[0, 1], [-1, 0]]


# Pod slices (issue 23, finding 7): `predict` on several hosts. Keras puts
# the per-replica outputs of a multi-host TPUStrategy back in order with
# `_tpu_multi_host_concat` (keras/src/backend/tensorflow/trainer.py), which
# assumes replica r of host h got slice r * hosts + h of the global batch.


def _per_host_datasets(dataset, global_batch_size, hosts, replicas):
    """What `distribute_dataset` gives each host of a pod.

    The stand-in strategy hands back the per-host dataset function that
    `distribute_datasets_from_function` would call on each host.
    """
    captured = []
    pod = types.SimpleNamespace(
        num_replicas_in_sync=hosts * replicas,
        distribute_datasets_from_function=lambda fn, options: captured.append(
            fn
        ),
    )
    kte.distribute_dataset(pod, dataset, global_batch_size)
    (dataset_fn,) = captured
    return [
        list(
            dataset_fn(
                tf.distribute.InputContext(
                    num_input_pipelines=hosts,
                    input_pipeline_id=host,
                    num_replicas_in_sync=hosts * replicas,
                )
            )
        )
        for host in range(hosts)
    ]


def _keras_predict_order(per_host, replicas):
    """Each step's outputs as Keras' `predict` concatenates them.

    A host's per-replica batches go to its replicas in turn (TF's
    MultiDeviceIterator); TPUStrategy lists local results host by host.
    """
    from keras.src.backend.tensorflow.trainer import _tpu_multi_host_concat

    steps = {len(batches) // replicas for batches in per_host}
    assert len(steps) == 1, [len(b) for b in per_host]  # hosts agree
    pod = types.SimpleNamespace(
        experimental_local_results=lambda values: values,
        extended=types.SimpleNamespace(num_replicas_per_host=replicas),
    )
    return [
        _tpu_multi_host_concat(
            [
                batches[step * replicas + replica]
                for batches in per_host
                for replica in range(replicas)
            ],
            pod,
        )
        for step in range(steps.pop())
    ]


def _numbers(n):
    return tf.data.Dataset.range(n).map(
        lambda i: ({"dense": i, "sparse": tf.sparse.from_dense([i + 100])}, -i)
    )


@pytest.mark.parametrize("hosts, replicas", [(2, 1), (2, 2), (3, 2)])
@pytest.mark.parametrize("kind", ["examples", "unknown_length", "batched"])
def test_predict_on_a_pod_keeps_input_order(kind, hosts, replicas):
    """Keras' reorder gives back each global batch in input order (before,
    the rows came back permuted); a short last global batch is dropped on
    every host alike."""
    global_batch = 2 * hosts * replicas
    n = 3 * global_batch + hosts * replicas + 1  # 3 full global batches
    dataset = _numbers(n)
    if kind == "unknown_length":
        dataset = dataset.filter(lambda x, y: True)
    if kind == "batched":
        dataset = dataset.batch(global_batch)
    per_host = _per_host_datasets(
        dataset, None if kind == "batched" else global_batch, hosts, replicas
    )
    labels = _keras_predict_order(
        [[y for _, y in batches] for batches in per_host], replicas
    )
    expected = -np.arange(3 * global_batch).reshape(3, global_batch)
    np.testing.assert_array_equal(np.stack(labels), expected)
    dense = _keras_predict_order(
        [[x["dense"] for x, _ in batches] for batches in per_host], replicas
    )
    np.testing.assert_array_equal(np.stack(dense), -expected)
    sparse = _keras_predict_order(
        [[x["sparse"].values for x, _ in batches] for batches in per_host],
        replicas,
    )
    np.testing.assert_array_equal(np.stack(sparse), 100 - expected)


# A TPU without an embedding engine (issue 23, finding 6). The layers'
# tables fall back to the tensor-core (dense XLA) lookup there; its ids must
# leave the host dense, padded to the column's width, with static shapes.
# The hardware is simulated on a MirroredStrategy over 2 logical CPUs by
# patching `tpu_hardware.embedding_hardware`; the lead will move this onto
# `keras_tpu_embed.testing.emulated_tpu(embedding_feature="UNSUPPORTED")`.
NO_ENGINE_SCRIPT = r"""
import json
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)
import keras_tpu_embed as kte
from keras_tpu_embed.placement import hardware as tpu_hardware
mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
# XLA cannot reach the variables of a MirroredStrategy's second CPU replica
# (replicas_test.py, test_keras_jit_compile_fails_under_mirrored_cpu_devices),
# so the compiled replica function runs on one device.
one = tf.distribute.OneDeviceStrategy("/cpu:0")
real_hardware = tpu_hardware.embedding_hardware


def no_engine(s):
    if s is mirrored or s is one:
        return tpu_hardware.EmbeddingHardware.NO_ENGINE
    return real_hardware(s)


tpu_hardware.embedding_hardware = no_engine
item = kte.categorical_column_with_identity("item", 10)
tag = kte.weighted_categorical_column(
    kte.categorical_column_with_vocabulary_list(
        "tag", ["a", "b", "c"], num_oov_buckets=1
    ),
    "tag_w",
)
hist = kte.sequence_categorical_column_with_identity("hist", 10)
columns = [
    kte.embedding_column(item, 4, tensor_core_shape=[None, 3]),
    kte.embedding_column(tag, 4, combiner="sum", tensor_core_shape=[None, 2]),
    kte.embedding_column(hist, 4, max_sequence_length=3),
]
rng = np.random.default_rng(0)
N = 16


def ragged(make):
    return tf.ragged.constant([make(1 + i % 3) for i in range(N)])


raw = tf.data.Dataset.from_tensor_slices(
    (
        {
            "item": ragged(lambda n: rng.integers(0, 10, n).tolist())
            .to_sparse(),
            "tag": ragged(lambda n: list(rng.choice(list("abcz"), min(n, 2))))
            .to_sparse(),
            "tag_w": ragged(
                lambda n: rng.uniform(0.5, 2, min(n, 2)).tolist()
            ).to_sparse(),
            "hist": ragged(lambda n: rng.integers(0, 10, n).tolist())
            .to_sparse(),
        },
        tf.zeros(N),
    )
)
pre = kte.FeaturePreprocessor(columns)


def check(strategy, jit):
    with strategy.scope():
        layer = kte.TPUEmbeddingLayer(columns)
        layer.build()
    padded = kte.distribute_dataset(strategy, raw, 4, preprocessor=pre)
    specs = [
        spec
        for per_replica in tf.nest.flatten(padded.element_spec)
        # A PerReplicaSpec holds one spec per replica.
        for spec in getattr(per_replica, "_value_specs", [per_replica])
    ]
    not_static = [
        str(s) for s in specs
        if not isinstance(s, tf.TensorSpec) or not s.shape.is_fully_defined()
    ]
    # What the replica received before: the preprocessor's ids, as on
    # hardware with neither engine nor tensor-core padding (made dense for
    # Keras' fit under MirroredStrategy, with the sparse ids' answers).
    tpu_hardware.embedding_hardware = real_hardware
    today = kte.distribute_dataset(strategy, raw, 4, preprocessor=pre)
    tpu_hardware.embedding_hardware = no_engine
    graphs = []

    def lookup(features):
        graphs.append(tf.compat.v1.get_default_graph())
        return layer(features)

    replica_fn = tf.function(lookup, jit_compile=jit)

    @tf.function
    def new_step(features):
        return strategy.run(replica_fn, args=(features,))

    @tf.function
    def old_step(features):
        return strategy.run(layer, args=(features,))

    difference, error, steps = 0.0, None, 0
    for (new, _), (old, _) in zip(padded, today):
        try:
            got = new_step(new)
        except Exception as e:  # reported, so that the test shows it
            error = f"{type(e).__name__}: {str(e)[-400:]}"
            break
        want = old_step(old)
        for key in want:
            for a, b in zip(
                strategy.experimental_local_results(got[key]),
                strategy.experimental_local_results(want[key]),
            ):
                difference = max(difference, float(np.max(np.abs(a - b))))
        steps += 1
    sparse_ops = sorted(
        {op.type for g in graphs for op in g.get_operations()
         if "Sparse" in op.type}
    )
    return {
        "not_static": not_static,
        "sparse_ops": sparse_ops,
        "error": error,
        "steps": steps,
        "max_difference": difference,
    }


print(json.dumps({
    "mirrored": check(mirrored, jit=False),
    "xla": check(one, jit=True),
}))
"""


def test_no_engine_tpu_gets_static_padded_ids_from_the_host(tmp_path):
    """Before, the fallback columns' ids reached the replica sparse, with
    dynamic shapes, and were densified there (SparseToDense under XLA)."""
    from tests import testing

    script = tmp_path / "no_engine.py"
    script.write_text(NO_ENGINE_SCRIPT)
    completed = testing.run_python(str(script), TF_CPP_MIN_LOG_LEVEL="3")
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    print(result)
    for strategy in ("mirrored", "xla"):
        assert result[strategy]["not_static"] == [], strategy
        assert result[strategy]["error"] is None, strategy
        assert result[strategy]["sparse_ops"] == [], strategy
        assert result[strategy]["steps"] == 4, strategy
        assert result[strategy]["max_difference"] < 1e-6, strategy


def test_no_engine_tpu_pads_by_columns_or_refuses_unknown_sparse(
    monkeypatch,
):
    """Without a preprocessor, `columns=` says the widths; with neither,
    sparse ids cannot be padded and are refused rather than left sparse."""
    from keras_tpu_embed.placement import hardware as tpu_hardware

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    monkeypatch.setattr(
        tpu_hardware,
        "embedding_hardware",
        lambda s: tpu_hardware.EmbeddingHardware.NO_ENGINE,
    )
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 10),
        4,
        tensor_core_shape=[None, 3],
    )
    batches = kte.distribute_dataset(
        strategy, _examples(6), 3, columns=[column]
    )
    got = [x["item"].numpy().tolist() for x, _ in batches]
    assert got == [[[0, -1, -1], [1, 1, -1], [2, 2, 2]]] * 1 + [
        [[3, -1, -1], [4, 4, -1], [5, 5, 5]]
    ]
    with pytest.raises(ValueError, match=r"no embedding engine.*\['item'\]"):
        kte.distribute_dataset(strategy, _examples(6), 3)


def test_global_steps_are_counted_only_where_no_batch_can_be_short():
    from keras_tpu_embed.pipelines.distribute import global_steps

    examples = tf.data.Dataset.range(10)
    assert global_steps(examples, False, 4) == 2
    assert global_steps(examples.batch(4), True, 4) == 2  # [8, 9] dropped
    assert global_steps(examples.batch(5).prefetch(1), True, 5) == 2
    exact = examples.batch(4, drop_remainder=True).map(lambda x: x * 2)
    assert global_steps(exact, True, 4) == 2  # static: every batch is full
    assert global_steps(examples.batch(20), True, 10) == 1  # one, short
    # A map may change the rows of a batch, so which are full is not known
    # without reading them: a count too small would lose data in `fit`.
    assert global_steps(examples.batch(4).map(lambda x: x), True, 4) is None
    assert global_steps(examples.filter(lambda x: True), False, 4) is None
    assert global_steps(examples.repeat(), False, 4) is None


# `model.fit` under MirroredStrategy over 2 logical CPUs, on what
# `distribute_dataset` makes (issue 34): the preprocessor's multi-valued
# ids, and the number of steps of a batched dataset. Keras' `fit` reads the
# first batch of every replica (`_maybe_symbolic_build` in
# keras/src/backend/tensorflow/trainer.py), which fails on sparse tensors,
# and warns "Your input ran out of data" (keras/src/trainers/
# epoch_iterator.py) when the dataset's cardinality promised more steps than
# it had, or none at all.
MIRRORED_FIT_SCRIPT = r"""
import json
import warnings
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)
import keras
import keras_tpu_embed as kte

one = tf.distribute.OneDeviceStrategy("/cpu:0")
mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
N, BATCH = 36, 8  # 4 full global batches and a short one, dropped
rng = np.random.default_rng(0)


class Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.count = 0

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1


def ragged(make):
    return tf.ragged.constant([make(1 + i % 3) for i in range(N)])


def columns():
    # "z" is out of the vocabularies, which have no OOV buckets: id -1.
    tag = kte.categorical_column_with_vocabulary_list("tag", ["a", "b", "c"])
    item = kte.weighted_categorical_column(
        kte.categorical_column_with_identity("item", 10), "item_w"
    )
    hist = kte.sequence_categorical_column_with_vocabulary_list(
        "hist", ["a", "b", "c"]
    )
    return [
        kte.embedding_column(tag, 4, combiner="mean"),
        kte.embedding_column(item, 3, combiner="sqrtn"),
        kte.embedding_column(hist, 2, combiner="sum", max_sequence_length=3),
    ]


raw = tf.data.Dataset.from_tensor_slices(
    (
        {
            "tag": ragged(lambda n: list(rng.choice(list("abcz"), n)))
            .to_sparse(),
            "item": ragged(lambda n: rng.integers(0, 10, n).tolist())
            .to_sparse(),
            "item_w": ragged(lambda n: rng.uniform(0.5, 2, n).tolist())
            .to_sparse(),
            "hist": ragged(lambda n: list(rng.choice(list("abcz"), n)))
            .to_sparse(),
        },
        rng.normal(size=(N, 1)).astype(np.float32),
    )
).batch(BATCH)


def train_on_ids(strategy):
    keras.utils.set_random_seed(1)
    pre = kte.FeaturePreprocessor(columns())
    with strategy.scope():
        layer = kte.TPUEmbeddingLayer(
            columns(),
            config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.4)),
            return_sequence_lengths=True,
        )
        inputs = pre.keras_inputs()
        out = layer(inputs)
        flat = keras.layers.Concatenate()(
            [
                keras.layers.Flatten()(keras.ops.cast(out[key], "float32"))
                for key in sorted(out)
            ]
        )
        model = keras.Model(inputs, keras.layers.Dense(1)(flat))
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    data = kte.distribute_dataset(strategy, raw, preprocessor=pre)
    model.fit(data, epochs=2, verbose=0)
    tables = {
        spec.name: np.asarray(
            strategy.experimental_local_results(
                layer.table_variable(spec.name).value
            )[0]
        )
        for spec in layer.local_table_specs
    }
    predictions = model.predict(data, verbose=0)
    return tables, np.asarray(predictions)


def preprocessed_ids():
    try:
        one_tables, one_pred = train_on_ids(one)
        tables, pred = train_on_ids(mirrored)
    except Exception as e:  # reported, so that the test shows it
        return {"error": f"{type(e).__name__}: {str(e)[-600:]}"}
    return {
        "error": None,
        "max_difference": max(
            float(np.max(np.abs(tables[k] - one_tables[k])))
            for k in one_tables
        ),
        "prediction_difference": float(np.max(np.abs(pred - one_pred))),
        "predictions": int(pred.shape[0]),
    }


def steps_of_a_batched_dataset():
    features = {"item": rng.integers(0, 10, (N, 2)).astype(np.int64)}
    batched = tf.data.Dataset.from_tensor_slices(
        (features, np.zeros((N, 1), np.float32))
    ).batch(BATCH)
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 10), 2
    )
    with mirrored.scope():
        inputs = {"item": keras.Input((2,), dtype="int64", name="item")}
        layer = kte.TPUEmbeddingLayer([column], output="concat")
        model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
        model.compile("sgd", "mse")
    data = kte.distribute_dataset(mirrored, batched)
    steps = Steps()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(data, epochs=2, verbose=0, callbacks=[steps])
    return {
        "cardinality": int(data.cardinality),
        "steps": steps.count,
        "ran_out": [str(w.message)[:80] for w in caught
                    if "ran out of data" in str(w.message)],
    }


print(json.dumps({
    "steps": steps_of_a_batched_dataset(),
    "preprocessed": preprocessed_ids(),
}))
"""


@pytest.fixture(scope="module")
def mirrored_fit(tmp_path_factory):
    from tests import testing

    # A file, not `-c`: Keras reads the source of the script's lambdas.
    script = tmp_path_factory.mktemp("mirrored") / "fit.py"
    script.write_text(MIRRORED_FIT_SCRIPT)
    completed = testing.run_python(str(script), TF_CPP_MIN_LOG_LEVEL="3")
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_mirrored_fit_runs_the_steps_of_a_batched_dataset(mirrored_fit):
    """Before, its cardinality was unknown (-2): Keras ran the 4 steps of
    each epoch, then warned that the input had run out of data."""
    result = mirrored_fit["steps"]
    print(result)
    assert result["cardinality"] == 4  # the short fifth batch is dropped
    assert result["steps"] == 2 * 4
    assert result["ran_out"] == []


@pytest.mark.slow
def test_mirrored_fit_takes_the_preprocessors_ids(mirrored_fit):
    """Before, `fit` failed before its first step on the preprocessor's
    sparse ids ('SparseTensor' object has no attribute 'device')."""
    result = mirrored_fit["preprocessed"]
    print(result)
    assert result["error"] is None
    assert result["predictions"] == 4 * 8
    assert result["max_difference"] < 1e-5
    assert result["prediction_difference"] < 1e-5
