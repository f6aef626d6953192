"""The test suite's own rules, and its numpy references against TF.

Every package module has a test file of its own, named after it
(`tests/<module basename>_test.py`), so that a new module cannot land
untested; test files not named after a module are named after a module
of `benchmarks/` or are the cross-cutting suites listed below. The numpy
references of `testing.py` are checked against TensorFlow's own ops, so
that the package is never checked against a wrong reference.
"""

import ast
import functools
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed
import keras_tpu_embed as kte
from tests import testing

PACKAGE = pathlib.Path(keras_tpu_embed.__file__).parent
TESTS = pathlib.Path(__file__).parent
BENCHMARKS = TESTS.parent / "benchmarks"
# Suites that test several modules together, or the project around them.
CROSS_CUTTING = {
    "benchmarks",  # benchmarks/run.py end to end
    "concurrency",  # a served model under many threads
    "docs",  # the README's and docs/' python blocks run
    "emulated_engine",  # tests/emulated's engine files, second half
    "emulated_pod",  # tests/emulated_hosts, the 2-host pod
    "examples",  # examples/ scripts
    "install",  # the install extras resolve (pip --dry-run)
    "legacy_reference",  # numerics against tf_keras DenseFeatures
    "notebooks",  # notebooks/ executed
    "parameter_server",  # layers under ParameterServerStrategy, local tasks
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
    stems |= {path.stem for path in BENCHMARKS.glob("*.py")}
    orphans = sorted(
        path.name
        for path in TESTS.glob("*_test.py")
        if path.name[: -len("_test.py")] not in stems | CROSS_CUTTING
    )
    assert orphans == [], (
        f"{orphans} are named after no package or benchmarks module: rename "
        "them after the module they test, or list them in CROSS_CUTTING."
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
def test_numpy_lookup_unsafe_is_tf_embedding_lookup_sparse(combiner):
    """Unsafe: non-positive weights kept, a zero total gives zeros."""
    table = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    batch = [[(1, 2.0), (4, -0.5)], [(2, -1.0), (3, 1.0)], [(5, 0.0)]]
    ids = tf.ragged.constant(
        [[i for i, _ in row] for row in batch], dtype=tf.int64
    )
    weights = tf.ragged.constant([[w for _, w in row] for row in batch])
    want = tf.nn.embedding_lookup_sparse(
        table, ids.to_sparse(), weights.to_sparse(), combiner=combiner
    )
    got = testing.numpy_lookup(table, batch, combiner, False, 0)
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


def _tf_kernel_step(name, opt, w, slots, g, lr):
    """TF's own training kernel on float64 copies; (rows, slots)."""
    raw = tf.raw_ops
    var = tf.Variable(w)
    state = {k: tf.Variable(v) for k, v in slots.items()}
    c = functools.partial(tf.constant, dtype=tf.float64)
    if name == "SGD":
        raw.ResourceApplyGradientDescent(var=var.handle, alpha=c(lr), delta=g)
    elif name == "Adagrad":
        raw.ResourceApplyAdagradV2(
            var=var.handle,
            accum=state["accumulators"].handle,
            lr=c(lr),
            epsilon=c(0.0),
            grad=g,
        )
    elif name == "AdagradMomentum":
        # The scaled gradient g / sqrt(acc + eps) from TF's kernels on a zero
        # variable stepped at lr -1: Adagrad's when beta2 == 1 (eps added to
        # the accumulator before and taken out after, as Adagrad's kernel has
        # eps outside the root), RMSProp's (eps inside) otherwise; then TF's
        # momentum kernel, Nesterov's too. Exponent 2 only.
        assert opt.exponent == 2
        scaled = tf.Variable(tf.zeros_like(w))
        acc = state["accumulators"]
        if opt.beta2 == 1:
            acc.assign_add(tf.fill(w.shape, c(opt.epsilon)))
            raw.ResourceApplyAdagradV2(
                var=scaled.handle,
                accum=acc.handle,
                lr=c(-1.0),
                epsilon=c(0.0),
                grad=g,
            )
            acc.assign_sub(tf.fill(w.shape, c(opt.epsilon)))
        else:
            unused = tf.Variable(tf.zeros_like(w))
            raw.ResourceApplyRMSProp(
                var=scaled.handle,
                ms=acc.handle,
                mom=unused.handle,
                lr=c(-1.0),
                rho=c(opt.beta2),
                momentum=c(0.0),
                epsilon=c(opt.epsilon),
                grad=g,
            )
        raw.ResourceApplyMomentum(
            var=var.handle,
            accum=state["momenta"].handle,
            lr=c(lr),
            grad=scaled.read_value(),
            momentum=c(opt.momentum),
            use_nesterov=opt.use_nesterov,
        )
    elif name == "Adam":
        # beta powers of 0: TF's bias correction factor is exactly 1, the
        # engine's Adam has none. With the sum inside the root,
        # m / sqrt(v + eps^2) is TF's m / (sqrt(v') + 0) for v' = v + eps^2:
        # the velocity goes in raised by eps^2 / beta2 (so that beta2 * v'
        # carries eps^2) and comes out lowered by eps^2.
        inside = opt.sum_inside_sqrt
        raised = opt.epsilon**2
        if inside:
            state["velocities"].assign_add(
                tf.fill(w.shape, c(raised / opt.beta_2))
            )
        raw.ResourceApplyAdam(
            var=var.handle,
            m=state["momenta"].handle,
            v=state["velocities"].handle,
            beta1_power=c(0.0),
            beta2_power=c(0.0),
            lr=c(lr),
            beta1=c(opt.beta_1),
            beta2=c(opt.beta_2),
            epsilon=c(0.0 if inside else opt.epsilon),
            grad=g,
        )
        if inside:
            state["velocities"].assign_sub(tf.fill(w.shape, c(raised)))
    else:
        raw.ResourceApplyFtrlV2(
            var=var.handle,
            accum=state["accumulators"].handle,
            linear=state["linears"].handle,
            grad=g,
            lr=c(lr),
            l1=c(opt.l1_regularization_strength),
            # The engine's beta adds beta / lr to the kernel's quadratic
            # term 1 / lr * accum^-p + 2 * l2 (times lr for
            # multiply_linear_by_lr): an l2 larger by beta / (2 * lr).
            l2=c(opt.l2_regularization_strength + opt.beta / (2 * lr)),
            l2_shrinkage=c(0.0),
            lr_power=c(opt.learning_rate_power),
            multiply_linear_by_lr=opt.multiply_linear_by_learning_rate,
        )
    return var.numpy(), {k: v.numpy() for k, v in state.items()}


# Every variant whose maths a TF kernel has (see `_tf_kernel_step` for the
# rewrites). Not anchored, as TF has no kernel for them: weight decay,
# gradient and weight clipping, AdagradMomentum's exponent other than 2.
KERNEL_CASES = {
    "sgd": kte.optimizers.SGD(0.3),
    "adagrad": kte.optimizers.Adagrad(0.4, initial_accumulator_value=0.2),
    "adam": kte.optimizers.Adam(
        0.1, beta_1=0.8, beta_2=0.95, epsilon=1e-2, sum_inside_sqrt=False
    ),
    "ftrl": kte.optimizers.FTRL(
        0.5,
        learning_rate_power=-0.7,
        l1_regularization_strength=0.3,
        l2_regularization_strength=0.1,
        initial_accumulator_value=0.2,
    ),
    "adam_sum_inside_sqrt": kte.optimizers.Adam(
        0.1, beta_1=0.8, beta_2=0.95, epsilon=0.3, sum_inside_sqrt=True
    ),
    "adagrad_momentum": kte.optimizers.AdagradMomentum(
        0.2, momentum=0.7, epsilon=0.05
    ),
    "adagrad_momentum_nesterov": kte.optimizers.AdagradMomentum(
        0.2, momentum=0.6, use_nesterov=True
    ),
    "adagrad_momentum_beta2": kte.optimizers.AdagradMomentum(
        0.2, momentum=0.5, beta2=0.9, epsilon=0.01, use_nesterov=True
    ),
    "ftrl_beta": kte.optimizers.FTRL(
        0.5,
        learning_rate_power=-0.5,
        l1_regularization_strength=0.2,
        l2_regularization_strength=0.1,
        beta=0.7,
    ),
    "ftrl_beta_linear_by_lr": kte.optimizers.FTRL(
        0.5,
        l1_regularization_strength=0.2,
        l2_regularization_strength=0.05,
        beta=0.4,
        multiply_linear_by_learning_rate=True,
    ),
    "ftrl_linear_by_lr": kte.optimizers.FTRL(
        0.5,
        l1_regularization_strength=0.3,
        l2_regularization_strength=0.05,
        multiply_linear_by_learning_rate=True,
    ),
}


@pytest.mark.parametrize("case", sorted(KERNEL_CASES))
def test_numpy_step_is_tf_training_kernels(case):
    """The reference of every optimizer test, against TF's own kernels."""
    opt = KERNEL_CASES[case]
    rng = np.random.default_rng(2)
    w = rng.normal(size=(5, 3))
    g = rng.normal(size=w.shape)
    slots = {
        s.name: opt.slot_initial_value(s) + rng.uniform(0.1, 1.0, w.shape)
        for s in opt.SLOTS
    }
    if "linears" in slots:  # both signs, some inside the l1 band
        slots["linears"] = rng.normal(scale=0.5, size=w.shape)
    want_w, want_slots = _tf_kernel_step(
        type(opt).__name__, opt, w, slots, g, 0.5
    )
    got_slots = {k: v.copy() for k, v in slots.items()}
    got_w = testing.numpy_step(opt, w, got_slots, g, 0.5)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-10, atol=1e-12)
    assert sorted(got_slots) == sorted(want_slots)
    for name, value in want_slots.items():
        np.testing.assert_allclose(
            got_slots[name], value, rtol=1e-10, atol=1e-12, err_msg=name
        )
    # Not a no-op comparison: the step moved every row.
    assert not np.isclose(want_w, w).all(axis=1).any()


class _Item:
    """What `conftest.pytest_collection_modifyitems` reads of a test item."""

    def __init__(self, path, keywords, markers):
        self.path = pathlib.Path(path)
        self.keywords = {**dict.fromkeys(keywords, 1), **markers}
        self.markers = dict(markers)

    def get_closest_marker(self, name):
        return self.markers.get(name)

    def add_marker(self, marker):
        self.markers[marker.name] = marker


def test_only_the_tpu_marker_skips_a_test_not_a_tpu_folder(monkeypatch):
    # A doctest of a module in a folder named "tpu" (the package had one)
    # carries the folder name among its keywords; it must run, as a test
    # marked `tpu` must be skipped.
    import conftest

    monkeypatch.delenv("TPU_NAME", raising=False)
    doctest = _Item("keras_tpu_embed/engines/conversion.py", ["tpu"], {})
    on_tpu = _Item("tests/x_test.py", [], {"tpu": pytest.mark.tpu.mark})
    conftest.pytest_collection_modifyitems(None, [doctest, on_tpu])
    assert "skip" not in doctest.markers
    assert "fast" in doctest.markers
    assert "skip" in on_tpu.markers
