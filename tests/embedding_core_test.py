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
from keras_tpu_embed.lookup.embedding_core import SharedEngine
from keras_tpu_embed.tpu import hardware as tpu_hardware
from tests.engine_models import BATCH
from tests.engine_models import FEATURES
from tests.engine_models import N
from tests.engine_models import build_model
from tests.engine_models import engine_columns
from tests.engine_models import engine_inputs
from tests.engine_models import examples
from tests.engine_models import single_table_model
from tests.engine_models import user_examples
from tests.engine_stand_in import StandInTPU


@pytest.fixture
def tpu(monkeypatch):
    return StandInTPU(monkeypatch)


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
    columns, _ = engine_columns()
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
        model = single_table_model(column, kte.EmbeddingConfig())
    layer = model.get_layer("embed")
    assert layer.engine is None
    before = layer.table_variable("user").numpy()
    model.fit(
        kte.distribute_dataset(tpu.strategy, user_examples(), 8),
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

    columns, shared = engine_columns()
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


def test_translation_is_the_engine_config(tpu):
    with tpu.strategy.scope():
        model = build_model()
    layers = [model.get_layer("embed"), model.get_layer("shared")]
    built = layers[0].engine.mid_level._feature_config
    columns, shared = engine_columns()
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
    columns, _ = engine_columns()
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
    columns, shared = engine_columns()
    with tpu.strategy.scope():
        with pytest.raises(ValueError, match="pipeline_execution"):
            build_model(
                shared_config=kte.EmbeddingConfig(
                    pipeline_execution_with_tensor_core=True
                )
            )
    fresh = StandInTPU(monkeypatch)
    with fresh.strategy.scope():
        inputs = engine_inputs()
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
        inputs = engine_inputs()
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
    _, shared = engine_columns()
    with tpu.strategy.scope():
        with pytest.raises(ValueError, match=message):
            kte.SharedTPUEmbedding(shared, config=config, **kwargs)(
                engine_inputs()
            )


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


def test_export_before_the_engines_first_step_says_why(tpu, tmp_path):
    """The engine's tables exist from its first step on (exported from
    the TPU after it: tests/emulated/export_trained_test.py)."""
    with tpu.strategy.scope():
        model = build_model()
    with pytest.raises(RuntimeError, match="run one step .* exporting"):
        kte.export_saved_model(model, str(tmp_path / "serving"))


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
        model = single_table_model(column, config)
    layer = model.get_layer("embed")
    assert layer.compute_output_spec({})["their_feature"].shape == (None, 2)
    data = kte.distribute_dataset(
        tpu.strategy, user_examples(["their_feature"]), 8
    )
    model.fit(data, epochs=1, verbose=0)
    [engine] = tpu.built_objects
    assert engine._feature_config["their_feature"] is raw
    assert engine.pipeline_execution_with_tensor_core is True
    assert engine.events[0][2] == ("their_feature", "user_embedding")


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
        model = single_table_model(column, kte.EmbeddingConfig())
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


def _register(engine, columns, config=None, **kwargs):
    step = keras.Variable(0, dtype="int64", trainable=False)
    trigger = keras.Variable(0.0, trainable=True)
    return engine.register(
        "shared",
        columns,
        None,
        config=config or kte.EmbeddingConfig(),
        step=step,
        trigger=trigger,
        counts_step=True,
        **kwargs,
    )


def test_the_engine_refuses_to_return_sequence_lengths():
    _, shared = engine_columns()
    engine = SharedEngine(tpu_hardware.EmbeddingHardware.V1)
    with pytest.raises(
        ValueError,
        match=r"^SharedTPUEmbedding 'shared': the TPU embedding engine "
        r"returns no sequence lengths, .* sequence columns "
        r"\['hist_shared_embedding'\] on it\. Feed the lengths",
    ):
        _register(
            engine,
            shared,
            return_sequence_lengths=True,
            layer_description="SharedTPUEmbedding 'shared'",
        )
    assert engine.layer_names == []  # refused before joining
    # Without sequence columns there are no lengths to refuse.
    _register(
        engine,
        shared[:1],
        return_sequence_lengths=True,
        layer_description="SharedTPUEmbedding 'shared'",
    )
    assert engine.layer_names == ["shared"]


def test_the_engine_serves_the_users_own_feature_configs():
    raw = tf.tpu.experimental.embedding.FeatureConfig(
        table=tf.tpu.experimental.embedding.TableConfig(
            vocabulary_size=10, dim=2, name="their_table"
        ),
        name="their_feature",
    )
    columns, _ = engine_columns()
    config = kte.EmbeddingConfig(feature_to_config_dict={"their_feature": raw})
    tables = _register(
        SharedEngine(tpu_hardware.EmbeddingHardware.V1),
        columns,
        config,
        return_sequence_lengths=False,
        layer_description="TPUEmbeddingLayer 'shared'",
    )
    assert tables.raw_features == {"their_feature": raw}


def test_a_weights_file_without_the_engine_tables_says_which(tpu):
    with tpu.strategy.scope():
        model = build_model()
    layer = model.get_layer("shared")
    store = {"embedding_step": np.int64(0), "table_update_trigger": 0.0}
    with pytest.raises(
        ValueError,
        match=r"^Cannot load the weights of SharedTPUEmbedding 'shared': "
        r"the file has no \['hist_item_shared_embedding'\], which the TPU "
        r"embedding engine holds for it\. The file holds \['embedding_step', "
        r"'table_update_trigger'\]\. Load a file saved from a model with the "
        r"same columns\.$",
    ):
        layer.load_own_variables(store)
