"""The dense XLA lookup (tensor core): XLA compilation, equality with the
host path, and its static-shape pieces."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.lookups import dense_xla

VOCAB, DIM, WIDTH = 12, 3, 4


def _columns(device):
    shape = [None, WIDTH] if device else None
    kwargs = dict(embedding_lookup_device=device, tensor_core_shape=shape)
    identity = kte.categorical_column_with_identity
    weighted = kte.weighted_categorical_column(identity("w", VOCAB), "ww")
    seq = kte.weighted_categorical_column(
        kte.sequence_categorical_column_with_identity("s", VOCAB), "sw"
    )
    own = [
        kte.embedding_column(
            identity("a", VOCAB), DIM, combiner="mean", **kwargs
        ),
        kte.embedding_column(weighted, DIM, combiner="sqrtn", **kwargs),
        kte.embedding_column(
            identity("b", VOCAB), DIM, combiner="sum", **kwargs
        ),
        kte.embedding_column(
            seq, DIM, combiner="sum", max_sequence_length=WIDTH, **kwargs
        ),
    ]
    shared = kte.shared_embedding_columns(
        [
            identity("i", VOCAB),
            kte.sequence_categorical_column_with_identity("h", VOCAB),
        ],
        DIM,
        combiner="mean",
        max_sequence_lengths=[0, 3],
        **kwargs,
    )
    return own, shared


RAW = {
    "a": [[1, 2, 2], [], [11], [0, 3, 4, 5]],
    "w": [[1, 2], [3], [], [4, 4, 5]],
    "ww": [[0.5, 2.0], [0.0], [], [1.0, -1.0, 3.0]],
    "b": [[6, 7, 7, 8], [1], [], [2]],
    "s": [[1, 2, 3], [4], [], [5, 6, 7, 8]],
    "sw": [[1.0, -2.0, 0.5], [3.0], [], [1.0, 1.0, 2.0, 0.5]],
    "i": [[3], [4, 4], [], [9, 10]],
    "h": [[1, 2], [], [3, 4, 5], [6]],
}


def _features(form):
    out = {}
    for key, rows in RAW.items():
        is_weight = key in ("ww", "sw")
        ragged = tf.ragged.constant(
            rows, dtype=tf.float32 if is_weight else tf.int64, ragged_rank=1
        )
        if form == "ragged":
            out[key] = ragged
        elif form == "sparse":
            out[key] = ragged.to_sparse()
        else:
            out[key] = ragged.to_tensor(
                0.0 if is_weight else -1, shape=[4, WIDTH]
            )
    return out


def _layers(device, optimizer=None):
    own, shared = _columns(device)
    config = kte.EmbeddingConfig(optimizer=optimizer or kte.optimizers.SGD(0.1))
    return (
        kte.TPUEmbeddingLayer(own, config=config, return_sequence_lengths=True),
        kte.SharedTPUEmbedding(
            shared, config=config, return_sequence_lengths=True
        ),
    )


def _copy_tables(source, target):
    for s, t in zip(source, target):
        s.build()
        t.build()
        for table in s.table_specs:
            t.table_variable(table.name).assign(s.table_variable(table.name))


def _run(layers, features, training=False):
    out = {}
    for layer in layers:
        out.update(layer(features, training=training))
    return out


@pytest.mark.parametrize("form", ["dense", "ragged", "sparse"])
def test_matches_host_path(form):
    host, core = _layers(None), _layers("tpu_tensor_core")
    _copy_tables(host, core)
    want = _run(host, _features("ragged"))
    got = _run(core, _features(form))
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(
            got[name], want[name], atol=1e-6, err_msg=name
        )


def test_forward_compiles_with_xla():
    core = _layers("tpu_tensor_core")
    features = _features("dense")
    eager = _run(core, features)
    compiled = tf.function(lambda f: _run(core, f), jit_compile=True)
    got = compiled(features)
    for name in eager:
        np.testing.assert_allclose(got[name], eager[name], atol=1e-6)
    # The layer tells Keras it can compile.
    assert all(layer.supports_jit for layer in core)
    assert not any(layer.supports_jit for layer in _layers(None))


def _model(layers, features):
    inputs = {
        k: keras.Input(v.shape[1:], dtype=v.dtype, name=k)
        for k, v in features.items()
    }
    parts = []
    for layer in layers:
        for name, value in layer(inputs).items():
            if name.endswith("_sequence_length"):
                continue
            parts.append(keras.layers.Flatten()(value))
    x = keras.layers.Concatenate()(parts)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


@pytest.mark.parametrize(
    "optimizer",
    [
        kte.optimizers.Adagrad(0.2),
        kte.optimizers.Adam(0.05),
        kte.optimizers.FTRL(0.3, l1_regularization_strength=0.01),
    ],
    ids=["adagrad", "adam", "ftrl"],
)
def test_xla_training_equals_host_training(optimizer):
    features = _features("dense")
    labels = tf.constant([[1.0], [0.0], [1.0], [0.0]])
    host = _layers(None, optimizer)
    core = _layers("tpu_tensor_core", optimizer)
    _copy_tables(host, core)
    host_model, core_model = _model(host, features), _model(core, features)
    core_model.set_weights(host_model.get_weights())
    host_model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=False)
    core_model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=True)
    assert core_model.jit_compile  # Keras kept XLA on: the step compiles
    dataset = tf.data.Dataset.from_tensors((features, labels)).repeat(4)

    def state(layer, table):
        slots = layer.slot_variables(table.name)
        return {
            table.name: layer.table_variable(table.name).numpy(),
            **{f"{table.name}/{k}": v.numpy() for k, v in slots.items()},
        }

    initial = {
        k: v
        for h in host
        for t in h.table_specs
        for k, v in state(h, t).items()
    }
    host_model.fit(dataset, verbose=0)
    core_model.fit(dataset, verbose=0)
    # Equal untrained tables would compare equal: every table and slot moved.
    trained = {
        k: v
        for h in host
        for t in h.table_specs
        for k, v in state(h, t).items()
    }
    unmoved = [k for k in trained if np.array_equal(trained[k], initial[k])]
    assert unmoved == [], unmoved
    for h, c in zip(host, core):
        assert int(c.embedding_step.numpy()) == 4
        for table in h.table_specs:
            np.testing.assert_allclose(
                c.table_variable(table.name).numpy(),
                h.table_variable(table.name).numpy(),
                atol=1e-5,
                err_msg=table.name,
            )
            for slot, variable in h.slot_variables(table.name).items():
                np.testing.assert_allclose(
                    c.slot_variables(table.name)[slot].numpy(),
                    variable.numpy(),
                    atol=1e-5,
                    err_msg=slot,
                )


def test_preprocessor_pads_tensor_core_features_on_the_host():
    own, shared = _columns("tpu_tensor_core")
    pre = kte.FeaturePreprocessor(own + shared)
    out = pre({k: v for k, v in _features("ragged").items()})
    assert out["a"].shape == (4, WIDTH)
    assert out["h"].shape == (4, 3)  # the sequence length, not WIDTH
    np.testing.assert_array_equal(out["a"][3], [0, 3, 4, 5])
    np.testing.assert_array_equal(out["h"][1], [-1, -1, -1])
    assert pre.keras_inputs()["ww"].shape == (None, WIDTH)
    assert not pre.keras_inputs()["ww"].sparse


def test_out_of_range_ids_raise_on_the_tensor_core_path():
    core = _layers("tpu_tensor_core")[0]
    features = _features("dense")
    features["b"] = tf.constant([[12, -1, -1, -1]] * 4, tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'b'"):
        core(features)


@pytest.mark.parametrize("shared", [False, True], ids=["own", "shared"])
def test_sequence_columns_use_max_sequence_length_as_width(shared):
    """The README's rule: sequence columns need no tensor_core_shape."""
    history = kte.sequence_categorical_column_with_identity("history", 30)
    recent = kte.sequence_categorical_column_with_identity("recent", 30)
    ids = {
        "history": tf.constant(
            [[1, 2, 3, 4, 5, 6, 7], [4, -1, -1, -1, -1, -1, -1]]
        ),
        "recent": tf.constant([[9, 8], [-1, -1]]),
    }

    def columns(device):
        if shared:
            return kte.shared_embedding_columns(
                [history, recent],
                8,
                max_sequence_lengths=[5, 3],
                embedding_lookup_device=device,
            )
        return [
            kte.embedding_column(
                history,
                8,
                max_sequence_length=5,
                embedding_lookup_device=device,
            )
        ]

    layer_class = kte.SharedTPUEmbedding if shared else kte.TPUEmbeddingLayer
    dense = layer_class(columns("tpu_tensor_core"))
    host = layer_class(columns(None))
    dense.build()
    host.build()
    table = dense.table_specs[0].name
    host.table_variable(table).assign(dense.table_variable(table))
    want = host(ids)
    got = dense(ids)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].shape[1] == (3 if "recent" in name else 5)
        np.testing.assert_allclose(got[name], want[name], atol=1e-6)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_summed_duplicates_give_each_entry_its_rows_total(jit_compile):
    ids = tf.constant([4, 1, 4, 7, 1, 2], tf.int64)
    gradients = tf.constant([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]])
    kept = tf.constant([True, True, True, False, True, False])
    run = tf.function(dense_xla.summed_duplicates, jit_compile=jit_compile)
    rows, totals, any_kept = run(ids, gradients, kept, 8)
    # Entries not kept go to the first kept row (4) with nothing to add.
    np.testing.assert_array_equal(rows, [4, 1, 4, 4, 1, 4])
    np.testing.assert_array_equal(totals[:, 0], [4.0, 7.0, 4.0, 4.0, 7.0, 4.0])
    assert bool(any_kept)
    _, _, none_kept = run(ids, gradients, tf.zeros([6], tf.bool), 8)
    assert not bool(none_kept)


