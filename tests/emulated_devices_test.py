"""The devices of an emulated TPU system.

In this process: logical CPUs. A pod's client is a process of its own (a
process is the client of one cluster for the rest of its life): the pod of
in-process hosts in `tests/emulated_hosts`, the pod of host processes here,
in a fresh process.
"""

import json
import textwrap
import time

import pytest
import tensorflow as tf

from keras_tpu_embed.testing import emulated_devices
from tests.testing import run_python


def test_host_of_a_core_is_its_tasks_cpu_0():
    host = emulated_devices.host_of("/job:worker/replica:0/task:1/device:CPU:3")
    assert host == "/job:worker/replica:0/task:1/device:CPU:0"


def test_by_host_groups_devices_in_their_order():
    devices = [
        f"/job:worker/replica:0/task:{task}/device:CPU:{core}"
        for task in (1, 0)
        for core in (0, 1)
    ]
    hosts = emulated_devices.by_host(devices)
    assert [host for host, _ in hosts] == [
        "/job:worker/replica:0/task:1/device:CPU:0",
        "/job:worker/replica:0/task:0/device:CPU:0",
    ]
    assert [owned for _, owned in hosts] == [
        tuple(devices[:2]),
        tuple(devices[2:]),
    ]


def test_cpu_devices_after_tensorflow_started_says_how_to_split_first():
    started = len(tf.config.list_logical_devices("CPU"))
    with pytest.raises(RuntimeError, match="set_logical_device_configuration"):
        emulated_devices.cpu_devices(started + 1)
    assert len(emulated_devices.cpu_devices(started)) == started


def test_this_process_is_no_pods_client():
    assert not emulated_devices.pod_is_connected()


# A pod of 2 host processes, measured and trained from its client. Host k's
# memory is host k's process: a variable placed on host 1 grows that
# process alone. Then the model of `tests/emulated/models.py` trains on the
# pod as on one device, with TF's table shards and the emulated chip's
# shards each on their host.
HOST_PROCESSES = textwrap.dedent(
    """
    import json, os, socket
    import numpy as np
    import tensorflow as tf
    from keras_tpu_embed.testing import emulated_devices, emulated_tpu
    from tests.emulated import models

    def rss(pid):
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024

    devices = emulated_devices.pod_devices(4, 2, host_processes=True)
    pids = emulated_devices.host_process_ids()
    result = {"devices": devices, "pids": pids, "client": os.getpid()}
    with open(f"/proc/{pids[0]}/cmdline") as cmdline:
        cluster = json.loads(cmdline.read().split("\\0")[3])
    result["cluster"] = cluster
    taken = []
    for address in cluster["worker"]:
        try:
            with socket.socket() as other:
                other.bind(("127.0.0.1", int(address.split(":")[1])))
        except OSError:
            taken.append(address)
    result["ports_taken"] = taken
    try:
        emulated_devices.pod_devices(6, 3, host_processes=True)
    except RuntimeError as error:
        result["second_pod"] = str(error)

    def on_host_1(shape):
        # The read too: eager runs an op outside any device scope on the
        # client, which would copy the variable there.
        with tf.device("/job:worker/replica:0/task:1/device:CPU:0"):
            variable = tf.Variable(tf.ones(shape))
            float(tf.reduce_sum(variable[0]))
        return variable

    on_host_1([64, 1024])  # the runtime's first ops, apart
    before = {pid: rss(pid) for pid in pids + [os.getpid()]}
    big = on_host_1([64, 2**20])  # 256 MiB
    result["grown"] = {
        str(pid): rss(pid) - before[pid] for pid in pids + [os.getpid()]
    }
    del big

    expected = models.one_device("adagrad")
    with emulated_tpu(4, num_hosts=2) as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.fit(models.batches(strategy), epochs=2, verbose=0)
        actual = models.table_values(model)
        mid_level = model.get_layer("embed").engine.mid_level
        result["tf_shards"] = {
            name: [v.device for v in slots["parameters"].variables]
            for name, slots in mid_level._variables.items()
        }
        result["chip_shards"] = {
            table.name: [
                [shard.host, shard.start, shard.rows]
                + sorted({v.device for v in shard.variables.values()})
                for _, shard in sorted(table.shards.items())
            ]
            for table in strategy.emulated_chip.tables
        }
    wanted = models.local_values(expected)
    result["max_difference"] = max(
        float(np.max(np.abs(actual[name] - wanted[name]))) for name in wanted
    )
    result["tables"] = sorted(actual) == sorted(wanted)
    print(json.dumps(result))
    """
)


def _host(task):
    return f"/job:worker/replica:0/task:{task}/device:CPU:0"


@pytest.fixture(scope="module")
def host_processes():
    done = run_python("-c", HOST_PROCESSES, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_each_host_is_a_process_of_its_own(host_processes):
    pids = host_processes["pids"]
    assert len(set(pids)) == 2
    assert host_processes["client"] not in pids
    assert host_processes["devices"] == [
        f"/job:worker/replica:0/task:{task}/device:CPU:{core}"
        for task in (0, 1)
        for core in (0, 1)
    ]
    # 256 MiB on host 1: that process grew by it, the others did not.
    grown = host_processes["grown"]
    mib = 2**20
    assert grown[str(pids[1])] >= 250 * mib, grown
    assert grown[str(pids[0])] < 64 * mib, grown
    assert grown[str(host_processes["client"])] < 64 * mib, grown


@pytest.mark.slow
def test_host_ports_stay_reserved_while_the_pod_runs(host_processes):
    addresses = host_processes["cluster"]["worker"]
    assert [a.split(":")[0] for a in addresses] == ["127.0.0.1"] * 2
    assert host_processes["ports_taken"] == addresses


@pytest.mark.slow
def test_a_process_emulates_one_pod(host_processes):
    assert (
        "2 hosts x 2 replicas (host processes)"
        in (host_processes["second_pod"])
    )


@pytest.mark.slow
def test_host_processes_end_with_their_client(host_processes):
    pids = host_processes["pids"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.5)
    assert not [pid for pid in pids if _alive(pid)]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            return "zombie" not in status.read()
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_training_on_host_processes_equals_one_device(host_processes):
    assert host_processes["tables"]
    assert host_processes["max_difference"] <= 1e-5


@pytest.mark.slow
def test_tables_and_chip_shards_live_on_their_host_process(host_processes):
    assert host_processes["tf_shards"] == {
        "user": [_host(0), _host(1)],
        "item": [_host(0), _host(1)],
    }
    # TF's rows per host: "user" 20 rows, 10 and 10; "item" 15, 8 and 7.
    # Each shard holds the table and its accumulator on its host.
    assert host_processes["chip_shards"] == {
        "user": [[_host(0), 0, 10, _host(0)], [_host(1), 10, 10, _host(1)]],
        "item": [[_host(0), 0, 8, _host(0)], [_host(1), 8, 7, _host(1)]],
    }
