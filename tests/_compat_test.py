"""The one module that checks the backend and touches TF internals.

The import error on another Keras backend (and without TensorFlow) needs a
fresh interpreter; it is tested in `project_test.py`
(`test_import_fails_clearly_on_another_backend`).
"""

import ast
import os
import pathlib

import keras
import tensorflow as tf

import keras_tpu_embed
from keras_tpu_embed import _compat

PACKAGE = pathlib.Path(keras_tpu_embed.__file__).parent
PRIVATE = ("tensorflow.python", "keras.src")


def test_importing_leaves_the_tensorflow_backend_set():
    assert os.environ["KERAS_BACKEND"] == "tensorflow"
    assert _compat.keras.backend.backend() == "tensorflow"
    for name in _compat.__all__:
        assert getattr(_compat, name) is not None, name


def test_no_other_module_imports_private_tensorflow_or_keras():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            if any(n.startswith(PRIVATE) for n in names):
                offenders.append(f"{path.relative_to(PACKAGE)}: {names}")
    assert offenders == []


def test_public_tf_columns_are_the_private_classes_conversion_reads():
    fc, tpu_fc = _compat.tf_feature_column_v2, _compat.tf_tpu_feature_column_v2
    public = tf.feature_column
    identity = public.categorical_column_with_identity("a", 3)
    pairs = [
        (identity, fc.IdentityCategoricalColumn),
        (
            public.categorical_column_with_vocabulary_list("l", ["x"]),
            fc.VocabularyListCategoricalColumn,
        ),
        (
            public.categorical_column_with_hash_bucket("h", 3),
            fc.HashedCategoricalColumn,
        ),
        (
            public.weighted_categorical_column(identity, "w"),
            fc.WeightedCategoricalColumn,
        ),
        (
            public.sequence_categorical_column_with_identity("s", 3),
            fc.SequenceCategoricalColumn,
        ),
        (public.embedding_column(identity, 2), fc.EmbeddingColumn),
        (
            tf.compat.v1.tpu.experimental.embedding_column(identity, 2),
            tpu_fc._TPUEmbeddingColumnV2,
        ),
        (
            tf.compat.v1.tpu.experimental.shared_embedding_columns(
                [identity], 2
            )[0],
            tpu_fc._TPUSharedEmbeddingColumnV2,
        ),
    ]
    for column, private in pairs:
        assert isinstance(column, private), (column, private)
    assert isinstance(pairs[-1][0], fc.SharedEmbeddingColumn)
    assert issubclass(fc.VocabularyFileCategoricalColumn, fc.CategoricalColumn)
    assert callable(_compat.tf_init_ops.TruncatedNormal)
    assert _compat.keras_in_stateless_scope() is False
    assert _compat.keras_in_symbolic_scope() is False


def test_nested_layers_finds_every_depth_but_not_the_layer_itself():
    inner = keras.layers.Dense(2, name="inner")

    class Block(keras.layers.Layer):
        def __init__(self):
            super().__init__(name="block")
            self.inner = inner

    class Outer(keras.layers.Layer):
        def __init__(self):
            super().__init__(name="outer")
            self.block = Block()
            self.head = keras.layers.Dense(1, name="head")

    outer = Outer()
    names = sorted(layer.name for layer in _compat.nested_layers(outer))
    assert names == ["block", "head", "inner"]
    assert _compat.nested_layers(inner) == []


def test_a_mirrored_keras_variable_restores_a_tensor_of_unknown_shape():
    """As TF's traced restore over several tasks hands it (a pod)."""
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        variable = keras.Variable(tf.zeros([2, 3]))

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def restore(value):
        variable._restore_from_tensors({"VARIABLE_VALUE": value})
        return tf.constant(0)

    restore(tf.ones([2, 3]))
    assert variable.numpy().tolist() == [[1.0] * 3] * 2
