"""2 hosts x 2 replicas under `emulated_tpu(4, num_hosts=2)`.

TensorFlow's own code sees a pod of two hosts: `TPUEmbedding` creates each
table as one shard per host (on that host, with its `shard_info`),
`distribute_datasets_from_function` builds one input pipeline per host
feeding that host's replicas, and Keras puts `predict`'s outputs back in
order with its multi-host reordering (`_tpu_multi_host_concat`). Training
then equals one device on the same global batches.
"""

import contextlib
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v2_utils

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models
from tests.emulated import optimizer_matrix_test as matrix
from tests.emulated_hosts import trained_pod

HOSTS = 2
REPLICAS = 4


def _host(task):
    return f"/job:worker/replica:0/task:{task}/device:CPU:0"


def test_tf_sees_two_hosts_with_their_own_input_and_shards():
    contexts = []

    def host_dataset(context):
        pipelines = context.num_input_pipelines
        contexts.append((pipelines, context.input_pipeline_id))
        return models.dataset().shard(pipelines, context.input_pipeline_id)

    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        assert strategy.extended.num_hosts == HOSTS
        assert strategy.extended.num_replicas_per_host == 2
        assert tpu_embedding_v2_utils.get_list_of_hosts(strategy) == [
            _host(0),
            _host(1),
        ]
        batches = kte.distribute_dataset(
            strategy, host_dataset, models.GLOBAL_BATCH
        )
        assert contexts == [(2, 0), (2, 1)]
        # Keras' steps per epoch (TF counts a host's per-replica batches).
        steps = models.ROWS // models.GLOBAL_BATCH
        assert batches.cardinality == steps
        assert models.batches(strategy).cardinality == steps
        features, _ = next(iter(batches))
        # Host h's pipeline feeds replicas 2h and 2h + 1, on the host.
        tasks = [
            tf.DeviceSpec.from_string(value.device).task
            for value in strategy.experimental_local_results(features["user"])
        ]
        assert tasks == [0, 0, 1, 1]

        model = models.build_emulated(strategy, "sgd")
        model.predict(models.batches(strategy), verbose=0)
        mid_level = model.get_layer("embed").engine.mid_level
        # TF's sharded creator: host h holds its block of rows, on host h.
        shard_rows = {"user": [10, 10], "item": [8, 7]}
        for table, variables in mid_level._variables.items():
            shards = variables["parameters"].variables
            assert [shard.device for shard in shards] == [
                _host(0),
                _host(1),
            ], table
            assert [int(shard.shape[0]) for shard in shards] == shard_rows[
                table
            ]


def _one_device_reference(optimizer):
    """The model trained on one device, and its predictions of
    `distinct_rows` (distinct: a permutation would show)."""
    expected = models.one_device(optimizer)
    wanted = expected.predict(
        trained_pod.distinct_rows(tf.distribute.get_strategy()), verbose=0
    )
    assert len(np.unique(wanted.round(5))) == len(wanted)
    return expected, wanted


def _assert_equals_one_device(trained, expected, wanted):
    """`trained` (`trained_pod.fit_two_epochs` of the pod model) equals
    one device (`_one_device_reference`): tables, step, head and the
    predictions, in order."""
    assert trained.multi_host
    assert not [w for w in trained.warnings if "ran out of data" in w]
    models.assert_values_equal(trained.values, models.local_values(expected))
    assert trained.step == 8
    for actual, weight in zip(
        trained.head, expected.get_layer("head").get_weights()
    ):
        np.testing.assert_allclose(actual, weight, atol=1e-5, rtol=0)
    np.testing.assert_allclose(trained.predictions, wanted, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "optimizer, feature",
    # SGD (no slots) is covered on one host (tests/emulated/training_test.py);
    # Adagrad on the engine ("V1") below, on the shared pod model.
    [("adam", "V1"), ("ftrl", "V1")] + [("adagrad", "UNSUPPORTED")],
)
def test_fit_on_two_hosts_equals_one_device(optimizer, feature):
    """... and `predict` keeps the input order: Keras' multi-host
    reordering (`_tpu_multi_host_concat`) undoes `distribute_dataset`'s
    layout."""
    expected, wanted = _one_device_reference(optimizer)
    with emulated_tpu(
        REPLICAS, num_hosts=HOSTS, embedding_feature=feature
    ) as strategy:
        model = models.build_emulated(strategy, optimizer)
        trained = trained_pod.fit_two_epochs(strategy, model)
    assert trained.on_the_engine == (feature == "V1")
    _assert_equals_one_device(trained, expected, wanted)


def test_fit_on_two_hosts_equals_one_device_adagrad_on_the_engine(
    adagrad_pod,
):
    """The Adagrad case on the engine ("V1"): the pod model of
    `trained_pod.py`, shared with the checkpoint tests (a fit costs tens
    of CPU seconds on the pod)."""
    expected, wanted = _one_device_reference("adagrad")
    assert adagrad_pod.two_epochs.on_the_engine
    _assert_equals_one_device(adagrad_pod.two_epochs, expected, wanted)


def _engine_table(strategy, column):
    return models.item_engine_values(strategy, column)[1]


