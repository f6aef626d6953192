"""Test helpers shared by the test modules.

Keras-style round trips; fresh-process runners and serving feeds; the small
identity table, id batches and numpy references (pooling, one engine step,
a whole training run) that several test modules check the package against.
"""

import dataclasses
import json
import os
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

import keras_tpu_embed as kte

# --- Keras round trips -------------------------------------------------------


def assert_config_round_trip(layer_or_spec):
    """get_config -> from_config -> get_config gives equal JSON."""
    config = layer_or_spec.get_config()
    rebuilt = type(layer_or_spec).from_config(config)
    assert json.dumps(rebuilt.get_config(), sort_keys=True, default=str) == (
        json.dumps(config, sort_keys=True, default=str)
    )
    return rebuilt


def assert_serialization_round_trip(obj):
    """serialize_keras_object / deserialize_keras_object round trip."""
    serialized = keras.saving.serialize_keras_object(obj)
    rebuilt = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(serialized))
    )
    assert type(rebuilt) is type(obj)
    assert keras.saving.serialize_keras_object(rebuilt) == serialized
    return rebuilt


def assert_model_save_load(model, inputs, path):
    """model.save(.keras) + load_model gives the same outputs."""
    expected = model.predict(inputs, verbose=0)
    model.save(path)
    loaded = keras.models.load_model(path)
    actual = loaded.predict(inputs, verbose=0)
    for want, got in zip(
        keras.tree.flatten(expected), keras.tree.flatten(actual)
    ):
        np.testing.assert_allclose(got, want, atol=1e-6)
    return loaded


# --- Fresh processes, serving and saved files --------------------------------


def run_python(*args, timeout=300, cwd=None, env=None, **extra_env):
    """`python *args` in a fresh process; its CompletedProcess (text).

    The environment is `env` (default: this process's) plus `extra_env`.
    """
    environment = dict(os.environ if env is None else env, **extra_env)
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=environment,
    )


# Loads a SavedModel with TensorFlow only and prints its outputs as JSON.
SERVE_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
assert "keras_tpu_embed" not in sys.modules
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
raw = json.loads(sys.argv[2])
feeds = {
    k: tf.constant(v["value"], getattr(tf, v["dtype"])) for k, v in raw.items()
}
out = serve(**feeds)
print(json.dumps({k: v.numpy().astype(np.float64).tolist()
                  for k, v in out.items()}))
assert "keras_tpu_embed" not in sys.modules
"""


def feeds(raw):
    """Raw features `{key: {"value": ..., "dtype": ...}}` as tensors."""
    return {
        k: tf.constant(v["value"], getattr(tf, v["dtype"]))
        for k, v in raw.items()
    }


def serve_in_fresh_process(path, raw):
    """The serving signature's outputs on `raw`, from a fresh process
    that never imports keras_tpu_embed; float64 numpy arrays by name."""
    completed = run_python(
        "-c", SERVE_SCRIPT, str(path), json.dumps(raw), TF_CPP_MIN_LOG_LEVEL="3"
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    outputs = json.loads(completed.stdout.strip().splitlines()[-1])
    return {name: np.array(value) for name, value in outputs.items()}


def fit_on_raw(model, preprocessor, raw, epochs=2):
    """Fits `model` on the one batch `raw` (tensors), labels all ones."""
    batch_size = next(iter(raw.values())).shape[0]
    data = tf.data.Dataset.from_tensors((raw, tf.ones([batch_size, 1]))).map(
        lambda x, y: (preprocessor(x), y)
    )
    model.fit(data, epochs=epochs, verbose=0)


def serving_weights(model):
    """The weights a serving export keeps: no slots, step or trap."""
    return [
        w
        for w in model.weights
        if not any(
            t in w.path
            for t in ("accumulators", "embedding_step", "table_update_trigger")
        )
    ]


def flip_byte(path, offset_from_end=8):
    """Damages a file in place: one byte near its end inverted."""
    with open(path, "r+b") as handle:
        handle.seek(-offset_from_end, os.SEEK_END)
        byte = handle.read(1)
        handle.seek(-offset_from_end, os.SEEK_END)
        handle.write(bytes([byte[0] ^ 0xFF]))


# --- A small identity table, its id batches, numpy references ----------------

VOCAB, DIM = 8, 3
"""Vocabulary size and dimension of `identity_column`'s table."""

