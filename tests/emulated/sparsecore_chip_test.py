"""TensorFlow's own `TPUEmbeddingV2` under `emulated_tpu("V2")`.

`emulated_tpu(embedding_feature="V2")` is a TPU with SparseCores (v5p,
v6e): TF's `tf.tpu.experimental.embedding.TPUEmbeddingV2` runs unmodified
under it -- its table stacking, its sharded variables, its input
preprocessing and its apply_gradients -- and only the SparseCore ops are
the emulation's CPU kernels. These tests use TF's mid-level object directly,
without any layer of this package, and compare with references computed
here with plain numpy.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_tpu_embed.testing import emulated_tpu

REPLICAS = 2
EMB = tf.tpu.experimental.embedding


def _tables():
    """Two tables of one width and optimizer: TF stacks them."""
    item = EMB.TableConfig(
        vocabulary_size=64, dim=4, name="item", combiner="sum"
    )
    user = EMB.TableConfig(
        vocabulary_size=32, dim=4, name="user", combiner="mean"
    )
    return item, user


def test_v2_reports_a_sparsecore_tpu():
    with emulated_tpu(REPLICAS, embedding_feature="V2") as strategy:
        assert isinstance(strategy, tf.distribute.TPUStrategy)
        hardware = strategy.extended.tpu_hardware_feature
        assert (
            hardware.embedding_feature
            == tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V2
        )
        # What TPUEmbeddingV2 reads for the SparseCores of one chip (v5p).
        assert hardware.num_embedding_devices_per_chip == 4


def test_tpu_embedding_v2_builds_stacked_sharded_tables():
    with emulated_tpu(REPLICAS, embedding_feature="V2") as strategy:
        item, user = _tables()
        with strategy.scope():
            mid_level = EMB.TPUEmbeddingV2(
                {
                    "a": EMB.FeatureConfig(item, output_shape=[8]),
                    "b": EMB.FeatureConfig(user, output_shape=[8]),
                },
                EMB.Adagrad(learning_rate=0.1),
            )
            mid_level.build()
        # TF's stacking: one stacked table for both, 2 chips x 4 SparseCores.
        layouts = mid_level.embedding_layouts
        assert set(layouts) == {"item", "user"}
        assert {lay.stacked_table_name for lay in layouts.values()} == {
            "item_user"
        }
        assert {lay.num_sparse_cores for lay in layouts.values()} == {8}
        variables = mid_level.variables["item_user"]
        assert set(variables) == {"parameters", "accumulators"}
        devices = strategy.extended.worker_devices
        for variable in variables.values():
            # One shard per chip, on that chip's device.
            assert [v.device for v in variable.values] == list(devices)
            assert variable.shape[0] == sum(
                lay.unsharded_padded_shape[0] for lay in layouts.values()
            )
        np.testing.assert_array_equal(
            np.concatenate(
                [v.numpy() for v in variables["accumulators"].values]
            ),
            # Adagrad's initial accumulator, TF's own slot initializer.
            np.float32(0.1),
        )


def test_v2_refuses_an_unknown_feature_name():
    with pytest.raises(ValueError, match="embedding_feature"):
        with emulated_tpu(REPLICAS, embedding_feature="V3"):  # type: ignore
            pass


# ------------------------------------------------------------- lookups

BATCH = 8  # per replica
GLOBAL = BATCH * REPLICAS
DIM = 3  # TF pads the stacked width to 8


def _stacked_tables(optimizer=None):
    """Three tables of one width and optimizer, stacked by TF into one;
    vocabularies that TF pads to the SparseCore count."""
    return {
        "item": EMB.TableConfig(40, DIM, name="item", combiner="sum"),
        "user": EMB.TableConfig(24, DIM, name="user", combiner="mean"),
        "tag": EMB.TableConfig(16, DIM, name="tag", combiner="sqrtn"),
    }


def _feature_configs(tables):
    """A table shared by three features; every input kind; weights."""
    return {
        "item_bag": EMB.FeatureConfig(tables["item"], output_shape=[BATCH]),
        "item_sparse": EMB.FeatureConfig(tables["item"], output_shape=[BATCH]),
        "item_dense": EMB.FeatureConfig(tables["item"], output_shape=[BATCH]),
        "user": EMB.FeatureConfig(tables["user"], output_shape=[BATCH]),
        "tag": EMB.FeatureConfig(tables["tag"], output_shape=[BATCH]),
    }


# feature -> (table, input kind, weighted)
FEATURES = {
    "item_bag": ("item", "ragged", True),
    "item_sparse": ("item", "sparse", False),
    "item_dense": ("item", "dense", False),
    "user": ("user", "ragged", True),
    "tag": ("tag", "sparse", True),
}
VOCAB = {"item": 40, "user": 24, "tag": 16}
COMBINER = {"item": "sum", "user": "mean", "tag": "sqrtn"}


def _global_batch(seed):
    """Per feature, the global batch as lists of (ids, weights) bags:
    empty bags, repeated ids within a bag, ids shared across replicas."""
    rng = np.random.default_rng(seed)
    batch = {}
    for name, (table, kind, weighted) in FEATURES.items():
        bags = []
        for _ in range(GLOBAL):
            length = 1 if kind == "dense" else int(rng.integers(0, 5))
            ids = rng.integers(0, VOCAB[table], length)
            if length > 2:
                ids[1] = ids[0]  # a repeated id in one bag
            weights = (
                rng.uniform(0.5, 2.0, length) if weighted else np.ones(length)
            )
            bags.append((ids, weights.astype(np.float32)))
        batch[name] = bags
    return batch


def _to_tensors(bags, kind):
    """One replica's bags as the input kind TF receives."""
    if kind == "dense":
        return tf.constant([ids[0] for ids, _ in bags], tf.int64), None
    lengths = [len(ids) for ids, _ in bags]
    ids = np.concatenate([ids for ids, _ in bags]).astype(np.int64)
    weights = np.concatenate([w for _, w in bags]).astype(np.float32)
    ragged = tf.RaggedTensor.from_row_lengths(ids, lengths)
    ragged_weights = tf.RaggedTensor.from_row_lengths(weights, lengths)
    if kind == "ragged":
        return ragged, ragged_weights
    return ragged.to_sparse(), ragged_weights.to_sparse()


