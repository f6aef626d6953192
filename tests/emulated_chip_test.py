"""The emulated chip under TF's own `TPUEmbedding`, no layer in between.

Each case runs in a fresh process: the emulation splits the CPU into
logical devices, which TensorFlow allows only before its runtime starts.
The expected values are computed here with numpy from the ids and the
tables, not read from the emulation.
"""

import json
import textwrap

import numpy as np
import pytest

from tests.testing import run_python

# Two replicas; table rows are 10 * row + column, so every activation names
# the rows it combined. One step of SGD with a gradient of ones; the tables
# come back through TF's checkpoint hook (retrieve before save).
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    from keras_tpu_embed.optimizers.base import protobuf_safe
    from keras_tpu_embed.testing import emulated_tpu

    embedding = tf.tpu.experimental.embedding
    start = np.arange(24.0).reshape(8, 3) + 10 * np.arange(8)[:, None]
    with emulated_tpu(2) as strategy:
        def table(name, combiner):
            return embedding.TableConfig(
                vocabulary_size=8, dim=3, name=name, combiner=combiner,
                initializer=tf.constant_initializer(start),
            )
        features = {
            "sum": embedding.FeatureConfig(table=table("s", "sum"), name="sum"),
            "mean": embedding.FeatureConfig(
                table=table("m", "mean"), name="mean"
            ),
        }
        with strategy.scope():
            # TF's own SGD writes a bool into an enum field of the proto,
            # which protobuf refuses (see `protobuf_safe`).
            optimizer = protobuf_safe(embedding.SGD(0.5))
            engine = embedding.TPUEmbedding(features, optimizer)
        ids = tf.ragged.constant([[1, 2], [3], [1, 1, 4], [7]], tf.int64)
        data = tf.data.Dataset.from_tensors({"sum": ids, "mean": ids})
        batch = next(iter(strategy.experimental_distribute_dataset(
            data,
            options=tf.distribute.InputOptions(
                experimental_fetch_to_device=False
            ),
        )))

        @tf.function
        def step(batch):
            def replica(batch):
                engine.enqueue(batch, training=True)
                out = engine.dequeue()
                engine.apply_gradients(
                    {k: tf.ones_like(v) for k, v in out.items()}
                )
                return out
            return strategy.run(replica, args=(batch,))

        out = step(batch)
        path = tf.train.Checkpoint(engine=engine).save(sys.argv[1] + "/c")
    result = {
        k: [r.numpy().tolist() for r in strategy.experimental_local_results(v)]
        for k, v in out.items()
    }
    for name in ("s", "m"):
        key = [k for k, _ in tf.train.list_variables(path)
               if k.endswith("/" + name + "/.ATTRIBUTES/VARIABLE_VALUE")]
        result[name] = tf.train.load_variable(path, key[0]).tolist()
    result["shards"] = {
        table.name: [
            [shard.host, shard.start, shard.rows]
            for shard in table.shards.values()
        ]
        for table in strategy.emulated_chip.tables
    }
    print(json.dumps(result))
    """
)


@pytest.mark.slow
def test_tf_tpu_embedding_runs_on_the_emulated_chip(tmp_path):
    done = run_python("-c", SCRIPT, str(tmp_path), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    start = np.arange(24.0).reshape(8, 3) + 10 * np.arange(8)[:, None]
    examples = [[1, 2], [3], [1, 1, 4], [7]]
    # Replica r gets examples 2r and 2r + 1 of the global batch.
    for feature, combine in (("sum", np.sum), ("mean", np.mean)):
        for replica in range(2):
            want = [
                combine(start[ids], axis=0)
                for ids in examples[2 * replica : 2 * replica + 2]
            ]
            np.testing.assert_allclose(got[feature][replica], want)
    # One update on the global batch: each id's gradient is summed over
    # every occurrence on both replicas (sum: 1 each; mean: 1 / length).
    for table, weight in (("s", lambda ids: 1.0), ("m", len)):
        gradient = np.zeros(8)
        for ids in examples:
            for i in ids:
                gradient[i] += 1.0 / weight(ids)
        np.testing.assert_allclose(
            got[table], start - 0.5 * gradient[:, None], rtol=1e-6
        )
    # One host: each table is one shard of all its rows, on the host.
    host = "/job:localhost/replica:0/task:0/device:CPU:0"
    assert got["shards"] == {"s": [[host, 0, 8]], "m": [[host, 0, 8]]}


def test_tfs_enqueue_op_checks_nothing_the_chip_could_be_anchored_to():
    """Why the chip's enqueue rules are not checked against TF's op: its
    registered shape function (`EnqueueTPUEmbeddingArbitraryTensorBatch`,
    traced on CPU) accepts ids of rank 2, sample indices of rank 3 and
    weights that match no id. The rules live in TF's Python, which runs
    under the emulation, and in the chip, which only a TPU has. Should TF
    ever check them, this fails and the chip can be anchored there."""
    import tensorflow as tf
    from tensorflow.python.tpu.ops import tpu_ops

    # (sample indices or row splits, ids, weights): shapes
    wrong = [([0], [4, 2], [0]), ([3, 2, 2], [4], [0]), ([0], [4], [3])]
    with tf.Graph().as_default():
        for positions, ids, weights in wrong:
            op = tpu_ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
                sample_indices_or_row_splits=[tf.zeros(positions, tf.int32)],
                embedding_indices=[tf.zeros(ids, tf.int32)],
                aggregation_weights=[tf.zeros(weights, tf.float32)],
                mode_override="train",
                device_ordinal=0,
                combiners=["sum"],
            )
            assert op.type == "EnqueueTPUEmbeddingArbitraryTensorBatch"