BATCHES = [
    [[1, 1, 2], [2, 3, -1], [5, -1, -1]],
    [[1, 4, 4], [4, -1, -1], [-1, -1, -1]],
    [[6, 6, 6], [1, 2, 3], [2, -1, -1]],
    [[7, 1, -1], [1, 1, 1], [0, -1, -1]],
    [[3, 3, -1], [5, 6, 7], [4, 4, 2]],
]
"""Dense id batches of 3 examples (`-1` pads) for a table of `VOCAB` rows:
ids repeat within an example and across examples, some examples are empty."""

OPTIMIZER_CASES = {
    "sgd": kte.optimizers.SGD(
        0.3, weight_decay_factor=0.05, clip_weight_min=-1.5
    ),
    "adagrad": kte.optimizers.Adagrad(
        0.4,
        initial_accumulator_value=0.2,
        clipvalue=0.5,
        weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True,
    ),
    "adagrad_momentum": kte.optimizers.AdagradMomentum(
        0.2, momentum=0.8, exponent=2.0, epsilon=1e-3
    ),
    "adagrad_momentum_nesterov": kte.optimizers.AdagradMomentum(
        0.2,
        momentum=0.5,
        use_nesterov=True,
        exponent=3.0,
        beta2=0.9,
        epsilon=1e-2,
        clip_weight_max=1.0,
    ),
    "adam": kte.optimizers.Adam(0.1, beta_1=0.8, beta_2=0.95, epsilon=1e-3),
    "adam_outside_sqrt": kte.optimizers.Adam(
        0.1, sum_inside_sqrt=False, epsilon=1e-2, clipvalue=(-0.2, 0.3)
    ),
    "adam_dense": kte.optimizers.Adam(0.05, lazy_adam=False),
    "ftrl": kte.optimizers.FTRL(
        0.5,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.1,
        beta=0.3,
        initial_accumulator_value=0.2,
    ),
    "ftrl_linear_by_lr": kte.optimizers.FTRL(
        0.5,
        learning_rate_power=-0.7,
        l1_regularization_strength=0.02,
        l2_regularization_strength=0.05,
        multiply_linear_by_learning_rate=True,
        weight_decay_factor=0.01,
    ),
}
"""Every optimizer family with every option it has, each set off its default."""


def identity_column(
    key="ids", combiner="sum", vocabulary_size=VOCAB, dimension=DIM, **kwargs
):
    """An embedding column on `categorical_column_with_identity(key)`."""
    return kte.embedding_column(
        kte.categorical_column_with_identity(key, vocabulary_size),
        dimension,
        combiner=combiner,
        **kwargs,
    )


def train_steps(layer, batches, upstream, key="ids"):
    """One training call per batch; the gradient of
    `sum(output * upstream)` runs the layer's embedding updates."""
    for ids in batches:
        with tf.GradientTape() as tape:
            out = layer({key: tf.constant(ids)}, training=True)
            loss = tf.reduce_sum(out[f"{key}_embedding"] * upstream)
        tape.gradient(loss, layer.trainable_weights)


def numpy_lookup(table, batch, combiner, safe, sequence_length):
    """`tf.feature_column`'s lookup of `batch` in numpy.

    `batch` holds one list of `(id, weight)` pairs per example. Pooled
    (`sequence_length` 0): `[batch, dim]`; sequence: each position's row
    scaled by its combiner, `[batch, sequence_length, dim]`, zero-padded.
    With `safe`, mean and sqrtn drop non-positive weights.
    """
    dim = table.shape[1]
    out = (
        np.zeros((len(batch), sequence_length, dim))
        if sequence_length
        else np.zeros((len(batch), dim))
    )
    for r, row in enumerate(batch):
        if sequence_length:
            for p, (i, w) in enumerate(row[:sequence_length]):
                if safe and combiner != "sum" and w <= 0:
                    continue
                scale = {
                    "sum": w,
                    "mean": 1.0 if w else 0.0,
                    "sqrtn": float(np.sign(w)),
                }[combiner]
                out[r, p] = scale * table[i]
            continue
        pairs = [
            (i, w)
            for i, w in row
            if not (safe and combiner != "sum" and w <= 0)
        ]
        total = sum((w * table[i] for i, w in pairs), np.zeros(dim))
        if combiner == "mean":
            denom = sum(w for _, w in pairs)
        elif combiner == "sqrtn":
            denom = np.sqrt(sum(w * w for _, w in pairs))
        else:
            denom = 1.0
        out[r] = total / denom if denom else 0.0
    return out


