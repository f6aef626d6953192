"""The layers on a TPU: what they build, refuse and feed the engine.

Under `emulated_tpu` the layers see TF's own `TPUStrategy` and build TF's
own `TPUEmbedding` (`engines/v1/v1_engine.py`): a layer used with the
wrong strategy, layers that cannot share one engine, what the engine
cannot do, an export or a weights file without the engine's tables, and a
TPU without an engine (`"UNSUPPORTED"`, v5e: tables fall back to the
tensor core) each fail or fall back at build, saying why. What reaches
TF's enqueue is checked by TF itself and by the emulated chip (ids outside
a table fail on it at run time), and by a spy on `TPUEmbedding.enqueue`
for the weights, which TF casts without a word.
"""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.placement.devices import LookupDevice
from keras_tpu_embed.testing import emulated_tpu
from tests.engine_models import BATCH
from tests.engine_models import N
from tests.engine_models import build_model
from tests.engine_models import engine_columns
from tests.engine_models import engine_inputs
from tests.engine_models import examples
from tests.engine_models import single_table_model


@pytest.fixture(scope="module")
def built():
    """The engine model, built in the strategy and not trained yet."""
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
            model = build_model()
        yield strategy, model


def test_layer_built_outside_the_strategy_fails_inside(built):
    strategy, _ = built
    columns, _ = engine_columns()
    layer = kte.TPUEmbeddingLayer(columns[:1])
    layer({"user": tf.constant([[1]], tf.int64)})  # built on CPU
    with pytest.raises(RuntimeError, match="built outside TPUStrategy"):
        strategy.run(
            tf.function(lambda: layer({"user": tf.constant([[1]], tf.int64)}))
        )


def test_layer_built_inside_the_strategy_fails_outside(built):
    _, model = built
    features, _ = next(iter(examples().batch(BATCH)))
    with pytest.raises(RuntimeError, match="called outside that strategy"):
        model(features)
    with pytest.raises(ValueError, match="held by the TPU embedding engine"):
        model.get_layer("embed").table_variable("user")


def test_export_before_the_engines_first_step_says_why(built, tmp_path):
    """The engine's tables exist from its first step on (exported from
    the TPU after it: tests/emulated/export_trained_test.py)."""
    _, model = built
    with pytest.raises(RuntimeError, match="run one step .* exporting"):
        kte.export_saved_model(model, str(tmp_path / "serving"))


def test_a_weights_file_without_the_engine_tables_says_which(built):
    _, model = built
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


def test_a_second_model_after_training_fails_at_build(built):
    # Last of the fixture's tests: it trains the model.
    strategy, model = built
    model.fit(
        kte.distribute_dataset(strategy, examples(), BATCH),
        epochs=1,
        verbose=0,
    )
    assert int(model.get_layer("embed").embedding_step.numpy()) == N // BATCH
    with strategy.scope():
        with pytest.raises(RuntimeError, match="ran its first step"):
            build_model()


def test_layers_that_cannot_share_the_engine_fail_at_build():
    columns, shared = engine_columns()
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
            with pytest.raises(ValueError, match="pipeline_execution"):
                build_model(
                    shared_config=kte.EmbeddingConfig(
                        pipeline_execution_with_tensor_core=True
                    )
                )
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
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
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
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
def test_engine_rejects_what_it_cannot_do(config, kwargs, message):
    _, shared = engine_columns()
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
            with pytest.raises(ValueError, match=message):
                kte.SharedTPUEmbedding(shared, config=config, **kwargs)(
                    engine_inputs()
                )


@pytest.fixture
def fallback_lines():
    """The log lines saying a table falls back to the tensor core."""
    lines = []

    class Recorder(logging.Handler):
        def emit(self, record):
            if "falls back to the tensor-core lookup" in record.getMessage():
                lines.append(record.getMessage())

    recorder = Recorder()
    tf.get_logger().addHandler(recorder)
    yield lines
    tf.get_logger().removeHandler(recorder)


