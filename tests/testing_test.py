"""The test suite's own rules, and its numpy references against TF.

Every package module has a test file of its own, named after it
(`tests/<module basename>_test.py`), so that a new module cannot land
untested; test files not named after a module are the cross-cutting suites
listed below. The numpy references of `testing.py` are checked against
TensorFlow's own ops, so that the package is never checked against a wrong
reference.
"""

import ast
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed
from tests import testing

PACKAGE = pathlib.Path(keras_tpu_embed.__file__).parent
TESTS = pathlib.Path(__file__).parent
# Suites that test several modules together, or the project around them.
CROSS_CUTTING = {
    "benchmarks",  # benchmarks/run.py end to end
    "concurrency",  # a served model under many threads
    "docs",  # the README's and docs/' python blocks run
    "engine_stand_in",  # the TPU stand-in answers as TensorFlow does
    "examples",  # examples/ scripts
    "install",  # the install extras resolve (pip --dry-run)
    "legacy_reference",  # numerics against tf_keras DenseFeatures
    "notebooks",  # notebooks/ executed
    "project",  # README, CI, import errors
    "save_paths",  # every way users save a model
    "serving_devices",  # serving exports per lookup device
    "testing",  # this file
}


def _modules():
    return sorted(
        path.relative_to(PACKAGE)
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
    )


def _test_functions(path):
    tree = ast.parse(path.read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    ]


def test_module_basenames_are_unique():
    stems = [module.stem for module in _modules()]
    repeated = sorted({s for s in stems if stems.count(s) > 1})
    assert repeated == [], (
        f"Modules {repeated} share a basename, so they cannot each have a "
        "tests/<basename>_test.py; rename one."
    )


def test_every_module_has_its_own_test_file():
    missing, empty = [], []
    for module in _modules():
        path = TESTS / f"{module.stem}_test.py"
        if not path.exists():
            missing.append(f"{module} -> tests/{path.name}")
        elif not _test_functions(path):
            empty.append(f"tests/{path.name}")
    assert missing == [], f"Package modules without a test file: {missing}"
    assert empty == [], f"Test files without a test function: {empty}"


def test_every_test_file_is_named_after_a_module_or_cross_cutting():
    stems = {module.stem for module in _modules()}
    orphans = sorted(
        path.name
        for path in TESTS.glob("*_test.py")
        if path.name[: -len("_test.py")] not in stems | CROSS_CUTTING
    )
    assert orphans == [], (
        f"{orphans} are named after no package module: rename them after "
        "the module they test, or list them in CROSS_CUTTING."
    )


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_numpy_lookup_is_tf_safe_embedding_lookup(combiner):
    table = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    batch = [[(1, 2.0), (4, 0.5), (1, 1.0)], [], [(5, 3.0)], [(0, 0.0)]]
    ragged_ids = tf.ragged.constant(
        [[i for i, _ in row] for row in batch], dtype=tf.int64, ragged_rank=1
    )
    ragged_weights = tf.ragged.constant(
        [[w for _, w in row] for row in batch], tf.float32, ragged_rank=1
    )
    want = tf.nn.safe_embedding_lookup_sparse(
        table,
        ragged_ids.to_sparse(),
        ragged_weights.to_sparse(),
        combiner=combiner,
    )
    got = testing.numpy_lookup(table, batch, combiner, True, 0)
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_numpy_table_gradient_is_tf_autodiff(combiner):
    ids = testing.BATCHES[2]
    upstream = np.random.default_rng(1).normal(size=(3, 2))
    table = tf.Variable(tf.ones([testing.VOCAB, 2], tf.float64))
    sparse_ids = tf.sparse.from_dense(tf.constant(ids, tf.int64) + 1)
    sparse_ids = tf.SparseTensor(
        sparse_ids.indices, sparse_ids.values - 1, sparse_ids.dense_shape
    )
    with tf.GradientTape() as tape:
        pooled = tf.nn.embedding_lookup_sparse(
            table, sparse_ids, None, combiner=combiner
        )
        loss = tf.reduce_sum(pooled * upstream)
    want = tf.convert_to_tensor(tape.gradient(loss, table))
    got = testing.numpy_table_gradient(ids, upstream, testing.VOCAB, combiner)
    np.testing.assert_allclose(got, want, atol=1e-12)