def numpy_table_gradient(ids, upstream, vocabulary_size, combiner="sum"):
    """The gradient of `sum(pooled(ids) * upstream)` for the table.

    `ids`: dense, `-1` pads; unweighted. Each id occurrence adds its
    example's upstream row, scaled as `combiner` scales it.
    """
    gradient = np.zeros((vocabulary_size, upstream.shape[1]))
    for row, row_ids in enumerate(ids):
        valid = [i for i in row_ids if i >= 0]
        scale = {
            "sum": 1.0,
            "mean": 1.0 / max(len(valid), 1),
            "sqrtn": 1.0 / np.sqrt(max(len(valid), 1)),
        }[combiner]
        for i in valid:
            gradient[i] += scale * upstream[row]
    return gradient


def numpy_step(opt, w, slots, g, lr):
    """One engine step on full-table arrays for the rows in `g`'s mask.

    Written from the engine's documented formulas
    (`optimization_parameters.proto`, SparseCore optimizer computations),
    not from the package's code. Updates `slots` in place.
    """
    low, high = opt.gradient_clip_bounds
    g = np.clip(
        g, -np.inf if low is None else low, np.inf if high is None else high
    )
    if opt.weight_decay_factor:
        decay = opt.weight_decay_factor
        if opt.multiply_weight_decay_factor_by_learning_rate:
            decay *= lr
        w = w - decay * w
    name = type(opt).__name__
    if name == "SGD":
        w = w - lr * g
    elif name == "Adagrad":
        slots["accumulators"] = slots["accumulators"] + g**2
        w = w - lr * g / np.sqrt(slots["accumulators"])
    elif name == "AdagradMomentum":
        if opt.beta2 == 1:
            acc = slots["accumulators"] + g**2
        else:
            acc = opt.beta2 * slots["accumulators"] + (1 - opt.beta2) * g**2
        scaled = g * (acc + opt.epsilon) ** (-1.0 / opt.exponent)
        mom = opt.momentum * slots["momenta"] + scaled
        step = opt.momentum * mom + scaled if opt.use_nesterov else mom
        slots.update(accumulators=acc, momenta=mom)
        w = w - lr * step
    elif name == "Adam":
        m = opt.beta_1 * slots["momenta"] + (1 - opt.beta_1) * g
        v = opt.beta_2 * slots["velocities"] + (1 - opt.beta_2) * g**2
        if opt.sum_inside_sqrt:
            w = w - lr * m / np.sqrt(v + opt.epsilon**2)
        else:
            w = w - lr * m / (np.sqrt(v) + opt.epsilon)
        slots.update(momenta=m, velocities=v)
    elif name == "FTRL":
        k = -opt.learning_rate_power
        a0 = slots["accumulators"]
        a1 = a0 + g**2
        l1, l2 = opt.l1_regularization_strength, opt.l2_regularization_strength
        if opt.multiply_linear_by_learning_rate:
            z = slots["linears"] + lr * g - (a1**k - a0**k) * w
            w = (np.clip(z, -l1 * lr, l1 * lr) - z) / (
                a1**k + 2 * lr * l2 + opt.beta
            )
        else:
            z = slots["linears"] + g - (a1**k - a0**k) * w / lr
            w = (np.clip(z, -l1, l1) - z) / ((a1**k + opt.beta) / lr + 2 * l2)
        slots.update(accumulators=a1, linears=z)
    lo = -np.inf if opt.clip_weight_min is None else opt.clip_weight_min
    hi = np.inf if opt.clip_weight_max is None else opt.clip_weight_max
    return np.clip(w, lo, hi)