def test_tables_start_from_the_checkpoint_on_two_hosts(tmp_path):
    values = np.arange(35, dtype=np.float32).reshape(7, 5)
    path = tf.train.Checkpoint(table=tf.Variable(values)).write(
        str(tmp_path / "c")
    )
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 7),
        5,
        ckpt_to_load_from=path,
        tensor_name_in_ckpt="table/.ATTRIBUTES/VARIABLE_VALUE",
    )
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        tables = _engine_table(strategy, column)
    (table,) = [name for name in tables if "/" not in name]
    np.testing.assert_array_equal(tables[table], values)


def test_default_initialized_table_repeats_no_rows_on_two_hosts():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 16), 4
    )
    keras.utils.set_random_seed(3)
    layer = kte.TPUEmbeddingLayer([column])
    layer.build()
    one_device = layer.table_variable("item").numpy()
    keras.utils.set_random_seed(3)
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        tables = _engine_table(strategy, column)
    (table,) = [name for name in tables if "/" not in name]
    rows = tables[table]
    assert len({row.tobytes() for row in rows}) == len(rows)
    np.testing.assert_array_equal(rows, one_device)


def test_one_process_emulates_one_pod_shape():
    with emulated_tpu(REPLICAS, num_hosts=HOSTS):
        pass
    with pytest.raises(RuntimeError, match="2 hosts x 2 replicas"):
        with emulated_tpu(6, num_hosts=2):
            pass
    with pytest.raises(RuntimeError, match="another process"):
        with emulated_tpu(2):
            pass


@pytest.mark.parametrize("made_in_scope", [False, True])
def test_preprocessor_runs_on_each_host(tmp_path, made_in_scope):
    """The preprocessor's lookup tables reach the hosts with the pipeline.

    They were anonymous tables of the client: a host's pipeline failed
    with "Container Anonymous does not exist". Made inside
    `strategy.scope()`, they were placed on a host, and the pipeline the
    client sends to each host could not be serialized ("Trying to access
    resource ... located in device /job:worker/...").
    """
    vocabulary = tmp_path / "countries.txt"
    vocabulary.write_text("fr\nde\nit\n")
    columns = [
        kte.categorical_column_with_vocabulary_list("tag", ["a", "b", "c"]),
        kte.categorical_column_with_vocabulary_file(
            "country", str(vocabulary), num_oov_buckets=1
        ),
    ]
    tags = np.array([["a"], ["c"], ["b"], ["x"]] * 2)
    countries = np.array([["it"], ["fr"], ["zz"], ["de"]] * 2)
    examples = tf.data.Dataset.from_tensor_slices(
        ({"tag": tags, "country": countries}, np.zeros((8, 1), "float32"))
    )
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        scope = strategy.scope() if made_in_scope else contextlib.nullcontext()
        with scope:
            preprocessor = kte.FeaturePreprocessor(columns)
        batches = kte.distribute_dataset(
            strategy, examples, 8, preprocessor=preprocessor
        )
        features, _ = next(iter(batches))
        got = {
            key: [
                tf.sparse.to_dense(value, default_value=-9).numpy().tolist()
                for value in strategy.experimental_local_results(features[key])
            ]
            for key in ("tag", "country")
        }
    # Replica r of host h holds rows 2 * (2 * r + h), +1.
    order = [[0, 1], [4, 5], [2, 3], [6, 7]]
    # "x" is out of the vocabulary: -1, which the engine filter drops.
    tag_ids = [[0], [2], [1], [-9]] * 2
    country_ids = [[2], [0], [3], [1]] * 2
    assert got["tag"] == [[tag_ids[i] for i in rows] for rows in order]
    assert got["country"] == [[country_ids[i] for i in rows] for rows in order]


def test_smoke_passes_on_two_emulated_hosts(tmp_path, capsys):
    """Every stage, and the serve stage's row-by-row comparison of predict
    with the served model: predict kept the input's order on 2 hosts."""
    from tests.emulated.tpu_smoke_test import _main

    code = _main(
        [
            "--emulate",
            "V1",
            "--hosts",
            "2",
            "--replicas",
            "4",
            "--steps",
            "5",
            "--epochs",
            "2",
            "--global-batch-size",
            "64",
            "--num-examples",
            "2000",
            "--output-dir",
            str(tmp_path),
        ]
    )
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "smoke_summary.json").read_text())
    assert code == 0, printed
    assert [s["status"] for s in summary["stages"]] == ["PASS"] * 7
    assert summary["environment"]["hosts"] == 2
    assert summary["environment"]["replicas"] == 4
    serve = summary["stages"][-1]["details"]
    assert serve["distinct_predictions"] == serve["examples"] == 64
    assert summary["numbers"]["max_difference"] <= 1e-5


def test_every_column_kind_on_two_hosts_equals_one_device():
    """Issue 41's sweep: the model of every id column kind (a shared table
    read by an id and a sequence column, weighted and plain `sum`, `sqrtn`
    and `mean`) diverged from one device on 2 hosts x 4 replicas with the
    optimizers that keep slots. The optimizer missing above, AdagradMomentum
    with Nesterov and `beta2` < 1, on that model."""
    name = "AdagradMomentum_nesterov_beta2"
    wanted = matrix.one_device(name)
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        trained = matrix.fit(strategy, name)
        assert trained.get_layer("embed").engine is not None
        actual = models.engine_tables(trained)
    models.assert_values_equal(actual, wanted)
