"""A `FeaturePreprocessor` made inside `strategy.scope()` feeds a pod.

Its vocabulary lookup tables were created where the strategy places
resources, a host of the pod, and the input pipeline that the client
builds and sends to each host as a graph could not be serialized ("Trying
to access resource ... located in device /job:worker/..."); made outside
the scope it worked.
"""

import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu

HOSTS = 2
REPLICAS = 4


def test_a_preprocessor_made_in_the_scope_feeds_every_host(tmp_path):
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
        outside = kte.FeaturePreprocessor(columns)
        with strategy.scope():
            inside = kte.FeaturePreprocessor(columns)
        got = {}
        for name, preprocessor in (("outside", outside), ("inside", inside)):
            batches = kte.distribute_dataset(
                strategy, examples, 8, preprocessor=preprocessor
            )
            features, _ = next(iter(batches))
            got[name] = {
                key: [
                    tf.sparse.to_dense(value, default_value=-9).numpy().tolist()
                    for value in strategy.experimental_local_results(
                        features[key]
                    )
                ]
                for key in ("tag", "country")
            }
    assert got["inside"] == got["outside"]