def numpy_training(
    optimizer,
    table,
    batches,
    upstream,
    *,
    learning_rate,
    multiplier,
    clipping_limit,
    combiner="sum",
):
    """What `train_steps` must leave in a table and its slots, in numpy.

    Per step: the table gradient, times `multiplier(step)`, clipped to
    `clipping_limit`, then `numpy_step` at `learning_rate(step)` on the
    touched rows (every row for optimizers that update all rows).

    Returns:
        The table and a dict of slots, float64.
    """
    w = np.array(table, np.float64)
    slots = {
        slot.name: np.full_like(w, optimizer.slot_initial_value(slot))
        for slot in optimizer.SLOTS
    }
    for step, ids in enumerate(batches):
        grad = numpy_table_gradient(ids, upstream, len(w), combiner)
        grad = np.clip(grad * multiplier(step), -clipping_limit, clipping_limit)
        touched = sorted({i for r in ids for i in r if i >= 0})
        if optimizer.updates_all_rows():
            touched = list(range(len(w)))
        new_slots = {k: v[touched].copy() for k, v in slots.items()}
        w[touched] = numpy_step(
            optimizer, w[touched], new_slots, grad[touched], learning_rate(step)
        )
        for k, v in new_slots.items():
            slots[k][touched] = v
    return w, slots


def assert_update_matches_numpy(optimizer, learning_rate=0.1, seed=0):
    """`optimizer.update` on random float64 rows, slots and gradient equals
    `numpy_step`'s rule. `update` is the rule alone, so the optimizer is
    compared without its clipvalue, weight decay and weight clipping."""
    optimizer = dataclasses.replace(
        optimizer,
        clipvalue=None,
        weight_decay_factor=None,
        clip_weight_min=None,
        clip_weight_max=None,
    )
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(4, 3))
    gradient = rng.normal(size=rows.shape)
    slots = {
        slot.name: optimizer.slot_initial_value(slot)
        + rng.uniform(0.1, 1.0, rows.shape)
        for slot in optimizer.SLOTS
    }
    got_rows, got_slots = optimizer.update(
        tf.constant(rows),
        {name: tf.constant(value) for name, value in slots.items()},
        tf.constant(gradient),
        tf.constant(learning_rate, tf.float64),
    )
    want_slots = dict(slots)
    want_rows = numpy_step(optimizer, rows, want_slots, gradient, learning_rate)
    np.testing.assert_allclose(got_rows, want_rows, rtol=1e-10)
    assert sorted(got_slots) == sorted(want_slots)
    for name, value in want_slots.items():
        np.testing.assert_allclose(got_slots[name], value, rtol=1e-10)


def host_op_types(serve):
    """The op types a loaded signature `serve` runs outside XLA: its graph
    and every function it calls that is not compiled, followed (an `If`'s
    branches too); XLA-compiled functions are counted as one op, `XLA`."""
    library = {
        f.signature.name: f for f in serve.graph.as_graph_def().library.function
    }

    def compiled(name):
        attr = library[name].attr
        return "_XlaMustCompile" in attr and attr["_XlaMustCompile"].b

    def reached(nodes, seen):
        types = set()
        for node in nodes:
            called = [
                node.attr[key].func.name
                for key in ("f", "then_branch", "else_branch")
                if key in node.attr and node.attr[key].func.name in library
            ]
            if not called:
                types.add(node.op)
            for name in called:
                if compiled(name):
                    types.add("XLA")
                else:
                    types.add(node.op)
                    if name not in seen:
                        seen.add(name)
                        types |= reached(library[name].node_def, seen)
        return types

    return reached(serve.graph.as_graph_def().node, set())


def xla_programs(serve):
    """Per XLA-compiled function of a loaded signature `serve`, the op
    types it runs, those of the functions it calls included."""
    library = {
        f.signature.name: f for f in serve.graph.as_graph_def().library.function
    }

    def reached(name, seen):
        ops = set()
        for node in library[name].node_def:
            ops.add(node.op)
            called = node.attr["f"].func.name if "f" in node.attr else ""
            if called in library and called not in seen:
                seen.add(called)
                ops |= reached(called, seen)
        return ops

    return {
        name: reached(name, {name})
        for name, f in library.items()
        if "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b
    }
