"""`kte.warm_start` of tables on the TPU embedding engine (2 replicas).

The same legacy checkpoint warm-starts the same columns built on CPU and
under `emulated_tpu`: the engine's tables and slots, read back from the
(emulated) chip, equal the CPU model's. The checkpoint is a TPUEstimator
one ("mod" over 3 hosts, with its Adagrad slot), written by TF 1.x's own
partitioned variables (`tests/warm_start_test.py`).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models
from tests.warm_start_test import tpu_estimator_checkpoint

ROWS = 14
OLD_TOKENS = [f"t{i}" for i in range(ROWS)]
# Moved rows, a new token, an OOV bucket: 6 rows.
NEW_TOKENS = ["t13", "fresh", "t0", "t5", "t7"]

CASES = {
    "div": dict(num_shards=None),
    "mod": dict(partition_strategy="mod", num_shards=3),
    "remap": dict(
        partition_strategy="mod",
        num_shards=3,
        vocabularies={"item": (OLD_TOKENS, None)},
    ),
}


def item_column(case):
    categorical = (
        kte.categorical_column_with_vocabulary_list(
            "item", NEW_TOKENS, num_oov_buckets=1
        )
        if case == "remap"
        else kte.categorical_column_with_identity("item", ROWS)
    )
    # Seeded: the rows a remap does not move keep the same initial values
    # on both.
    return kte.embedding_column(
        categorical, 2, initializer=keras.initializers.RandomUniform(seed=7)
    )


def item_model(column):
    # Ids, as the preprocessor of `_first_step` gives them.
    inputs = {
        "item": keras.Input((1,), dtype="int64", sparse=True, name="item")
    }
    layer = kte.TPUEmbeddingLayer(
        [column],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
        name="embed",
    )
    model = keras.Model(inputs, layer(inputs)["item_embedding"])
    model.compile(loss="mse")
    return model


def first_step(strategy, model, column, case):
    """A `predict` step: TF creates the engine's tables (and changes
    none)."""
    value = "t0" if case == "remap" else 0
    items = tf.data.Dataset.from_tensor_slices(
        ({"item": np.array([[value]] * 8)}, np.zeros((8, 1), np.float32))
    )
    batches = kte.distribute_dataset(
        strategy, items, 8, preprocessor=kte.FeaturePreprocessor([column])
    )
    model.predict(batches, verbose=0)


def estimator_checkpoint(tmp_path):
    rng = np.random.default_rng(0)
    logical = rng.normal(size=(ROWS, 2)).astype(np.float32)
    return tpu_estimator_checkpoint(tmp_path, logical, np.abs(logical) + 0.5, 3)


@pytest.mark.parametrize("feature", ["V1", "V2"])
@pytest.mark.parametrize("steps_first", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_tables_equal_the_cpu_model(
    tmp_path, case, steps_first, feature
):
    prefix = estimator_checkpoint(tmp_path)
    arguments = {**CASES[case], "slots": True}
    cpu = item_model(item_column(case))
    cpu_report = kte.warm_start(cpu, prefix, **arguments)
    expected = models.local_values(cpu)
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        column = item_column(case)
        with strategy.scope():
            model = item_model(column)
        assert model.get_layer("embed").engine is not None
        if steps_first:
            first_step(strategy, model, column, case)
        report = kte.warm_start(model, prefix, **arguments)
        if not steps_first:
            first_step(strategy, model, column, case)
        # Read back from the chip: V1 from TF's own host copies after its
        # retrieve, V2 (SparseCore, whose chip layout stacks tables) by the
        # engine.
        actual = (
            models.engine_values(model)
            if feature == "V1"
            else models.engine_tables(model)
        )
    models.assert_values_equal(actual, expected, atol=0)
    assert report == cpu_report
    assert report.slots == {
        "item": {
            "accumulators": "input_layer/item_embedding/embedding_weights"
            "/Adagrad"
        }
    }


def _legacy_checkpoint(directory, shapes):
    """Feature-column variables `input_layer/<key>_embedding/...` of these
    shapes, saved by TF 1.x's Saver."""
    with tf.Graph().as_default():
        for key, shape in shapes.items():
            tf.compat.v1.get_variable(
                f"input_layer/{key}_embedding/embedding_weights",
                initializer=tf.constant(
                    np.random.default_rng(1).normal(size=shape), tf.float32
                ),
            )
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(
                session, str(directory / "legacy")
            )


def test_a_failing_table_leaves_the_engine_unchanged(tmp_path):
    # "user" fits the model's [20, 4] table; "item" has dimension 5, not 3.
    prefix = _legacy_checkpoint(tmp_path, {"user": (20, 4), "item": (15, 5)})
    with emulated_tpu(2, embedding_feature="V1") as strategy:
        model = models.build_emulated(strategy, "adagrad")
        model.predict(models.batches(strategy), verbose=0)
        before = models.engine_values(model)
        with pytest.raises(ValueError, match=r"item_embedding.*\[15, 5\]"):
            kte.warm_start(model, prefix)
        models.assert_values_equal(models.engine_values(model), before, 0)
