"""The emulated chip holds each table as one shard per host, on that host.

TF's load and retrieve ops run per host under `ops.device(host)`; the chip
keeps each host's rows (with the optimizer's slots) on that host's device,
as a TPU system keeps them in that host's chips, and what TF retrieves from
it is what it holds.
"""

import numpy as np

from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

HOSTS = 2
REPLICAS = 4


def _host(task):
    return f"/job:worker/replica:0/task:{task}/device:CPU:0"


def test_each_host_holds_its_rows_of_every_table_on_the_chip():
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.fit(models.batches(strategy), epochs=1, verbose=0)
        retrieved = models.engine_values(model)
        chip = {table.name: table for table in strategy.emulated_chip.tables}
        # TF's split: "user" 20 rows, 10 per host; "item" 15, 8 and 7.
        for name, rows in (("user", [10, 10]), ("item", [8, 7])):
            shards = [chip[name].shards[task] for task in range(HOSTS)]
            assert [s.host for s in shards] == [_host(0), _host(1)]
            assert [s.rows for s in shards] == rows
            for task, shard in enumerate(shards):
                assert sorted(shard.variables) == ["accumulators", "parameters"]
                for variable in shard.variables.values():
                    assert variable.device == _host(task), name
            for slot, key in (
                ("parameters", name),
                ("accumulators", f"{name}/accumulators"),
            ):
                held = np.concatenate(
                    [s.variables[slot].numpy() for s in shards]
                )
                np.testing.assert_array_equal(held, retrieved[key])
