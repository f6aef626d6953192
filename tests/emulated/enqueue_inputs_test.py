"""Issue 23, finding 8: what the engine's enqueue takes, under Keras.

TF's enqueue (`enqueue_tpu_embedding_arbitrary_tensor_batch`) takes its
sparse ids as sample indices and its ragged ids as row splits, one kind
per call (`TPUEmbedding.enqueue`'s docstring); the layers enqueue every
engine feature of a step in one call, each as sparse ids (the columns' id
rules, applied on the host). It takes only direct inputs of the step,
which TPUStrategy's dynamic padding takes from dense inputs, and only ids
on the host.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed._compat import tf_tpu as tpu
from keras_tpu_embed.testing import emulated_tpu
from tests.emulated import models

ROWS = 8


def _mixed_model():
    columns = [
        kte.embedding_column(
            kte.categorical_column_with_identity(key, 20), 4, combiner="sum"
        )
        for key in ("tags", "genres")
    ]
    inputs = {
        "tags": keras.Input((None,), dtype="int64", name="tags", sparse=True),
        "genres": keras.Input(
            (None,), dtype="int64", name="genres", ragged=True
        ),
    }
    config = kte.EmbeddingConfig(
        optimizer=kte.optimizers.Adagrad(0.3),
        # SparseCore sizes its buffers from it; ragged ids do not say it.
        max_ids_per_example={"genres_embedding": 3},
    )
    embedded = kte.TPUEmbeddingLayer(columns, config=config, name="embed")(
        inputs
    )
    joined = keras.layers.Concatenate()(
        [embedded["tags_embedding"], embedded["genres_embedding"]]
    )
    model = keras.Model(inputs, keras.layers.Dense(1)(joined))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _mixed_examples():
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 4, 2 * ROWS)
    ids = tf.RaggedTensor.from_row_lengths(
        rng.integers(0, 20, lengths.sum()), lengths
    )
    features = {"tags": ids.to_sparse(), "genres": ids[::-1]}
    labels = rng.normal(size=(2 * ROWS, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels))


def _fit_mixed(strategy):
    keras.utils.set_random_seed(models.SEED)
    with strategy.scope():
        model = _mixed_model()
    # 4 per replica: SparseCore splits a replica's samples over its 4 cores.
    batches = kte.distribute_dataset(strategy, _mixed_examples(), 8)
    model.fit(batches, epochs=2, verbose=0)
    return model


@functools.cache
def _mixed_on_one_device():
    """The tables of the mixed model trained on one device. Cached: V1 and
    V2 compare with the same reference, and each fit traces Keras' train
    step anew."""
    return models.local_values(_fit_mixed(tf.distribute.get_strategy()))


@pytest.mark.parametrize("feature", ["V1", "V2"])
def test_sparse_and_ragged_ids_in_one_step_train_as_one_device(feature):
    """TF's `TPUEmbedding.enqueue` takes one of sparse or ragged ids per
    call (its docstring; the op's sample indices or row splits). The
    columns' id rules enqueue every feature as sparse ids on the host
    (`engine_host_ids.py`), so a step may mix them, as on one device."""
    expected = _mixed_on_one_device()
    with emulated_tpu(2, embedding_feature=feature) as strategy:
        actual = models.engine_tables(_fit_mixed(strategy))
    models.assert_values_equal(actual, expected)


def test_dense_ids_padded_by_dynamic_padding_are_refused_with_the_fix():
    """Under `steps_per_execution > 1` the step's dense inputs have an
    unknown batch (TF's partial-batch handling), so TPUStrategy's dynamic
    padding pads them in `tpu.replicate`, which then marks none of them a
    direct input: TF's enqueue refuses the dense ids. The error names the
    feature and the fix."""
    with emulated_tpu(2) as strategy:
        model = models.build_emulated(strategy, "sgd")
        with strategy.scope():
            model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
        with pytest.raises(ValueError) as error:
            model.fit(models.batches(strategy), verbose=0)
    message = str(error.value)
    assert "['item_embedding', 'user_embedding']" in message
    assert "sparse=True" in message
    assert "steps_per_execution=1" in message


def _trace_replicated_step(strategy, model, nested):
    """Traces (never runs) TPUStrategy's `tpu.replicate` of a step whose
    ids sit on the TPU cores, where a dataset distributed with TF's default
    `experimental_fetch_to_device=True` puts them: its
    `MultiDeviceIterator.get_next` runs under each core's device.

    The emulated cores are CPU devices, so the inputs are placed on the
    TPU devices a real TPU has, and TF's own `tpu.replicate` builds the
    graph: `TPUReplicatedInput`s of those inputs, which TF's enqueue checks
    (`tpu_embedding_v2.py`, `_raise_error_for_inputs_not_on_cpu`). With
    `nested`, the replicate runs in a tf.function of its own that receives
    the inputs as arguments, as Keras' `one_step_on_data` does.
    """

    def replicate(user, item):
        def computation(user, item):
            model({"user": user, "item": item}, training=True)
            return []

        with strategy.scope():
            tpu.replicate(computation, list(zip(user, item)))

    if nested:
        replicate = tf.function(replicate)

    @tf.function
    def step():
        user, item = [], []
        for core in range(strategy.num_replicas_in_sync):
            with tf.device(
                f"/job:localhost/replica:0/task:0/device:TPU:{core}"
            ):
                user.append(tf.zeros([4, 1], tf.int64))
                item.append(tf.zeros([4, 1], tf.int64))
        replicate(user, item)

    step.get_concrete_function()


def test_ids_fetched_to_the_tpu_in_a_custom_loop_are_refused_with_the_fix():
    """A custom training loop calling `strategy.run(step,
    args=(next(iterator),))` in one tf.function hands the replicate the
    iterator's own outputs: TF refuses ids fetched to the TPU, and the
    error says to use `kte.distribute_dataset`."""
    with emulated_tpu(2) as strategy:
        model = models.build_emulated(strategy, "sgd")
        with pytest.raises(ValueError) as error:
            _trace_replicated_step(strategy, model, nested=False)
    message = str(error.value)
    assert "must be placed on the CPU" in message
    assert "kte.distribute_dataset(strategy, dataset" in message


def test_keras_step_function_hides_the_device_of_its_inputs():
    """Under `model.fit` the replicate is inside Keras' step function, a
    tf.function of its own: its arguments are placeholders with no device,
    so TF's check (and the rewrite of its error) cannot fire there, wherever
    the ids were fetched to."""
    with emulated_tpu(2) as strategy:
        model = models.build_emulated(strategy, "sgd")
        _trace_replicated_step(strategy, model, nested=True)
