"""TensorFlow's private fields, read through named functions: each test
builds the real TF object and checks the field read is the one TF set."""

import tensorflow as tf

from keras_tpu_embed import _tf_private


def _tpu_column(**kwargs):
    categorical = tf.feature_column.sequence_categorical_column_with_identity(
        "watched", 10
    )
    return tf.compat.v1.tpu.experimental.embedding_column(
        categorical, 4, **kwargs
    )


def test_tpu_column_arguments_are_the_constructors():
    column = _tpu_column(max_sequence_length=7, learning_rate_fn=abs)
    arguments = _tf_private.tpu_column_arguments(column)
    assert isinstance(column, _tf_private.TFTPUEmbeddingColumn)
    assert arguments.max_sequence_length == 7
    assert arguments.learning_rate_fn is abs
    assert arguments.shared_embedding_collection_name == ""


def test_shared_tpu_columns_keep_their_collection_and_initializer():
    initializer = tf.compat.v1.constant_initializer(0.5)
    with tf.Graph().as_default():  # as TF builds shared columns
        columns = tf.compat.v1.tpu.experimental.shared_embedding_columns(
            [
                tf.feature_column.categorical_column_with_identity("a", 5),
                tf.feature_column.categorical_column_with_identity("b", 5),
            ],
            3,
            initializer=initializer,
            shared_embedding_collection_name="ab",
        )
    arguments = _tf_private.tpu_column_arguments(columns[0])
    assert isinstance(columns[0], _tf_private.TFTPUSharedEmbeddingColumn)
    assert arguments.shared_embedding_collection_name == "ab"
    assert arguments.initializer is initializer


def test_shared_column_creator_arguments_are_the_constructors():
    with tf.Graph().as_default():  # as TF builds shared columns
        columns = tf.feature_column.shared_embeddings(
            [
                tf.feature_column.categorical_column_with_identity("a", 5),
                tf.feature_column.categorical_column_with_identity("b", 5),
            ],
            6,
            trainable=False,
            ckpt_to_load_from="/tmp/ckpt",
            tensor_name_in_ckpt="emb",
        )
    creator = columns[0].shared_embedding_column_creator
    arguments = _tf_private.shared_column_creator_arguments(creator)
    assert arguments.dimension == 6
    assert arguments.trainable is False
    assert arguments.ckpt_to_load_from == "/tmp/ckpt"
    assert arguments.tensor_name_in_ckpt == "emb"


def test_distributed_dataset_cardinality_reads_and_sets_what_keras_reads():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    dataset = tf.data.Dataset.range(12).batch(4)
    distributed = strategy.experimental_distribute_dataset(dataset)
    assert _tf_private.distributed_dataset_cardinality(distributed) == 3
    _tf_private.set_distributed_dataset_cardinality(distributed, 2)
    assert int(distributed.cardinality) == 2
    assert _tf_private.distributed_dataset_options(distributed) is None


def test_batch_arguments_read_what_dataset_batch_was_given():
    examples = tf.data.Dataset.range(10)
    source, size, drop = _tf_private.batch_arguments(
        examples.batch(4).shuffle(3).prefetch(2)
    )
    assert (int(source.cardinality()), size, drop) == (10, 4, False)
    parallel = examples.batch(3, drop_remainder=True, num_parallel_calls=2)
    assert _tf_private.batch_arguments(parallel)[1:] == (3, True)
    # A map may change the rows of a batch: its batches are not known.
    assert _tf_private.batch_arguments(examples.batch(4).map(abs)) is None
    assert _tf_private.batch_arguments(examples) is None


def test_engine_optimizer_slot_names_are_the_ones_tf_creates():
    embedding = tf.tpu.experimental.embedding
    assert _tf_private.engine_optimizer_slot_names(embedding.SGD(0.1)) == []
    assert _tf_private.engine_optimizer_slot_names(embedding.Adagrad(0.1)) == [
        "accumulators"
    ]
    assert _tf_private.engine_optimizer_slot_names(embedding.Adam(0.1)) == [
        "momenta",
        "velocities",
    ]


def test_the_replica_index_is_zero_outside_a_replica_and_the_replicas_own():
    assert _tf_private.replica_index(tf.distribute.get_replica_context()) == 0
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])

    @tf.function
    def step():
        return strategy.run(
            lambda: tf.constant(
                _tf_private.replica_index(tf.distribute.get_replica_context())
            )
        )

    assert int(step()) == 0


def test_cloned_feature_configs_keep_shared_tables_shared():
    embedding = tf.tpu.experimental.embedding
    table = embedding.TableConfig(vocabulary_size=8, dim=4, name="t")
    features = {
        "a": embedding.FeatureConfig(table=table, name="a"),
        "b": embedding.FeatureConfig(table=table, name="b"),
    }
    clone = _tf_private.sparsecore_clone_feature_config(features)
    assert clone["a"] is not features["a"]
    assert clone["a"].table is clone["b"].table
    assert clone["a"].table.name == "t"


def test_the_replica_local_variable_is_the_replicas_own_copy():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        table = tf.Variable([[1.0], [2.0], [3.0]])
    # Outside a replica: the mirrored variable itself.
    assert _tf_private.replica_local_variable(table) is table
    copies = []

    def replica():
        local = _tf_private.replica_local_variable(table)
        copies.append(local)
        return tf.gather(local, [2, 0])

    rows = strategy.run(replica)
    (local,) = copies
    assert not isinstance(local, tf.distribute.DistributedValues)
    assert local is strategy.experimental_local_results(table)[0]
    assert rows.numpy().tolist() == [[3.0], [1.0]]


def test_sharded_variable_is_tfs_and_saves_one_slice_per_shard():
    parts = [tf.Variable(tf.zeros([2, 1])), tf.Variable(tf.ones([1, 1]))]
    sharded = _tf_private.sharded_variable_class()(parts)
    factories = _tf_private.sharded_variable_saveables(sharded)
    saveables = factories["VARIABLE_VALUE"]("table")
    assert len(saveables) == 2  # one slice per shard
    assert [s.specs[0].slice_spec for s in saveables] == [
        "3 1 0,2:0,1",
        "3 1 2,1:0,1",
    ]
    assert tf.convert_to_tensor(sharded).shape == (3, 1)