def test_entry_factors_prune_like_the_sparse_lookup():
    ids = tf.constant([[1, -1, 2, 3]])
    weights = tf.constant([[2.0, 5.0, 0.0, -1.0]])
    kept, factors = dense_xla.entry_factors(ids, weights, "mean", safe=True)
    np.testing.assert_array_equal(kept, [[True, False, False, False]])
    np.testing.assert_array_equal(factors, [[2.0, 0.0, 0.0, 0.0]])
    kept, factors = dense_xla.entry_factors(ids, weights, "sum", safe=True)
    np.testing.assert_array_equal(kept, [[True, False, True, True]])
    np.testing.assert_array_equal(factors, [[2.0, 0.0, 0.0, -1.0]])
    _, ones = dense_xla.entry_factors(ids, None, "sqrtn", safe=False)
    np.testing.assert_array_equal(ones, [[1.0, 0.0, 1.0, 1.0]])


def _weighted_core_layer():
    column = kte.embedding_column(
        kte.weighted_categorical_column(
            kte.categorical_column_with_identity("x", 5), "xw"
        ),
        2,
        combiner="sum",
        embedding_lookup_device="tpu_tensor_core",
        tensor_core_shape=[None, 2],
    )
    layer = kte.TPUEmbeddingLayer([column], output="concat")
    layer.build()
    return layer


