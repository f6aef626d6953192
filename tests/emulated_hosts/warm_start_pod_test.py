"""`kte.warm_start` of engine tables on a pod of 2 hosts x 2 replicas.

Each host holds its own shard of every engine table (rows 0-6 on host 0,
7-13 on host 1 for 14 rows): the checkpoint's rows reach each host's
shard, read on that host, and the tables read back from the (emulated)
chip equal the same columns warm-started on CPU.
"""

import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models
from tests.emulated.warm_start_engine_test import CASES
from tests.emulated.warm_start_engine_test import estimator_checkpoint
from tests.emulated.warm_start_engine_test import first_step
from tests.emulated.warm_start_engine_test import item_column
from tests.emulated.warm_start_engine_test import item_model
from tests.warm_start_test import TABLE_KEY

HOSTS = 2
REPLICAS = 4


@pytest.mark.parametrize("steps_first", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_tables_equal_the_cpu_model_on_two_hosts(
    tmp_path, case, steps_first
):
    prefix = estimator_checkpoint(tmp_path)
    arguments = {**CASES[case], "slots": True}
    cpu = item_model(item_column(case))
    cpu_report = kte.warm_start(cpu, prefix, **arguments)
    expected = models.local_values(cpu)
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        column = item_column(case)
        with strategy.scope():
            model = item_model(column)
        engine = model.get_layer("embed").engine
        assert len(engine.shards_of("item")) == HOSTS
        if steps_first:
            first_step(strategy, model, column, case)
        report = kte.warm_start(model, prefix, **arguments)
        if not steps_first:
            first_step(strategy, model, column, case)
        actual = models.engine_values(model)
    models.assert_values_equal(actual, expected, atol=0)
    assert report == cpu_report


def test_each_host_reads_its_rows_a_stored_slice_at_a_time(
    tmp_path, monkeypatch
):
    """No tensor is read whole: each host's shard is read on that host,
    one stored slice (of the 3 the TPUEstimator run saved) at a time."""
    prefix = estimator_checkpoint(tmp_path)
    whole, requests = [], []
    load_checkpoint = tf.train.load_checkpoint
    restore = tf.raw_ops.RestoreV2

    class Reader:
        def __init__(self, reader):
            self._reader = reader

        def get_tensor(self, name):
            whole.append(name)
            return self._reader.get_tensor(name)

        def __getattr__(self, name):
            return getattr(self._reader, name)

    def recording_restore(**kwargs):
        values = restore(**kwargs)
        for name, spec, value in zip(
            kwargs["tensor_names"], kwargs["shape_and_slices"], values
        ):
            first, size = spec.split()[2].split(":")[0].split(",")
            task = tf.DeviceSpec.from_string(value.device).task
            requests.append((name, (int(first), int(size)), task))
        return values

    monkeypatch.setattr(
        tf.train, "load_checkpoint", lambda path: Reader(load_checkpoint(path))
    )
    monkeypatch.setattr(tf.raw_ops, "RestoreV2", recording_restore)
    with emulated_tpu(REPLICAS, num_hosts=HOSTS) as strategy:
        with strategy.scope():
            model = item_model(item_column("div"))
        kte.warm_start(model, prefix, num_shards=3, slots=True)
    assert whole == []
    # Stored slices (0, 5), (5, 5), (10, 4); host shards rows 0-6, 7-13.
    reads = [((0, 5), 0), ((5, 2), 0), ((7, 3), 1), ((10, 4), 1)]
    for tensor in (TABLE_KEY, TABLE_KEY + "/Adagrad"):
        assert (
            sorted(
                (rows, task) for name, rows, task in requests if name == tensor
            )
            == reads
        ), tensor
    assert len(requests) == 2 * len(reads)
