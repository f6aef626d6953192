"""Training on TensorFlow's parameter servers, on a cluster of local
processes: 2 parameter servers and 2 workers on 127.0.0.1, started and
stopped here (`keras_tpu_embed.testing.local_cluster`), and a coordinator
process (`parameter_server_scenarios.py`; it connects its process to the
cluster for the rest of its life) that trains, checkpoints and exports,
and replays each training on one device.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_tpu_embed.testing.local_cluster import local_cluster
from tests.parameter_server_scenarios import OPTIMIZERS

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


def coordinate(cluster, out, *arguments):
    """Runs the coordinator; returns its report and its output."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.parameter_server_scenarios",
            json.dumps(cluster),
            str(out),
            *map(str, arguments),
        ],
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stdout


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("parameter_servers")
    with local_cluster() as (cluster, _):
        report, output = coordinate(cluster, out)
    return report, output, out


@pytest.fixture(scope="module")
def report(cluster_run):
    return cluster_run[0]


def test_tables_are_sharded_over_both_servers_as_on_one_device(report):
    servers = ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"]
    for optimizer in OPTIMIZERS:
        found = report[optimizer]
        # Every table and slot, shared and tensor-core ones included.
        for name, devices in found["shard_devices"].items():
            # One shard on each server (the strategy's round robin picks
            # which first).
            assert sorted(d.split("/device")[0] for d in devices) == servers
        # Each shard made on its server holds the one-device table's rows.
        assert found["initial_difference"] == 0.0, optimizer
    assert (
        "item_tag_shared_embedding"
        in (report["shared_tensor_core"]["shard_devices"])
    )


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_training_equals_one_device_on_the_same_batches(report, optimizer):
    found = report[optimizer]
    assert len(found["order"]) == 6, found["order"]
    assert found["moved"] > 1e-3, found
    # Tables, slots, the dense head and the embedding step.
    assert found["difference"] <= 1e-5, found


def test_training_shows_keras_progress_and_history(cluster_run, report):
    output = cluster_run[1]
    assert "Epoch 2/2" in output and "3/3" in output, output[-2000:]
    losses = report["sgd"]["losses"]
    assert len(losses) == 2 and all(np.isfinite(losses)), losses
    # The compiled metric, and validation after each epoch.
    assert report["sgd"]["history"] == ["loss", "mae", "val_loss", "val_mae"]


def test_evaluate_reports_the_loss_and_changes_nothing(report):
    found = report["adagrad"]
    assert set(found["evaluate"]) == {"loss", "mae"}
    assert all(np.isfinite(list(found["evaluate"].values())))
    assert found["evaluate_changed"] == 0.0


def test_lookups_on_the_servers_keep_the_ids_order(report):
    # Ids [V - 1, 0] in one row read rows of both shards.
    assert report["adagrad"]["predict_difference"] <= 1e-6


def test_an_id_past_the_table_is_refused_as_on_one_device(report):
    on_servers, on_one_device = report["adagrad"]["out_of_range"]
    assert on_one_device and "item" in on_one_device, on_one_device
    assert on_servers is not None, "an id past the table was looked up"
    assert on_servers.split(":")[0] == on_one_device.split(":")[0]
    assert "item" in on_servers and str(11) in on_servers, on_servers


def test_checkpoints_move_between_servers_and_one_device(report):
    found = report["adagrad"]
    keys = found["keys"]
    assert (
        "model/embedding/embedding_tables/item/.ATTRIBUTES/VARIABLE_VALUE"
        in keys
    )
    # The last epoch's CheckpointCallback file, with the dense optimizer.
    assert found["restored_on_one_device"] == 0.0
    assert found["restored_iterations"] == 6
    assert found["restored_on_servers"] == 0.0
    # By the engine's table names, as a TPU's mid-level object writes them.
    assert found["restore_tables_on_one_device"] == 0.0
    assert found["restore_tables_on_servers"] == 0.0


def test_the_export_serves_the_models_predictions(cluster_run):
    out = cluster_run[2]
    saved = np.load(out / "predictions.npz")
    served = tf.saved_model.load(str(out / "export"))
    inputs = {k: tf.constant(saved[k]) for k in saved.files if k != "want"}
    got = served.signatures["serving_default"](**inputs)["output_0"]
    np.testing.assert_allclose(got.numpy(), saved["want"], atol=1e-6)


def test_a_strategy_that_shards_dense_weights_too_is_refused(report):
    message = report["partitioner_refusal"]
    assert "variable_partitioner=" in message, message
    assert "without variable_partitioner" in message, message


def test_a_killed_worker_leaves_training_equal_to_one_device(tmp_path):
    with local_cluster() as (cluster, processes):
        victim = processes[("worker", 1)]
        report, _ = coordinate(cluster, tmp_path, victim.pid)
        assert victim.poll() is not None  # it was killed
    assert len(report["order"]) == 6, report["order"]
    assert report["difference"] <= 1e-5, report


def test_a_killed_parameter_server_stops_training_naming_it(tmp_path):
    with local_cluster() as (cluster, processes):
        victim = processes[("ps", 1)]
        report, _ = coordinate(cluster, tmp_path, f"ps:{victim.pid}")
    message = report["error"]
    assert message and "/job:ps/task:1" in message, report
    assert "restore the last checkpoint" in message, message
    # The rows it held: one of the two shards of each 11-row table.
    assert re.search(r"item rows (0\.\.5|6\.\.10)", message), message