def _served(layer, tmp_path):
    """The layer behind a tensor-core export, reloaded."""
    inputs = {
        "x": keras.Input((2,), dtype="int64", name="x"),
        "xw": keras.Input((2,), dtype="float32", name="xw"),
    }
    model = keras.Model(inputs, layer(inputs))
    path = kte.export_saved_model(
        model,
        str(tmp_path / "sm"),
        lookup_device="tpu_tensor_core",
        inputs="ids",
    )
    return kte.load_saved_model(path).signatures["serving_default"]


def test_non_finite_row_0_never_reaches_padding(tmp_path):
    """Padding read row 0 and multiplied it by 0: NaN * 0 is NaN."""
    layer = _weighted_core_layer()
    table_variable = layer.table_variable("x_weighted_by_xw")
    table_variable[0].assign([float("nan"), float("inf")])
    features = {
        "x": tf.constant([[1, -1], [2, 3]], tf.int64),
        "xw": tf.constant([[1.0, 0.0], [1.0, 1.0]]),
    }
    table = layer.table_variable("x_weighted_by_xw").numpy()
    want = [table[1], table[2] + table[3]]
    np.testing.assert_allclose(layer(features), want, rtol=1e-6)
    out = _served(layer, tmp_path)(**features)
    np.testing.assert_allclose(next(iter(out.values())), want, rtol=1e-6)


def test_non_finite_weights_are_refused_on_the_tensor_core(tmp_path):
    layer = _weighted_core_layer()
    features = {
        "x": tf.constant([[1, 2]], tf.int64),
        "xw": tf.constant([[1.0, float("nan")]]),
    }
    with pytest.raises(tf.errors.InvalidArgumentError, match="'xw'"):
        layer(features)
    with pytest.raises(tf.errors.InvalidArgumentError, match="xw"):
        _served(layer, tmp_path)(**features)


def test_out_of_range_ids_are_refused_by_the_tensor_core_export(tmp_path):
    """The compiled gather clamps them; the host side of the export checks."""
    serve = _served(_weighted_core_layer(), tmp_path)
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        serve(x=tf.constant([[7, 1]], tf.int64), xw=tf.constant([[1.0, 1.0]]))