def _distributed_inputs(strategy, batch):
    def per_replica(context):
        replica = context.replica_id_in_sync_group
        features, weights = {}, {}
        for name, (_, kind, weighted) in FEATURES.items():
            bags = batch[name][replica * BATCH : (replica + 1) * BATCH]
            features[name], weight = _to_tensors(bags, kind)
            weights[name] = weight if weighted else None
        return features, weights

    return strategy.experimental_distribute_values_from_function(per_replica)


def _reference_lookup(tables, batch):
    """`tf.nn.embedding_lookup_sparse`'s rule, on one device, in numpy."""
    result = {}
    for name, (table, _, _) in FEATURES.items():
        rows = []
        for ids, weights in batch[name]:
            weights = weights.astype(np.float64)
            if COMBINER[table] == "mean" and len(ids):
                weights = weights / weights.sum()
            if COMBINER[table] == "sqrtn" and len(ids):
                weights = weights / np.sqrt((weights**2).sum())
            rows.append(
                (tables[table][ids] * weights[:, None]).sum(0)
                if len(ids)
                else np.zeros(DIM)
            )
        result[name] = np.array(rows)
    return result


def _unsharded(mid_level, slot="parameters"):
    """Per table, the stacked, sharded variable read back through TF's own
    unsharding (`tpu_embedding_v3_checkpoint_adapter`, what a checkpoint
    restore into a CPU model uses)."""
    from tensorflow.python.tpu import (
        tpu_embedding_v3_checkpoint_adapter as adapter,
    )

    result = {}
    for name, layout in mid_level.embedding_layouts.items():
        variable = mid_level.variables[layout.stacked_table_name][slot]
        stacked = tf.concat(list(variable.values), 0)
        (value,) = adapter._unshard_from_sc_to_cpu(stacked, [layout])
        result[name] = value.numpy().astype(np.float64)
    return result


def _mid_level(strategy, optimizer, sc_per_chip=4):
    # What a v6e (2 SparseCores per chip) reports; v5p reports 4.
    hardware = strategy.extended.tpu_hardware_feature
    hardware.num_embedding_devices_per_chip = sc_per_chip
    with strategy.scope():
        mid_level = EMB.TPUEmbeddingV2(
            _feature_configs(_stacked_tables()), optimizer
        )
        mid_level.build()
    assert {
        layout.stacked_table_name
        for layout in mid_level.embedding_layouts.values()
    } == {"item_tag_user"}
    return mid_level


def _per_replica_concat(strategy, values):
    return {
        name: np.concatenate(
            [v.numpy() for v in strategy.experimental_local_results(value)]
        )
        for name, value in values.items()
    }


@pytest.mark.parametrize("sc_per_chip", [4, 2])
def test_lookup_equals_one_device(sc_per_chip):
    with emulated_tpu(REPLICAS, embedding_feature="V2") as strategy:
        mid_level = _mid_level(strategy, EMB.SGD(0.1), sc_per_chip)
        batch = _global_batch(seed=0)

        @tf.function
        def lookup(inputs):
            def step(features, weights):
                activations, _ = mid_level(features, weights)
                return activations

            return strategy.run(step, args=inputs)

        activations = _per_replica_concat(
            strategy, lookup(_distributed_inputs(strategy, batch))
        )
        expected = _reference_lookup(_unsharded(mid_level), batch)
    assert set(activations) == set(expected)
    for name in expected:
        assert activations[name].shape == (GLOBAL, DIM), name
        np.testing.assert_allclose(
            activations[name], expected[name], atol=1e-6, err_msg=name
        )
