"""The TPU embedding engine path, against a recording STAND-IN (not a TPU).

Every test here runs `keras_tpu_embed` under a `OneDeviceStrategy` that
`tests/engine_stand_in.py` declares to be a TPU with an embedding engine,
with `RecordingTPUEmbedding` in place of TF's mid-level object. They prove
the protocol the package drives (one object, one named enqueue of every
feature per step, its dequeue, one `apply_gradients`), the errors, and the
checkpoint layout. What only a TPU can prove (the engine's own numerics,
TF's graph rewrites, speed) is left to `examples/tpu_smoke.py`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.lookup.devices import LookupDevice
from keras_tpu_embed.tpu import hardware as tpu_hardware
from tests.engine_stand_in import RecordingTPUEmbedding
from tests.engine_stand_in import StandInTPU

N, BATCH = 32, 8
FEATURES = [
    "hist_shared_embedding",
    "item_shared_embedding",
    "tags_weighted_by_tag_w_embedding",
    "user_embedding",
]


@pytest.fixture
def tpu(monkeypatch):
    return StandInTPU(monkeypatch)


def _columns():
    user = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4, combiner="sum"
    )
    tags = kte.embedding_column(
        kte.weighted_categorical_column(
            kte.categorical_column_with_identity("tags", 30), "tag_w"
        ),
        3,
        combiner="sqrtn",
    )
    shared = kte.shared_embedding_columns(
        [
            kte.categorical_column_with_identity("item", 50),
            kte.sequence_categorical_column_with_identity("hist", 50),
        ],
        4,
        max_sequence_lengths=[0, 3],
    )
    return [user, tags], shared


def _inputs():
    return {
        "user": keras.Input((1,), dtype="int64", name="user"),
        "tags": keras.Input((None,), dtype="int64", sparse=True, name="tags"),
        "tag_w": keras.Input(
            (None,), dtype="float32", sparse=True, name="tag_w"
        ),
        "item": keras.Input((None,), dtype="int64", sparse=True, name="item"),
        "hist": keras.Input((None,), dtype="int64", sparse=True, name="hist"),
    }


def build_model(config=None, shared_config=None):
    columns, shared = _columns()
    config = config or kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.5))
    inputs = _inputs()
    a = kte.TPUEmbeddingLayer(columns, config=config, name="embed")(inputs)
    b = kte.SharedTPUEmbedding(
        shared, config=shared_config or config, name="shared"
    )(inputs)
    x = keras.layers.Concatenate()(
        [
            a["user_embedding"],
            a["tags_weighted_by_tag_w_embedding"],
            b["item_shared_embedding"],
            keras.ops.mean(b["hist_shared_embedding"], axis=1),
        ]
    )
    out = keras.layers.Dense(
        1, activation="sigmoid", name="head", kernel_initializer="ones"
    )(x)
    model = keras.Model(inputs, out)
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    return model


def _sparse(rng, vocab, width):
    indices, values = [], []
    for row in range(N):
        for position in range(rng.integers(1, width + 1)):
            indices.append([row, position])
            values.append(rng.integers(0, vocab))
    return tf.SparseTensor(
        np.array(indices, np.int64), np.array(values, np.int64), [N, width]
    )


def examples(seed=0):
    rng = np.random.default_rng(seed)
    tags = _sparse(rng, 30, 4)
    weights = rng.uniform(0.5, 2.0, tags.values.shape[0]).astype(np.float32)
    features = {
        "user": rng.integers(0, 20, (N, 1)).astype(np.int64),
        "tags": tags,
        "tag_w": tf.SparseTensor(tags.indices, weights, tags.dense_shape),
        "item": _sparse(rng, 50, 1),
        "hist": _sparse(rng, 50, 5),
    }
    labels = rng.integers(0, 2, (N, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels))


def test_fit_evaluate_predict_drive_one_engine(tpu):
    with tpu.strategy.scope():
        model = build_model()
    data = kte.distribute_dataset(tpu.strategy, examples(), BATCH)
    model.fit(data, epochs=2, verbose=0)
    [engine] = tpu.built_objects
    # One named enqueue of every feature of both layers, its dequeue and
    # one apply_gradients, traced once and run once per step (4 per epoch).
    assert engine.events == [
        ("enqueue", "keras_tpu_embed_step_1", tuple(FEATURES)),
        ("dequeue", "keras_tpu_embed_step_1", ()),
        ("apply_gradients", "keras_tpu_embed_step_1", ()),
    ]
    assert {k: int(v) for k, v in engine.runs.items()} == {
        "enqueue": 8,
        "dequeue": 8,
        "apply_gradients": 8,
    }
    model.evaluate(data, verbose=0)
    predictions = model.predict(data, verbose=0)
    assert predictions.shape == (N, 1)
    assert {k: int(v) for k, v in engine.runs.items()} == {
        "enqueue": 16,
        "dequeue": 16,
        "apply_gradients": 8,  # evaluate and predict send no gradients
    }
    for layer in (model.get_layer("embed"), model.get_layer("shared")):
        assert layer.engine.mid_level is engine
        assert int(layer.embedding_step.numpy()) == 8
        assert layer.local_table_specs == []


def test_evaluate_with_another_batch_size_says_why_and_what_to_do(tpu):
    with tpu.strategy.scope():
        model = build_model()
    model.fit(
        kte.distribute_dataset(tpu.strategy, examples(), BATCH),
        epochs=1,
        verbose=0,
    )
    smaller = kte.distribute_dataset(tpu.strategy, examples(), BATCH // 2)
    for run in (model.evaluate, model.predict):
        with pytest.raises(
            ValueError,
            match=r"per-replica batch of 8 .* this step feeds 4\b.* same "
            r"global_batch_size",
        ):
            run(smaller, verbose=0)


@pytest.fixture
def mixed_bfloat16():
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    yield
    keras.config.set_dtype_policy(policy)


def test_mixed_precision_keeps_input_weights_float32(tpu, mixed_bfloat16):
    # Keras autocasts float inputs to the compute dtype; the weights must
    # reach the engine's enqueue float32 and unchanged (the stand-in refuses
    # a bfloat16 or computed weight).
    with tpu.strategy.scope():
        model = build_model()
    assert model.get_layer("embed").compute_dtype == "bfloat16"
    data = kte.distribute_dataset(tpu.strategy, examples(), BATCH)
    model.fit(data, epochs=1, verbose=0)
    [engine] = tpu.built_objects
    assert int(engine.runs["apply_gradients"]) == N // BATCH


def test_mixed_precision_host_path_combines_float32_weights(mixed_bfloat16):
    columns, _ = _columns()
    layer = kte.TPUEmbeddingLayer(columns[1:])  # the weighted column
    features, _ = next(iter(examples().batch(N)))
    seen = []
    original = layer._inputs.features

    def record(inputs):
        seen.append(inputs["tag_w"].dtype)
        return original(inputs)

    layer._inputs.features = record
    layer({"tags": features["tags"], "tag_w": features["tag_w"]})
    assert seen == [tf.float32]


def test_sparse_core_builds_its_own_engine_and_refuses_by_column(
    monkeypatch,
):
    # SparseCore gets the V2 engine (tests/emulated/sparsecore_*_test.py
    # run it); what V2 cannot honour is refused at build, by column.
    from keras_tpu_embed.lookup.sparsecore import SparseCoreEngine

    tpu = StandInTPU(monkeypatch, tpu_hardware.EmbeddingHardware.V2)
    with tpu.strategy.scope():
        model = build_model()
    assert isinstance(model.get_layer("embed").engine, SparseCoreEngine)
    # TPUEmbeddingV2 is made at the first step, when the batch is known.
    assert model.get_layer("embed").engine.mid_level is None
    tpu = StandInTPU(monkeypatch, tpu_hardware.EmbeddingHardware.V2)
    with tpu.strategy.scope():
        with pytest.raises(ValueError) as raised:
            build_model(kte.EmbeddingConfig(clipping_limit=1.0))
    message = str(raised.value)
    for needed in (
        "SparseCore",
        "TPUEmbeddingV2",
        "['tags_weighted_by_tag_w_embedding']",
        "['user_embedding']",
        "clipping_limit",
        "embedding_lookup_device='tpu_tensor_core'",
    ):
        assert needed in message
    assert tpu.built_objects == []


def test_sparse_core_tensor_core_columns_still_train(monkeypatch):
    # What the refusal recommends works on the same hardware.
    tpu = StandInTPU(monkeypatch, tpu_hardware.EmbeddingHardware.V2)
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20),
        4,
        embedding_lookup_device="tpu_tensor_core",
        tensor_core_shape=[None, 1],
    )
    with tpu.strategy.scope():
        model = _single_table_model(column, kte.EmbeddingConfig())
    layer = model.get_layer("embed")
    assert layer.engine is None
    before = layer.table_variable("user").numpy()
    model.fit(
        kte.distribute_dataset(tpu.strategy, _user_examples(), 8),
        epochs=1,
        verbose=0,
    )
    assert np.abs(layer.table_variable("user").numpy() - before).max() > 0
    assert tpu.built_objects == []


def test_why_sparse_core_is_made_at_the_first_step():
    """TF's TPUEmbeddingV2 constructor stacks tables by sample count, the
    product of each FeatureConfig.output_shape (tpu_embedding_v3.py,
    _stack_tables_with_same_table_dim_and_optimizer), which the configs of
    `to_tpu_feature_configs` leave unset: so SparseCoreEngine makes it at
    the first step, with the per-replica batch. Run on CPU with TF's own
    function."""
    from tensorflow.python.tpu import tpu_embedding_v3
    from tensorflow.python.util import nest

    columns, shared = _columns()
    features = kte.to_tpu_feature_configs(columns + shared)
    tables = list({id(f.table): f.table for f in features.values()}.values())
    with pytest.raises(ValueError, match="unknown rank"):
        tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer(
            tables,
            nest.flatten_with_joined_string_paths(features),
            8,  # replicas
            4,  # SparseCores per chip
            None,
        )


def test_tables_restore_across_tpu_and_cpu_both_ways(
    tpu, tmp_path, monkeypatch
):
    with tpu.strategy.scope():
        tpu_model = build_model()
    data = kte.distribute_dataset(tpu.strategy, examples(), BATCH)
    assert tpu.built_objects == []  # the engine is built by the first step
    tpu_model.fit(data, epochs=1, verbose=0)
    [engine] = tpu.built_objects
    trained = {c.name: t.numpy() for c, t in engine.embedding_tables.items()}
    path = tf.train.Checkpoint(
        embedding=kte.engine_checkpoint(tpu_model)
    ).write(str(tmp_path / "tpu"))

    cpu_model = build_model()
    status = tf.train.Checkpoint(embedding=kte.engine_checkpoint(cpu_model))
    status.read(path).assert_existing_objects_matched()
    for table, values in trained.items():
        layer = "shared" if table == "hist_item_shared_embedding" else "embed"
        np.testing.assert_array_equal(
            cpu_model.get_layer(layer).table_variable(table).numpy(), values
        )
    cpu_model.get_layer("head").set_weights(
        tpu_model.get_layer("head").get_weights()
    )
    batches = list(examples().batch(BATCH))
    on_cpu = np.concatenate([cpu_model.predict_on_batch(x) for x, _ in batches])
    on_tpu = tpu_model.predict(data, verbose=0)
    np.testing.assert_allclose(on_tpu, on_cpu, atol=1e-6)

    # And back: CPU tables into a fresh TPU model, before its first step.
    fresh = StandInTPU(monkeypatch)
    with fresh.strategy.scope():
        second = build_model()
    tf.train.Checkpoint(embedding=kte.engine_checkpoint(second)).read(
        path
    ).assert_existing_objects_matched()
    second.get_layer("head").set_weights(
        tpu_model.get_layer("head").get_weights()
    )
    again = second.predict(
        kte.distribute_dataset(fresh.strategy, examples(), BATCH), verbose=0
    )
    np.testing.assert_allclose(again, on_cpu, atol=1e-6)


def test_dense_batch_by_one_ids_give_batch_by_dim(tpu):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4
    )
    with tpu.strategy.scope():
        layer = kte.TPUEmbeddingLayer([column])
        inputs = {"user": keras.Input((1,), dtype="int64", name="user")}
        model = keras.Model(inputs, layer(inputs)["user_embedding"])
    ids = tf.constant([[3], [5], [7]], tf.int64)
    out = model.predict(
        kte.distribute_dataset(
            tpu.strategy,
            tf.data.Dataset.from_tensor_slices({"user": ids}),
            3,
        ),
        verbose=0,
    )
    # TF's dequeue gives [batch, dim] for [batch, 1] ids (the stand-in uses
    # TF's shape logic); the layer passes it through unchanged.
    assert out.shape == (3, 4)
    cpu = kte.TPUEmbeddingLayer([column])({"user": ids})["user_embedding"]
    assert cpu.shape == (3, 4)


def test_dense_ids_of_a_sequence_feature_are_refused_at_trace_time(tpu):
    # TF's engine would combine them into [batch, dim] (one id per example).
    column = kte.embedding_column(
        kte.sequence_categorical_column_with_identity("hist", 20),
        4,
        max_sequence_length=3,
    )
    with tpu.strategy.scope():
        layer = kte.TPUEmbeddingLayer([column])
        inputs = {"hist": keras.Input((1,), dtype="int64", name="hist")}
        model = keras.Model(inputs, layer(inputs)["hist_embedding"])
    data = kte.distribute_dataset(
        tpu.strategy,
        tf.data.Dataset.from_tensor_slices(
            {"hist": tf.constant([[3], [5], [7]], tf.int64)}
        ),
        3,
    )
    with pytest.raises(ValueError, match="'hist_embedding' reaches the TPU"):
        model.predict(data, verbose=0)


def test_translation_is_the_engine_config(tpu):
    with tpu.strategy.scope():
        model = build_model()
    layers = [model.get_layer("embed"), model.get_layer("shared")]
    built = layers[0].engine.mid_level._feature_config
    columns, shared = _columns()
    expected = {}
    for cols in (columns, shared):
        expected.update(kte.to_tpu_feature_configs(cols))
    assert sorted(built) == sorted(expected) == FEATURES
    for name, feature in built.items():
        want = expected[name]
        assert feature.name == want.name
        assert feature.max_sequence_length == want.max_sequence_length
        for field in ("name", "vocabulary_size", "dim", "combiner"):
            assert getattr(feature.table, field) == getattr(want.table, field)
    # Shared columns share one TableConfig object, as TF requires.
    assert built["item_shared_embedding"].table is (
        built["hist_shared_embedding"].table
    )


def test_layer_built_outside_the_strategy_fails_inside(tpu):
    columns, _ = _columns()
    layer = kte.TPUEmbeddingLayer(columns[:1])
    layer({"user": tf.constant([[1]], tf.int64)})  # built on CPU
    with pytest.raises(RuntimeError, match="built outside TPUStrategy"):
        tpu.strategy.run(
            tf.function(lambda: layer({"user": tf.constant([[1]], tf.int64)}))
        )


def test_layer_built_inside_the_strategy_fails_outside(tpu):
    with tpu.strategy.scope():
        model = build_model()
    features, _ = next(iter(examples().batch(BATCH)))
    with pytest.raises(RuntimeError, match="called outside that strategy"):
        model(features)
    with pytest.raises(ValueError, match="held by the TPU embedding engine"):
        model.get_layer("embed").table_variable("user")


def test_a_second_engine_object_fails_with_advice(tpu):
    with tpu.strategy.scope():
        columns, _ = _columns()
        theirs = RecordingTPUEmbedding(kte.to_tpu_feature_configs(columns))
        theirs.build()
        model = build_model()
    data = kte.distribute_dataset(tpu.strategy, examples(), BATCH)
    with pytest.raises(RuntimeError, match="do not build your own"):
        model.fit(data, epochs=1, verbose=0)


def test_a_second_model_after_training_fails_at_build(tpu):
    with tpu.strategy.scope():
        model = build_model()
    model.fit(
        kte.distribute_dataset(tpu.strategy, examples(), BATCH),
        epochs=1,
        verbose=0,
    )
    with tpu.strategy.scope():
        with pytest.raises(RuntimeError, match="ran its first step"):
            build_model()


def test_layers_that_cannot_share_the_engine_fail_at_build(tpu, monkeypatch):
    columns, shared = _columns()
    with tpu.strategy.scope():
        with pytest.raises(ValueError, match="pipeline_execution"):
            build_model(
                shared_config=kte.EmbeddingConfig(
                    pipeline_execution_with_tensor_core=True
                )
            )
    fresh = StandInTPU(monkeypatch)
    with fresh.strategy.scope():
        inputs = _inputs()
        kte.TPUEmbeddingLayer(columns)(
            {k: inputs[k] for k in ("user", "tags", "tag_w")}
        )
        with pytest.raises(
            ValueError,
            match=r"'tpu_embedding_layer\w*' does not receive "
            r"\['hist', 'item'\]",
        ):
            kte.SharedTPUEmbedding(shared)(inputs)
    fresh = StandInTPU(monkeypatch)
    with fresh.strategy.scope():
        inputs = _inputs()
        kte.SharedTPUEmbedding(shared[:1])(inputs)
        with pytest.raises(ValueError, match="one SharedTPUEmbedding"):
            kte.SharedTPUEmbedding(shared[1:])(inputs)


@pytest.mark.parametrize(
    "config, kwargs, message",
    [
        (kte.EmbeddingConfig(partition_strategy="mod"), {}, "'mod'"),
        (None, {"return_sequence_lengths": True}, "no sequence lengths"),
    ],
)
def test_engine_rejects_what_it_cannot_do(tpu, config, kwargs, message):
    _, shared = _columns()
    with tpu.strategy.scope():
        with pytest.raises(ValueError, match=message):
            kte.SharedTPUEmbedding(shared, config=config, **kwargs)(_inputs())


def test_tpu_without_engine_falls_back_to_tensor_core(monkeypatch):
    tpu = StandInTPU(monkeypatch, tpu_hardware.EmbeddingHardware.NO_ENGINE)
    shaped = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20),
        4,
        tensor_core_shape=[None, 2],
    )
    with tpu.strategy.scope():
        layer = kte.TPUEmbeddingLayer([shaped])
        layer.build({"user": (None, 2)})
    assert layer.engine is None
    assert [t.name for t in layer.local_table_specs] == ["user"]
    assert layer._training_devices == {"user": LookupDevice.TPU_TENSOR_CORE}
    unshaped = kte.embedding_column(
        kte.categorical_column_with_identity("item", 20), 4
    )
    with tpu.strategy.scope():
        with pytest.raises(ValueError, match=r"\['item_embedding'\] have no"):
            kte.TPUEmbeddingLayer([unshaped]).build({"item": (None, 2)})


def test_export_of_the_tpu_built_model_says_how(tpu, tmp_path):
    with tpu.strategy.scope():
        model = build_model()
    with pytest.raises((RuntimeError, ValueError), match="engine_checkpoint"):
        kte.export_saved_model(model, str(tmp_path / "serving"))


def _single_table_model(column, config):
    inputs = {"user": keras.Input((1,), dtype="int64", name="user")}
    for key in config.feature_to_config_dict or {}:
        inputs[key] = keras.Input((1,), dtype="int64", name=key)
    outputs = kte.TPUEmbeddingLayer([column], config=config, name="embed")(
        inputs
    )
    x = keras.layers.Concatenate()([outputs[k] for k in sorted(outputs)])
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _user_examples(extra=()):
    ids = np.arange(16, dtype=np.int64)[:, None] % 20
    features = {"user": ids, **{key: ids % 10 for key in extra}}
    return tf.data.Dataset.from_tensor_slices((features, np.ones((16, 1))))


@pytest.mark.parametrize(
    "column_kwargs, config_kwargs, moves",
    [
        ({}, {}, True),
        ({"learning_rate_fn": lambda step: 0.0}, {}, False),
        ({}, {"gradient_multiplier_fn": lambda step: 0.0}, False),
    ],
)
def test_learning_rate_and_multiplier_reach_the_engine(
    tpu, column_kwargs, config_kwargs, moves
):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4, **column_kwargs
    )
    config = kte.EmbeddingConfig(
        optimizer=kte.optimizers.SGD(0.5), **config_kwargs
    )
    with tpu.strategy.scope():
        model = _single_table_model(column, config)
    data = kte.distribute_dataset(tpu.strategy, _user_examples(), 8)
    model.fit(data, epochs=1, verbose=0)  # builds the engine
    [engine] = tpu.built_objects
    [table] = engine.embedding_tables.values()
    before = table.numpy()
    model.fit(data, epochs=1, verbose=0)
    assert (np.abs(table.numpy() - before).max() > 0) == moves


def test_users_own_feature_configs_pass_through(tpu):
    raw = tf.tpu.experimental.embedding.FeatureConfig(
        table=tf.tpu.experimental.embedding.TableConfig(
            vocabulary_size=10, dim=2, name="their_table"
        ),
        name="their_feature",
    )
    config = kte.EmbeddingConfig(
        feature_to_config_dict={"their_feature": raw},
        pipeline_execution_with_tensor_core=True,
    )
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4
    )
    with tpu.strategy.scope():
        model = _single_table_model(column, config)
    layer = model.get_layer("embed")
    assert layer.compute_output_spec({})["their_feature"].shape == (None, 2)
    data = kte.distribute_dataset(
        tpu.strategy, _user_examples(["their_feature"]), 8
    )
    model.fit(data, epochs=1, verbose=0)
    [engine] = tpu.built_objects
    assert engine._feature_config["their_feature"] is raw
    assert engine.pipeline_execution_with_tensor_core is True
    assert engine.events[0][2] == ("their_feature", "user_embedding")


def test_a_layer_with_engine_and_local_tables_counts_one_step_per_step(tpu):
    # learning_rate_fns read embedding_step; counted twice per step, every
    # schedule would run twice as fast. This one trains for 4 steps.
    on_engine = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20),
        4,
        learning_rate_fn=lambda step: tf.where(step < 4, 0.5, 0.0),
    )
    on_tensor_core = kte.embedding_column(
        kte.categorical_column_with_identity("item", 20),
        4,
        embedding_lookup_device="tpu_tensor_core",
        tensor_core_shape=[None, 1],
    )
    with tpu.strategy.scope():
        inputs = {
            "user": keras.Input((1,), dtype="int64", name="user"),
            "item": keras.Input((1,), dtype="int64", name="item"),
        }
        layer = kte.TPUEmbeddingLayer(
            [on_engine, on_tensor_core], output="concat", name="embed"
        )
        model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
        model.compile(optimizer="sgd", loss="mse")
    assert [t.name for t in layer.local_table_specs] == ["item"]
    assert layer.engine is not None
    ids = np.arange(16, dtype=np.int64)[:, None] % 20
    data = kte.distribute_dataset(
        tpu.strategy,
        tf.data.Dataset.from_tensor_slices(
            ({"user": ids, "item": ids}, np.ones((16, 1), np.float32))
        ),
        8,
    )
    snapshots = []
    for epoch in range(3):  # 2 steps per epoch
        model.fit(data, epochs=1, verbose=0)
        [engine] = tpu.built_objects
        [table] = engine.embedding_tables.values()
        snapshots.append(table.numpy())
        assert int(layer.embedding_step.numpy()) == 2 * (epoch + 1)
    moved = [
        bool(np.abs(b - a).max() > 0) for a, b in zip(snapshots, snapshots[1:])
    ]
    # Steps 0-3 train (epochs 1 and 2), steps 4-5 do not (epoch 3).
    assert moved == [True, False]


def _vocabulary_model():
    """Out-of-vocabulary strings without OOV buckets: the preprocessor's -1."""
    country = kte.embedding_column(
        kte.weighted_categorical_column(
            kte.categorical_column_with_vocabulary_list(
                "country", ["us", "fr", "de"]
            ),
            "country_w",
        ),
        4,
        combiner="sum",
    )
    pre = kte.FeaturePreprocessor([country])
    inputs = pre.keras_inputs()
    x = kte.TPUEmbeddingLayer(
        [country],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.5)),
        output="concat",
        name="embed",
    )(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(x))
    model.compile(optimizer="sgd", loss="mse")
    return pre, model


