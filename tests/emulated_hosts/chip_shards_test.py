"""The emulated chip holds each table as one shard per host, on that host.

TF's load and retrieve ops run per host under `ops.device(host)`; the chip
keeps each host's rows (with the optimizer's slots) on that host's device,
as a TPU system keeps them in that host's chips, and what TF retrieves from
it is what it holds.
"""

import numpy as np

from tests.emulated_hosts.trained_pod import HOSTS


def _host(task):
    return f"/job:worker/replica:0/task:{task}/device:CPU:0"


def test_each_host_holds_its_rows_of_every_table_on_the_chip(adagrad_pod):
    # The Adagrad model trained on the pod (`trained_pod.py`): the chip's
    # shards as held, and the tables TF retrieved from the chip then.
    retrieved = adagrad_pod.saved_values
    chip = adagrad_pod.chip_shards
    # TF's split: "user" 20 rows, 10 per host; "item" 15, 8 and 7.
    for name, rows in (("user", [10, 10]), ("item", [8, 7])):
        shards = chip[name]
        assert len(shards) == HOSTS, name
        assert [s.host for s in shards] == [_host(0), _host(1)]
        assert [s.rows for s in shards] == rows
        for task, shard in enumerate(shards):
            assert sorted(shard.devices) == ["accumulators", "parameters"]
            for device in shard.devices.values():
                assert device == _host(task), name
        for slot, key in (
            ("parameters", name),
            ("accumulators", f"{name}/accumulators"),
        ):
            held = np.concatenate([s.values[slot] for s in shards])
            np.testing.assert_array_equal(held, retrieved[key])
