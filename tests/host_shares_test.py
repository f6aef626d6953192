"""Each host's share of the global batches.

`distribute_test.py` checks the shares end to end, through
`distribute_dataset` and Keras' `predict` order on a pod.
"""

import tensorflow as tf

from keras_tpu_embed.pipelines import host_shares


def test_each_host_takes_its_slice_of_every_global_batch():
    numbers = tf.data.Dataset.range(9).map(
        lambda i: {"dense": i, "sparse": tf.sparse.from_dense([i + 100])}
    )
    second_host = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2
    )
    host = host_shares.host_slices(numbers.batch(4), 4)(second_host)
    got = [(int(x["dense"]), x["sparse"].values.numpy().tolist()) for x in host]
    # Examples 2, 3 of [0..3] and 6, 7 of [4..7]; the batch [8] is dropped.
    assert got == [(2, [102]), (3, [103]), (6, [106]), (7, [107])]