ODD_VOCAB = 1009  # No other dimension of the step has this size.


def _core_training_step(device="tpu_tensor_core"):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", ODD_VOCAB),
        2,
        embedding_lookup_device=device,
        tensor_core_shape=[None, 3] if device else None,
    )
    layer = kte.TPUEmbeddingLayer(
        [column],
        config=kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1)),
        output="concat",
    )
    layer.build()

    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer({"item": ids}, training=True))
        return tape.gradient(loss, layer.trainable_weights)

    return layer, step


@pytest.mark.parametrize("device", ["tpu_tensor_core", None])
def test_training_step_makes_no_vocabulary_sized_tensor(device):
    """The dedupe scratch is a persistent variable, not a per-step tensor:
    no op of the step outputs anything with a vocabulary-sized dimension
    (the table and its slots are only gathered from and scattered into).
    The host path (None) is a control: it never made one."""
    _, step = _core_training_step(device)
    ids = tf.constant([[1, 5, 5], [7, -1, -1]], tf.int64)
    graph = tf.function(step).get_concrete_function(ids).graph
    operations = list(_every_operation(graph))
    # The walk reaches into functions: the step's calls and conds.
    assert any(op.graph is not graph for op in operations)
    sized = [
        (op.type, op.name, output.shape)
        for op in operations
        for output in op.outputs
        if output.shape.rank and ODD_VOCAB in output.shape.as_list()
    ]
    assert sized == []


def _every_operation(graph, seen=None):
    """`graph`'s operations and those of every function they call (the
    branches of `If`, bodies of `While`, `PartitionedCall`s), recursively."""
    seen = set() if seen is None else seen
    for op in graph.get_operations():
        yield op
        for attr in op.node_def.attr.values():
            for name in [attr.func.name] + [f.name for f in attr.list.func]:
                if not name or name in seen:
                    continue
                seen.add(name)
                function = graph._get_function(name)
                assert function is not None and function.graph is not None
                yield from _every_operation(function.graph, seen)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_persistent_scratch_trains_as_a_fresh_one(jit_compile):
    """Steps after the first read a scratch holding the last step's
    positions: the result equals the fresh-scratch dedupe step by step."""
    ids = tf.constant([4, 1, 4, 7, 1, 2], tf.int64)
    gradients = tf.constant([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]])
    kept = tf.constant([True, True, True, False, True, True])
    scratch = tf.Variable(tf.zeros([8], tf.int32), trainable=False)
    run = tf.function(dense_xla.summed_duplicates, jit_compile=jit_compile)
    fresh = tf.function(dense_xla.summed_duplicates, jit_compile=jit_compile)
    for shift in range(3):
        step_ids = (ids + shift) % 8
        got = run(step_ids, gradients, kept, 8, scratch=scratch)
        want = fresh(step_ids, gradients, kept, 8)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    # The scratch holds positions, written in place.
    assert int(tf.reduce_max(scratch)) > 0


def test_scratch_is_not_state(tmp_path):
    """Neither Keras' weights nor a TF checkpoint see the scratch."""
    layer, step = _core_training_step()
    names = sorted(w.path for w in layer.weights)
    step(tf.constant([[1, 5, 5], [7, -1, -1]], tf.int64))
    assert sorted(w.path for w in layer.weights) == names
    assert not any("scratch" in n for n in names)
    saved = tf.train.Checkpoint(layer=layer).write(str(tmp_path / "ckpt"))
    stored = [name for name, _ in tf.train.list_variables(saved)]
    assert any("embedding_tables/item" in n for n in stored), stored
    assert not any("scratch" in n for n in stored), stored


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_unweighted_positions_equal_the_weighted_formula(combiner):
    # Without a weight feature the factor is the weight itself (1 or 0):
    # the same values, row 0 (NaN here) still kept out of padding.
    table = tf.constant([[np.nan, np.inf], [1.5, -2.0], [0.25, 3.0]])
    ids = tf.constant([[1, -1, 2], [-1, -1, 1]], tf.int64)
    kept, factors = dense_xla.entry_factors(ids, None, combiner, safe=True)
    rows = dense_xla.gather_rows(table, ids, kept)
    got = dense_xla.per_position(rows, factors, combiner, weighted=False)
    want = dense_xla.per_position(rows, factors, combiner)
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(got).all()
