"""What the TPU embedding engine would refuse is said first, with the fix."""

import dataclasses

import pytest
import tensorflow as tf

from keras_tpu_embed.engines import engine_checks


@dataclasses.dataclass
class Member:
    name: str
    input_keys: frozenset
    features: dict


def test_every_layer_must_get_every_engine_feature():
    users = Member("users", frozenset({"user"}), {"u": ("user", None)})
    items = Member("items", frozenset({"item", "w"}), {"i": ("item", "w")})
    with pytest.raises(
        ValueError, match=r"'users' does not receive \['item', 'w'\]"
    ):
        engine_checks.check_every_layer_gets_every_feature([users, items])
    both = frozenset({"user", "item", "w"})
    engine_checks.check_every_layer_gets_every_feature(
        [
            dataclasses.replace(users, input_keys=both),
            dataclasses.replace(items, input_keys=both),
        ]
    )


def test_dense_sequence_ids_are_refused():
    dense = {"hist": tf.zeros([4, 3], tf.int64)}
    with pytest.raises(ValueError, match="Sequence feature 'hist'"):
        engine_checks.check_enqueue_inputs(dense, {"hist"})
    engine_checks.check_enqueue_inputs({"hist": tf.zeros([4, 1])}, set())
    engine_checks.check_enqueue_inputs({"hist": tf.zeros([4])}, set())


def test_dense_ids_wider_than_one_are_refused():
    # TF's enqueue refuses them too, naming no fix (tests/emulated runs it).
    with pytest.raises(ValueError, match=r"'hist' .* shape \(4, 3\)"):
        engine_checks.check_enqueue_inputs(
            {"hist": tf.zeros([4, 3], tf.int64)}, set()
        )


def test_batch_size_is_fixed_by_the_first_step():
    step = {"a": tf.zeros([8]), "b": tf.zeros([8, 1])}
    assert engine_checks.check_batch_size(step, None) == 8
    assert engine_checks.check_batch_size(step, 8) == 8
    with pytest.raises(ValueError, match="per-replica batch of 8"):
        engine_checks.check_batch_size({"a": tf.zeros([5])}, 8)
    with pytest.raises(ValueError, match="different batch sizes"):
        engine_checks.check_batch_size(
            {"a": tf.zeros([8]), "b": tf.zeros([4])}, None
        )


def test_activation_shapes_must_match_the_layer():
    table = tf.tpu.experimental.embedding.TableConfig(10, 4, name="t")
    configs = {
        "x": tf.tpu.experimental.embedding.FeatureConfig(table),
        "s": tf.tpu.experimental.embedding.FeatureConfig(
            table, max_sequence_length=3
        ),
    }
    good = {"x": tf.zeros([2, 4]), "s": tf.zeros([2, 3, 4])}
    engine_checks.check_activation_shapes(good, configs)
    with pytest.raises(ValueError, match="feature 'x'"):
        engine_checks.check_activation_shapes(
            dict(good, x=tf.zeros([2, 1, 4])), configs
        )


def test_static_batch_is_set_in_place_and_checked_when_run():
    """Under steps_per_execution > 1 the step's inputs lose their batch
    dimension; it is set back on the same tensors (TF's enqueue takes only
    direct inputs) and checked when the step runs."""
    seen = {}

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 1], tf.int64),
            tf.SparseTensorSpec([None, None], tf.int64),
            tf.RaggedTensorSpec([None, None], tf.int64),
        ]
    )
    def step(dense, sparse, ragged):
        values = {"dense": dense, "sparse": sparse, "ragged": ragged}
        checks = engine_checks.set_static_batch(values, 2)
        seen.update(
            {name: value.shape.as_list() for name, value in values.items()}
        )
        seen["same"] = values["dense"] is dense
        with tf.control_dependencies(checks):
            return tf.identity(dense)

    ids = tf.constant([[1], [2]], tf.int64)
    sparse = tf.sparse.from_dense(ids)
    ragged = tf.RaggedTensor.from_tensor(ids)
    step(ids, sparse, ragged)
    assert seen == {
        "dense": [2, 1],
        "sparse": [2, None],
        "ragged": [2, None],
        "same": True,
    }
    assert engine_checks.set_static_batch({"dense": ids}, None) == []
    for wrong in (
        (tf.constant([[1]], tf.int64), sparse, ragged),
        (ids, tf.sparse.from_dense(ids[:1]), ragged),
        (ids, sparse, tf.RaggedTensor.from_tensor(ids[:1])),
    ):
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="per-replica batch differs"
        ):
            step(*wrong)


def test_sparse_and_ragged_ids_mix_only_where_the_host_makes_them_sparse():
    sparse = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [2, 2])
    ragged = tf.ragged.constant([[1], [2, 3]], dtype=tf.int64)
    features = {"tags": sparse, "genres": ragged}
    engine_checks.check_enqueue_inputs(
        features, (), made_sparse={"genres", "tags"}
    )
    engine_checks.check_enqueue_inputs(features, (), made_sparse={"genres"})
    with pytest.raises(ValueError) as error:
        engine_checks.check_enqueue_inputs(features, (), made_sparse=())
    assert "sparse ['tags']" in str(error.value)
    assert "ragged ['genres']" in str(error.value)


def test_an_unknown_batch_is_blamed_on_another_dataset_batch_only():
    # One dataset batch, the engine's: an unknown batch has another cause
    # (steps_per_execution, a variable-width feature), said elsewhere.
    assert engine_checks.another_batch_message(4, {4}) is None
    assert engine_checks.another_batch_message(None, {2, 4}) is None
    message = engine_checks.another_batch_message(4, {2, 4})
    assert "per-replica batch of 4 (global 4 over 1 replicas)" in message
    assert "per-replica batches [2, 4]" in message
    assert "same global_batch_size" in message
