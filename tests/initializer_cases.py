"""Table initializers, generated: the cases every hardware kind is tested on.

Every class `keras.initializers` exports joins by construction (seeded
where it takes a seed, with each `VarianceScaling` mode and distribution),
with TF's public initializers and the ways a user gives a pretrained matrix.
A case is `make(shape) -> initializer`: a pretrained matrix has the
table's shape. `tests/initialization_test.py` checks that every Keras class
is a case or named in `NOT_FOR_TABLES`.
"""

import functools
import inspect

import keras
import numpy as np
import tensorflow as tf

SEED = 7

NOT_FOR_TABLES = {
    keras.initializers.Initializer: "the abstract base",
    keras.initializers.STFT: "rank-3 convolution kernels (T, 1, F)",
}

# Rows depend on each other (a QR factorization): made for the whole table.
WHOLE_TABLE_CLASSES = (keras.initializers.Orthogonal,)


def keras_classes():
    """Every initializer class `keras.initializers` exports, once."""
    found = []
    for name in dir(keras.initializers):
        value = getattr(keras.initializers, name)
        if (
            inspect.isclass(value)
            and issubclass(value, keras.initializers.Initializer)
            and value not in found
        ):
            found.append(value)
    return found


def _takes_seed(cls):
    return "seed" in inspect.signature(cls).parameters


def _keras_cases():
    cases = {}
    for cls in keras_classes():
        if cls in NOT_FOR_TABLES:
            continue
        if _takes_seed(cls):
            cases[cls.__name__] = functools.partial(_seeded, cls)
        else:
            cases[cls.__name__] = functools.partial(_plain, cls)
    # Every mode and every distribution, each once.
    for mode, distribution in (
        ("fan_in", "truncated_normal"),
        ("fan_out", "untruncated_normal"),
        ("fan_avg", "uniform"),
    ):
        cases[f"VarianceScaling_{mode}_{distribution}"] = functools.partial(
            _variance_scaling, mode, distribution
        )
    return cases


def _seeded(cls, shape):
    return cls(seed=SEED)


def _plain(cls, shape):
    return cls()


def _variance_scaling(mode, distribution, shape):
    return keras.initializers.VarianceScaling(
        scale=1.7, mode=mode, distribution=distribution, seed=SEED
    )


def matrix(shape):
    """A pretrained table: distinct float64 values, as numpy gives them."""
    rows, dimension = shape
    return np.arange(rows * dimension, dtype=np.float64).reshape(shape) / 7.0


class _Pretrained:
    """A plain class whose instances return the table (no get_config)."""

    def __init__(self, values):
        self.values = values

    def __call__(self, shape, dtype=None):
        return self.values


def _scaled(values, shape, dtype=None, scale=1.0):
    return values * scale


def _lambda_over_matrix(shape):
    values = matrix(shape)
    return lambda shape, dtype=None: values


def _lambda_over_initializer(shape):
    glorot = keras.initializers.GlorotUniform(seed=SEED)
    return lambda shape, dtype=None: glorot(shape, dtype)


PRETRAINED = {
    "Constant_matrix": lambda shape: keras.initializers.Constant(matrix(shape)),
    "tf_constant_initializer_matrix": lambda shape: tf.constant_initializer(
        matrix(shape)
    ),
    "lambda_over_matrix": _lambda_over_matrix,
    "lambda_over_initializer": _lambda_over_initializer,
    "partial": lambda shape: functools.partial(_scaled, matrix(shape) / 3.0),
    "call_class": lambda shape: _Pretrained(matrix(shape)),
}
"""Every way a callable returns a whole table (issue 41, item 7)."""

PRETRAINED_VALUES = {
    "lambda_over_initializer": lambda shape: keras.initializers.GlorotUniform(
        seed=SEED
    )(shape, "float32").numpy(),
    "partial": lambda shape: matrix(shape) / 3.0,
}


def pretrained_values(name, shape):
    """The float32 table a `PRETRAINED` case makes."""
    values = PRETRAINED_VALUES.get(name, matrix)(shape)
    return np.asarray(values, np.float32)


CONSTANTS = {
    "Constant_scalar": lambda shape: keras.initializers.Constant(0.1),
    "Constant_row": lambda shape: keras.initializers.Constant(
        np.arange(shape[1]) / 3.0
    ),
    "Identity_gain": lambda shape: keras.initializers.Identity(gain=-2.0),
    "tf_constant_initializer_scalar": lambda shape: tf.constant_initializer(
        0.3
    ),
    "tf_zeros_initializer": lambda shape: tf.zeros_initializer(),
    "tf_ones_initializer": lambda shape: tf.ones_initializer(),
}

TF_RANDOM = {
    "tf_random_normal_initializer": lambda shape: tf.random_normal_initializer(
        0.5, 2.0, seed=SEED
    ),
    "tf_random_uniform_initializer": lambda shape: (
        tf.random_uniform_initializer(-3.0, 1.0, seed=SEED)
    ),
}

DETERMINISTIC = {**_keras_cases(), **CONSTANTS, **TF_RANDOM, **PRETRAINED}
"""Every case whose table is the same at every call: each shard's rows
must be the one-device table's, bit for bit."""


# Constants hold their matrix: their rows are slices of it. Any other
# callable may compute anything from the shape: it is called for the table.
ROWS_OF_HELD_MATRIX = ("Constant_matrix", "tf_constant_initializer_matrix")
WHOLE_TABLE_CASES = {cls.__name__ for cls in WHOLE_TABLE_CLASSES} | {
    name for name in PRETRAINED if name not in ROWS_OF_HELD_MATRIX
}


def makes_rows_alone(name):
    """Whether the case's rows should be made without the whole table:
    a new Keras class is expected to (or to be named above)."""
    return name not in WHOLE_TABLE_CASES


def random_classes():
    """The Keras classes that draw random numbers (they take a seed)."""
    return [
        cls
        for cls in keras_classes()
        if cls not in NOT_FOR_TABLES
        and cls not in WHOLE_TABLE_CLASSES
        and _takes_seed(cls)
    ]


STATEFUL = {
    **{
        f"{cls.__name__}_seed_generator": functools.partial(
            lambda cls, shape: cls(seed=keras.random.SeedGenerator(SEED)), cls
        )
        for cls in random_classes()
    },
    "tf_random_normal_unseeded": lambda shape: tf.random_normal_initializer(
        0.5, 2.0
    ),
    "tf_random_uniform_unseeded": lambda shape: tf.random_uniform_initializer(
        -3.0, 1.0
    ),
}
"""Cases that draw a new table at every call: their rows are fresh draws,
scaled from the whole table's shape."""


def stateless_twin(name, shape):
    """The integer-seeded initializer a `STATEFUL` case draws like."""
    if name.startswith("tf_random_normal"):
        return TF_RANDOM["tf_random_normal_initializer"](shape)
    if name.startswith("tf_random_uniform"):
        return TF_RANDOM["tf_random_uniform_initializer"](shape)
    cls = getattr(keras.initializers, name.removesuffix("_seed_generator"))
    return cls(seed=SEED)


def recording_calls(monkeypatch, initializer):
    """The shapes `initializer`'s class is called with from now on."""
    owner = next(c for c in type(initializer).__mro__ if "__call__" in vars(c))
    original = owner.__call__
    shapes = []

    def spy(self, shape, dtype=None, **kwargs):
        shapes.append(tuple(int(d) for d in shape))
        return original(self, shape, dtype=dtype, **kwargs)

    monkeypatch.setattr(owner, "__call__", spy)
    return shapes
