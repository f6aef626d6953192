"""`local_cluster`: servers as processes, ready inside, killed after."""

import pytest
import tensorflow as tf

from keras_tpu_embed.testing.local_cluster import local_cluster


@pytest.mark.slow
def test_servers_run_inside_and_are_killed_after():
    with local_cluster(parameter_servers=1, workers=2) as (cluster, processes):
        assert sorted(processes) == [("ps", 0), ("worker", 0), ("worker", 1)]
        assert all(p.poll() is None for p in processes.values())
        spec = tf.train.ClusterSpec(cluster)
        assert spec.num_tasks("ps") == 1 and spec.num_tasks("worker") == 2
        assert len(set(spec.as_dict()["ps"] + spec.as_dict()["worker"])) == 3
    assert all(p.poll() is not None for p in processes.values())


@pytest.mark.slow
def test_the_servers_are_killed_when_the_body_fails():
    with pytest.raises(ZeroDivisionError):
        with local_cluster(parameter_servers=1, workers=1) as (_, processes):
            1 / 0
    assert all(p.poll() is not None for p in processes.values())