def _country_examples():
    countries = np.array(
        [["us", "xx"], ["xx", "yy"], ["fr", "de"], ["zz", "fr"]] * 4
    )
    weights = np.linspace(0.5, 2.0, countries.size, dtype=np.float32)
    features = {
        "country": countries,
        "country_w": weights.reshape(countries.shape),
    }
    return tf.data.Dataset.from_tensor_slices(
        (features, np.ones((len(countries), 1), np.float32))
    )


def test_out_of_vocabulary_ids_are_dropped_before_the_engine(tpu, tmp_path):
    with tpu.strategy.scope():
        pre, tpu_model = _vocabulary_model()
    data = kte.distribute_dataset(
        tpu.strategy, _country_examples(), 8, preprocessor=pre
    )
    tpu_model.fit(data, epochs=2, verbose=0)  # no -1 reached the stand-in
    on_tpu = tpu_model.predict(data, verbose=0)

    # The same tables on the host path, which skips -1 itself.
    path = tf.train.Checkpoint(
        embedding=kte.engine_checkpoint(tpu_model)
    ).write(str(tmp_path / "tables"))
    _, cpu_model = _vocabulary_model()
    tf.train.Checkpoint(embedding=kte.engine_checkpoint(cpu_model)).read(
        path
    ).assert_existing_objects_matched()
    cpu_model.get_layer("head").set_weights(
        tpu_model.get_layer("head").get_weights()
    )
    on_cpu = np.concatenate(
        [
            cpu_model.predict_on_batch(pre(x))
            for x, _ in _country_examples().batch(8)
        ]
    )
    np.testing.assert_allclose(on_tpu, on_cpu, atol=1e-6)


def test_negative_dense_ids_for_the_engine_fail_on_the_host(tpu):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4
    )
    with tpu.strategy.scope():
        model = _single_table_model(column, kte.EmbeddingConfig())
    features = {"user": np.array([[1], [-1], [3], [4]], np.int64)}
    data = kte.distribute_dataset(
        tpu.strategy,
        tf.data.Dataset.from_tensor_slices((features, np.ones((4, 1)))),
        4,
    )
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Feature .*user.* has negative ids, .* dense ids",
    ):
        model.fit(data, epochs=1, verbose=0)
