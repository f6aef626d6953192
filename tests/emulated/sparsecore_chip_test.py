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
    unsharding (`tpu_embedding_v3_utils`, what TF's checkpoint adapter
    uses to restore SparseCore tables into a CPU model)."""
    from tensorflow.python.tpu import tpu_embedding_v3_utils as utils

    result = {}
    for name, layout in mid_level.embedding_layouts.items():
        variable = mid_level.variables[layout.stacked_table_name][slot]
        stacked = tf.concat(list(variable.values), 0)
        padded = utils.unshuffle_from_sc_to_cpu(
            stacked,
            num_sparse_cores=layout.num_sparse_cores,
            offset_in_shard=layout.sparse_core_shard_row_offset,
            size_in_shard=(
                layout.unsharded_padded_shape[0] // layout.num_sparse_cores
            ),
            shard_rotation=layout.sparse_core_shard_rotation,
        )
        value = utils.remove_padding_from_sc(
            padded, tuple(layout.unsharded_shape)
        )
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


# ------------------------------------------------------------- training

STEPS = 3

# name -> (TF optimizer, its slot names, numpy update of one row). The
# numpy rules are the ones `optimization_parameters.proto` documents for
# the TPU embedding engine, written here from that text: Adam without bias
# correction (the proto asks users to fold it into the learning rate), FTRL
# FTRL-Proximal with `beta` added to the denominator.


def _sgd(rate, w, slots, g):
    return w - rate * g, {}


def _adagrad(rate, w, slots, g):
    accumulators = slots["accumulators"] + g * g
    return w - rate * g / np.sqrt(accumulators), {"accumulators": accumulators}


def _adagrad_momentum(rate, w, slots, g, momentum=0.5, exponent=2.0):
    accumulators = slots["accumulators"] + g * g  # beta2 = 1
    scaled = (accumulators + 1e-10) ** (-1.0 / exponent) * g
    momenta = momentum * slots["momenta"] + scaled
    return w - rate * momenta, {
        "accumulators": accumulators,
        "momenta": momenta,
    }


def _adam(rate, w, slots, g, beta_1=0.9, beta_2=0.99, epsilon=1e-3):
    momenta = beta_1 * slots["momenta"] + (1 - beta_1) * g
    velocities = beta_2 * slots["velocities"] + (1 - beta_2) * g * g
    # sum_inside_sqrt=True, TF's default
    update = momenta / np.sqrt(velocities + epsilon**2)
    return w - rate * update, {"momenta": momenta, "velocities": velocities}


def _ftrl(rate, w, slots, g, l1=0.01, l2=0.02, beta=0.3, power=-0.5):
    accumulators = slots["accumulators"] + g * g
    sigma = (accumulators ** (-power) - slots["accumulators"] ** (-power)) / (
        rate
    )
    linears = slots["linears"] + g - sigma * w
    quadratic = accumulators ** (-power) / rate + beta / rate + 2 * l2
    new = np.where(
        np.abs(linears) > l1, (np.sign(linears) * l1 - linears) / quadratic, 0
    )
    return new, {"accumulators": accumulators, "linears": linears}


OPTIMIZERS = {
    "sgd": (lambda: EMB.SGD(0.5), _sgd, 0.5),
    "adagrad": (lambda: EMB.Adagrad(0.3), _adagrad, 0.3),
    "adagrad_momentum": (
        lambda: EMB.AdagradMomentum(0.2, momentum=0.5),
        _adagrad_momentum,
        0.2,
    ),
    "adam": (
        lambda: EMB.Adam(0.05, beta_1=0.9, beta_2=0.99, epsilon=1e-3),
        _adam,
        0.05,
    ),
    "ftrl": (
        lambda: EMB.FTRL(
            0.4,
            l1_regularization_strength=0.01,
            l2_regularization_strength=0.02,
            beta=0.3,
        ),
        _ftrl,
        0.4,
    ),
}


def _targets():
    rng = np.random.default_rng(7)
    return {name: rng.normal(size=(GLOBAL, DIM)) for name in FEATURES}


def _reference_step(tables, slots, batch, targets, rule, rate):
    """One step on one device: the loss sum((a - t)^2) / GLOBAL, the
    gradient of every id summed per row over the global batch, the
    optimizer applied to each row that was looked up."""
    activations = _reference_lookup(tables, batch)
    gradients = {t: np.zeros_like(v) for t, v in tables.items()}
    touched = {t: set() for t in tables}
    for name, (table, _, _) in FEATURES.items():
        d_activation = 2 * (activations[name] - targets[name]) / GLOBAL
        for sample, (ids, weights) in enumerate(batch[name]):
            weights = weights.astype(np.float64)
            if COMBINER[table] == "mean" and len(ids):
                weights = weights / weights.sum()
            if COMBINER[table] == "sqrtn" and len(ids):
                weights = weights / np.sqrt((weights**2).sum())
            for row, weight in zip(ids, weights):
                gradients[table][row] += weight * d_activation[sample]
                touched[table].add(int(row))
    for table in tables:
        for row in touched[table]:
            row_slots = {s: v[table][row] for s, v in slots.items()}
            new, new_slots = rule(
                rate, tables[table][row], row_slots, gradients[table][row]
            )
            tables[table][row] = new
            for slot, value in new_slots.items():
                slots[slot][table][row] = value


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_training_equals_one_device(optimizer):
    make, rule, rate = OPTIMIZERS[optimizer]
    targets = _targets()
    with emulated_tpu(REPLICAS, embedding_feature="V2") as strategy:
        mid_level = _mid_level(strategy, make())
        slot_names = sorted(
            set(mid_level.variables["item_tag_user"]) - {"parameters"}
        )
        tables = _unsharded(mid_level)
        slots = {slot: _unsharded(mid_level, slot) for slot in slot_names}
        initial = {name: value.copy() for name, value in tables.items()}

        @tf.function
        def train(inputs, targets):
            def step(inputs, targets):
                features, weights = inputs
                activations, preserved = mid_level(features, weights)
                gradients = {
                    name: 2 * (activations[name] - targets[name]) / GLOBAL
                    for name in activations
                }
                mid_level.apply_gradients(gradients, preserved)

            strategy.run(step, args=(inputs, targets))

        per_replica_targets = (
            strategy.experimental_distribute_values_from_function(
                lambda context: {
                    name: tf.constant(
                        value[
                            context.replica_id_in_sync_group * BATCH : (
                                context.replica_id_in_sync_group + 1
                            )
                            * BATCH
                        ],
                        tf.float32,
                    )
                    for name, value in targets.items()
                }
            )
        )
        for step in range(STEPS):
            batch = _global_batch(seed=100 + step)
            train(_distributed_inputs(strategy, batch), per_replica_targets)
            _reference_step(tables, slots, batch, targets, rule, rate)
        trained = _unsharded(mid_level)
        trained_slots = {s: _unsharded(mid_level, s) for s in slot_names}
    for table, value in trained.items():
        assert np.abs(value - initial[table]).max() > 1e-2, table
        np.testing.assert_allclose(
            value, tables[table], atol=1e-5, rtol=0, err_msg=table
        )
    for slot, values in trained_slots.items():
        for table, value in values.items():
            np.testing.assert_allclose(
                value,
                slots[slot][table],
                atol=1e-5,
                rtol=0,
                err_msg=f"{slot} of {table}",
            )


# ---------------------------------------------------------- checkpoints


def test_checkpoint_restores_on_the_emulation_and_in_tf_serving(tmp_path):
    """TF's own checkpoint of the trained, stacked and sharded tables
    restores into a new `TPUEmbeddingV2` (tables and slots) and, on CPU,
    into TF's `TPUEmbeddingForServing`, which unstacks them per table from
    the layouts TF saved: both equal one numpy training step."""
    make, rule, rate = OPTIMIZERS["adagrad"]
    targets = _targets()
    batch = _global_batch(seed=5)
    with emulated_tpu(REPLICAS, embedding_feature="V2") as strategy:
        mid_level = _mid_level(strategy, make())
        tables = _unsharded(mid_level)
        slots = {"accumulators": _unsharded(mid_level, "accumulators")}

        @tf.function
        def train(inputs):
            def step(features, weights):
                activations, preserved = mid_level(features, weights)
                replica = tf.distribute.get_replica_context()
                first = replica.replica_id_in_sync_group * BATCH
                gradients = {
                    name: 2
                    * (
                        activations[name]
                        - tf.constant(targets[name], tf.float32)[
                            first : first + BATCH
                        ]
                    )
                    / GLOBAL
                    for name in activations
                }
                mid_level.apply_gradients(gradients, preserved)

            strategy.run(step, args=inputs)

        train(_distributed_inputs(strategy, batch))
        _reference_step(tables, slots, batch, targets, rule, rate)
        path = tf.train.Checkpoint(embedding=mid_level).save(
            str(tmp_path / "ckpt")
        )
        with strategy.scope():
            restored = EMB.TPUEmbeddingV2(
                _feature_configs(_stacked_tables()), make()
            )
        tf.train.Checkpoint(embedding=restored).restore(path)
        restored.build()
        on_tpu = _unsharded(restored)
        on_tpu_slots = _unsharded(restored, "accumulators")
    serving = EMB.TPUEmbeddingForServing(
        _feature_configs(_stacked_tables()), make()
    )
    tf.train.Checkpoint(embedding=serving).restore(path).expect_partial()
    serving.build()
    on_cpu = {
        table.name: variable.numpy()
        for table, variable in serving.embedding_tables.items()
    }
    assert set(on_cpu) == set(tables) == set(on_tpu)
    for name, expected in tables.items():
        assert on_cpu[name].shape == (VOCAB[name], DIM)
        np.testing.assert_allclose(on_cpu[name], expected, atol=1e-5)
        np.testing.assert_allclose(on_tpu[name], expected, atol=1e-5)
        np.testing.assert_allclose(
            on_tpu_slots[name], slots["accumulators"][name], atol=1e-5
        )