def test_tpu_without_engine_falls_back_to_tensor_core(fallback_lines):
    # On a TPU without an engine the layer trains the table on the tensor
    # core, so its tables must give it the dedupe scratch of tensor-core
    # tables, and the fallback is decided (and said) once
    # (`placement/device_plan.py`).
    shaped = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20),
        4,
        tensor_core_shape=[None, 2],
    )
    unshaped = kte.embedding_column(
        kte.categorical_column_with_identity("item", 20), 4
    )
    config = kte.EmbeddingConfig(optimizer=kte.optimizers.SGD(0.1))
    with emulated_tpu(2, embedding_feature="UNSUPPORTED") as strategy:
        with strategy.scope():
            layer = kte.TPUEmbeddingLayer([shaped], config=config)
            layer.build({"user": (None, 2)})
        assert layer.engine is None
        assert [t.name for t in layer.local_table_specs] == ["user"]
        assert layer._training_devices == {"user": LookupDevice.TPU_TENSOR_CORE}
        assert sorted(layer._local._scratch) == ["user"]
        assert len(fallback_lines) == 1
        with strategy.scope():
            with pytest.raises(
                ValueError, match=r"\['item_embedding'\] have no"
            ):
                kte.TPUEmbeddingLayer([unshaped]).build({"item": (None, 2)})


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


def test_out_of_vocabulary_ids_are_dropped_before_the_engine(tmp_path):
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
            pre, tpu_model = _vocabulary_model()
        data = kte.distribute_dataset(
            strategy, _country_examples(), 8, preprocessor=pre
        )
        # The emulated chip fails a step on an id outside [0, 3): no -1
        # reached it, in training or in predict.
        tpu_model.fit(data, epochs=2, verbose=0)
        on_tpu = tpu_model.predict(data, verbose=0)
        path = tf.train.Checkpoint(
            embedding=kte.engine_checkpoint(tpu_model)
        ).write(str(tmp_path / "tables"))
        head = tpu_model.get_layer("head").get_weights()

    # The same tables on the host path, which skips -1 itself.
    _, cpu_model = _vocabulary_model()
    tf.train.Checkpoint(embedding=kte.engine_checkpoint(cpu_model)).read(
        path
    ).assert_existing_objects_matched()
    cpu_model.get_layer("head").set_weights(head)
    on_cpu = np.concatenate(
        [
            cpu_model.predict_on_batch(pre(x))
            for x, _ in _country_examples().batch(8)
        ]
    )
    np.testing.assert_allclose(on_tpu, on_cpu, atol=1e-6)


def test_negative_dense_ids_for_the_engine_fail_on_the_host():
    column = kte.embedding_column(
        kte.categorical_column_with_identity("user", 20), 4
    )
    features = {"user": np.array([[1], [-1], [3], [4]], np.int64)}
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
            model = single_table_model(column, kte.EmbeddingConfig())
        data = kte.distribute_dataset(
            strategy,
            tf.data.Dataset.from_tensor_slices((features, np.ones((4, 1)))),
            4,
        )
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"Feature .*user.* has negative ids, .* dense ids",
        ):
            model.fit(data, epochs=1, verbose=0)


@pytest.fixture
def enqueued_weights(monkeypatch):
    """The weights the layers hand TF's `TPUEmbedding.enqueue`, checked as
    TF checks its features: a direct input of the step, whose value TF
    would otherwise cast to float32 without a word
    (`TPUEmbedding._add_data_for_sparse_tensor`)."""
    seen = []
    enqueue = tf.tpu.experimental.embedding.TPUEmbedding.enqueue

    def spy(self, features, weights=None, training=True, name=None):
        given = {k: w for k, w in (weights or {}).items() if w is not None}
        seen.append({k: w.dtype for k, w in given.items()})
        self._raise_error_for_non_direct_inputs(given)
        return enqueue(self, features, weights, training=training, name=name)

    monkeypatch.setattr(
        tf.tpu.experimental.embedding.TPUEmbedding, "enqueue", spy
    )
    return seen


def test_mixed_precision_keeps_input_weights_float32(
    mixed_bfloat16, enqueued_weights
):
    # Keras autocasts float inputs to the compute dtype; the weights must
    # reach the engine's enqueue float32 and unchanged: a weight rounded to
    # bfloat16 on the TPU would be a Cast op, not a direct input.
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        with strategy.scope():
            model = build_model()
        assert model.get_layer("embed").compute_dtype == "bfloat16"
        data = kte.distribute_dataset(strategy, examples(), BATCH)
        model.fit(data, epochs=1, verbose=0)
        assert int(model.get_layer("embed").embedding_step.numpy()) == (
            N // BATCH
        )
    # Every enqueue traced (one per replica of each traced step) had the
    # weighted feature's weights float32, a direct input of the step.
    assert enqueued_weights
    for weights in enqueued_weights:
        assert weights == {"tags_weighted_by_tag_w_embedding": tf.float32}
