"""No legacy column argument slips through: each is honoured or refused.

The constructors' signatures come from the installed TensorFlow, so an
argument it adds fails the first test until it is handled. The second
builds every accepted constructor with its arguments at a default and then
with each honoured argument changed: the converted column must change
exactly where that argument lands, to its value (a dropped argument would
convert to the same column, a misrouted one elsewhere), and each refused
value must raise an error naming the argument.
"""

import dataclasses
import functools
import inspect
import os

import keras
import pytest
import tensorflow as tf

from keras_tpu_embed import columns as conversion
from keras_tpu_embed.columns import legacy_arguments
from keras_tpu_embed.columns.categorical import CategoricalColumn

fc = tf.feature_column
HERE = os.path.dirname(os.path.abspath(__file__))


def _constructor(dotted):
    value = tf
    for part in dotted.split(".")[1:]:
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("dotted", sorted(legacy_arguments.LEGACY_ARGUMENTS))
def test_every_argument_of_every_constructor_is_listed(dotted):
    parameters = inspect.signature(_constructor(dotted)).parameters
    listed = legacy_arguments.LEGACY_ARGUMENTS[dotted]
    assert set(parameters) == set(listed), dotted


def _describe(value):
    """A comparable form of a converted column (initializers by config)."""
    if dataclasses.is_dataclass(value):
        return {
            f.name: _describe(getattr(value, f.name))
            for f in dataclasses.fields(value)
        }
    if isinstance(value, CategoricalColumn):  # weighted: properties
        return _describe(value.get_config())
    if isinstance(value, dict):
        return {k: _describe(v) for k, v in value.items()}
    if isinstance(value, keras.initializers.Initializer):
        return keras.saving.serialize_keras_object(value)
    return value


def _convert(dotted, kwargs):
    constructor = _constructor(dotted)
    with tf.Graph().as_default():  # shared_embeddings needs graph mode
        built = constructor(**kwargs)
        if "categorical_columns" in kwargs:
            return [_describe(conversion.to_embedding_column(c)) for c in built]
        if "dimension" in kwargs:
            return _describe(conversion.to_embedding_column(built))
        if dotted.endswith("numeric_column"):
            built = fc.bucketized_column(built, [0.5])
        return _describe(conversion.to_categorical_column(built))


def _schedule(step):
    return 0.1


@functools.cache
def _cases(vocabulary):
    identity = fc.categorical_column_with_identity
    sequence = fc.sequence_categorical_column_with_identity
    embedding_base = {
        "categorical_column": identity("a", 5),
        "dimension": 2,
        "initializer": keras.initializers.Zeros(),
    }
    checkpoint = {"ckpt_to_load_from": "/c", "tensor_name_in_ckpt": "t"}
    fc_embedding_variants = {
        "categorical_column": {"categorical_column": identity("b", 5)},
        "dimension": {"dimension": 3},
        "combiner": {"combiner": "sum"},
        "initializer": {"initializer": keras.initializers.Ones()},
        "ckpt_to_load_from": checkpoint,
        "tensor_name_in_ckpt": checkpoint,
        "max_norm": {"max_norm": 0.5},
        "trainable": {"trainable": False},
        "use_safe_embedding_lookup": {"use_safe_embedding_lookup": False},
    }
    shared_base = {
        "categorical_columns": [identity("a", 5), identity("b", 5)],
        "dimension": 2,
        "initializer": keras.initializers.Zeros(),
    }
    shared_variants = dict(
        fc_embedding_variants,
        categorical_columns={
            "categorical_columns": [identity("a", 5), identity("c", 5)]
        },
        shared_embedding_collection_name={
            "shared_embedding_collection_name": "t"
        },
    )
    del shared_variants["categorical_column"]
    tpu_variants = {
        name: fc_embedding_variants[name]
        for name in (
            "categorical_column",
            "dimension",
            "combiner",
            "initializer",
            "use_safe_embedding_lookup",
        )
    }
    tpu_variants.update(
        learning_rate_fn={"learning_rate_fn": _schedule},
        embedding_lookup_device={"embedding_lookup_device": "cpu"},
        # TF keeps tensor_core_shape only with a device: compared there.
        tensor_core_shape=(
            {"embedding_lookup_device": "tpu_tensor_core"},
            {"tensor_core_shape": [None, 3]},
        ),
    )
    tpu_shared_variants = {
        k: v for k, v in tpu_variants.items() if k != "categorical_column"
    }
    tpu_shared_variants.update(
        categorical_columns=shared_variants["categorical_columns"],
        shared_embedding_collection_name=shared_variants[
            "shared_embedding_collection_name"
        ],
        max_sequence_lengths={
            "categorical_columns": [identity("a", 5), sequence("s", 5)],
            "max_sequence_lengths": [0, 4],
        },
    )
    file_base = {"key": "f", "vocabulary_file": vocabulary}
    file_variants = {
        "key": {"key": "g"},
        "vocabulary_file": {"vocabulary_file": vocabulary + ".other"},
        "vocabulary_size": {"vocabulary_size": 2},
        "dtype": {"vocabulary_file": vocabulary + ".int", "dtype": tf.int64},
        "default_value": {"default_value": 0},
        "num_oov_buckets": {"num_oov_buckets": 2},
    }
    list_base = {"key": "l", "vocabulary_list": ["x", "y"]}
    list_variants = {
        "key": {"key": "m"},
        "vocabulary_list": {"vocabulary_list": ["y", "x"]},
        "dtype": {"vocabulary_list": [1, 2], "dtype": tf.int32},
        "default_value": {"default_value": 1},
        "num_oov_buckets": {"num_oov_buckets": 2},
    }
    hash_base = {"key": "h", "hash_bucket_size": 5}
    hash_variants = {
        "key": {"key": "i"},
        "hash_bucket_size": {"hash_bucket_size": 6},
        "dtype": {"dtype": tf.int64},
    }
    identity_base = {"key": "i", "num_buckets": 5}
    identity_variants = {
        "key": {"key": "j"},
        "num_buckets": {"num_buckets": 6},
        "default_value": {"default_value": 1},
    }
    numeric = fc.numeric_column
    bucketized_base = {"source_column": numeric("n"), "boundaries": [1.0]}
    prefix = "tf.feature_column."
    cases = {
        prefix + "bucketized_column": (
            bucketized_base,
            {
                "source_column": {"source_column": numeric("n", shape=2)},
                "boundaries": {"boundaries": [1.0, 2.0]},
            },
        ),
        prefix + "crossed_column": (
            {"keys": ["a", "b"], "hash_bucket_size": 5},
            {
                "keys": {
                    "keys": ["a", fc.bucketized_column(numeric("n"), [1])]
                },
                "hash_bucket_size": {"hash_bucket_size": 6},
                "hash_key": {"hash_key": 7},
            },
        ),
        # Through a bucketized column: a numeric column alone gives no ids.
        prefix + "numeric_column": (
            {"key": "n"},
            {
                "key": {"key": "m"},
                "shape": {"shape": 2},
                "default_value": {"default_value": 1.0},
                "dtype": {"dtype": tf.int64},
                "normalizer_fn": {"normalizer_fn": abs},
            },
        ),
        prefix + "embedding_column": (embedding_base, fc_embedding_variants),
        "tf.compat.v1.feature_column.embedding_column": (
            embedding_base,
            fc_embedding_variants,
        ),
        prefix + "shared_embeddings": (shared_base, shared_variants),
        "tf.compat.v1.tpu.experimental.embedding_column": (
            embedding_base,
            dict(
                tpu_variants,
                max_sequence_length={
                    "categorical_column": sequence("s", 5),
                    "max_sequence_length": 4,
                },
            ),
        ),
        "tf.compat.v1.tpu.experimental.shared_embedding_columns": (
            shared_base,
            tpu_shared_variants,
        ),
        prefix + "categorical_column_with_identity": (
            identity_base,
            identity_variants,
        ),
        prefix + "sequence_categorical_column_with_identity": (
            identity_base,
            identity_variants,
        ),
        prefix + "categorical_column_with_vocabulary_list": (
            list_base,
            list_variants,
        ),
        prefix + "sequence_categorical_column_with_vocabulary_list": (
            list_base,
            list_variants,
        ),
        prefix + "categorical_column_with_vocabulary_file": (
            file_base,
            dict(file_variants, file_format={"file_format": "tfrecord_gzip"}),
        ),
        "tf.compat.v1.feature_column.categorical_column_with_vocabulary_file": (
            file_base,
            file_variants,
        ),
        prefix + "sequence_categorical_column_with_vocabulary_file": (
            file_base,
            file_variants,
        ),
        prefix + "categorical_column_with_hash_bucket": (
            hash_base,
            hash_variants,
        ),
        prefix + "sequence_categorical_column_with_hash_bucket": (
            hash_base,
            hash_variants,
        ),
        prefix + "weighted_categorical_column": (
            {"categorical_column": identity("a", 5), "weight_feature_key": "w"},
            {
                "categorical_column": {"categorical_column": identity("b", 5)},
                "weight_feature_key": {"weight_feature_key": "v"},
                "dtype": {"dtype": tf.float64},
            },
        ),
    }
    return cases


# Values refused by design: the error must name the argument.
REFUSED_VALUES = {
    (
        "tf.feature_column.categorical_column_with_vocabulary_file",
        "file_format",
    ),
    ("tf.feature_column.numeric_column", "normalizer_fn"),
}


def _flat(description, prefix=""):
    """A converted column's description as {"a.b" or "[i].a": leaf}."""
    if isinstance(description, dict):
        items = [
            (f"{prefix}.{k}" if prefix else k, v)
            for k, v in description.items()
        ]
    elif isinstance(description, list):
        items = [(f"{prefix}[{i}]", v) for i, v in enumerate(description)]
    else:
        return {prefix: description}
    flat = {}
    for path, value in items:
        flat.update(_flat(value, path))
    return flat


def _changed(reference, converted):
    """Every leaf the change moved, with its new value."""
    before, after = _flat(reference), _flat(converted)
    return {
        path: after.get(path, "<absent>")
        for path in sorted(set(before) | set(after))
        if before.get(path, "<absent>") != after.get(path, "<absent>")
    }


def _leaf(value):
    """An argument's value as the converted column holds it."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, tf.DType):
        return value.name
    return value


def _crossed_with_bucketized(keys):
    return keys[0] == "a" and keys[1].boundaries == (1.0,)


# What each honoured argument must change, where the argument's own field
# holding its value (the default) is not the whole story.
SPECIAL_CHANGES = {
    "categorical_column": {"categorical_column.key": "b"},
    "initializer": {"initializer.class_name": "Ones"},
    "max_sequence_length": {
        "categorical_column.key": "s",
        "categorical_column.is_sequence": True,
        "max_sequence_length": 4,
    },
    ("crossed_column", "keys"): {
        "keys": _crossed_with_bucketized,
        "key_dtypes": ("string",),
    },
    ("bucketized_column", "source_column"): {"source_column.shape": (2,)},
    ("numeric_column", "key"): {"source_column.key": "m"},
    ("numeric_column", "shape"): {"source_column.shape": (2,)},
    ("numeric_column", "default_value"): {
        "source_column.default_value": (1.0,)
    },
    ("numeric_column", "dtype"): {"source_column.dtype": "int64"},
}
# Shared constructors: changes to the columns themselves, not to each.
SHARED_CHANGES = {
    "categorical_columns": {
        "[0].shared_embedding_collection_name": "a_c_shared_embedding",
        "[1].shared_embedding_collection_name": "a_c_shared_embedding",
        "[1].categorical_column.key": "c",
    },
    "max_sequence_lengths": {
        "[0].shared_embedding_collection_name": "a_s_shared_embedding",
        "[1].shared_embedding_collection_name": "a_s_shared_embedding",
        "[1].categorical_column.key": "s",
        "[1].categorical_column.is_sequence": True,
        "[1].max_sequence_length": 4,
    },
}


def _expected_change(dotted, argument, change):
    """The converted column's leaves that `change` must move, and to what:
    by default each changed argument's own field to its value."""
    short = dotted.split(".")[-1]
    if short.startswith("shared_"):  # a list of columns: each changes
        if argument in SHARED_CHANGES:
            return SHARED_CHANGES[argument]
        each = _expected_change(
            "tf.feature_column.embedding_column", argument, change
        )
        return {f"[{i}].{k}": v for i in (0, 1) for k, v in each.items()}
    for key in ((short, argument), argument):
        if key in SPECIAL_CHANGES:
            return SPECIAL_CHANGES[key]
    return {k: _leaf(v) for k, v in change.items()}


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vocabulary")
    path = str(directory / "v.txt")
    for name, text in (("", "a\nb\nc\n"), (".other", "c\nb\na\n")):
        with open(path + name, "w") as handle:
            handle.write(text)
    with open(path + ".int", "w") as handle:
        handle.write("1\n2\n3\n")
    return path


def test_every_honoured_argument_changes_the_converted_column(vocabulary):
    cases = _cases(vocabulary)
    table = legacy_arguments.LEGACY_ARGUMENTS
    honoured = {
        (dotted, argument)
        for dotted, arguments in table.items()
        for argument, (status, _) in arguments.items()
        if status == legacy_arguments.HONOURED
    }
    covered = {(d, a) for d, (_, variants) in cases.items() for a in variants}
    # Each honoured argument has a case here: none is left unchecked.
    assert honoured <= covered
    assert covered - honoured <= REFUSED_VALUES
    for dotted, (common, variants) in cases.items():
        for argument, change in variants.items():
            base = common
            if isinstance(change, tuple):  # (what the base adds, change)
                extra, change = change
                base = dict(common, tensor_core_shape=[None, 4], **extra)
            reference = _convert(dotted, base)
            assert reference == _convert(dotted, base), dotted  # no noise
            kwargs = dict(base, **change)
            if (dotted, argument) in REFUSED_VALUES:
                with pytest.raises((ValueError, TypeError), match=argument):
                    _convert(dotted, kwargs)
                continue
            changed = _changed(reference, _convert(dotted, kwargs))
            want = _expected_change(dotted, argument, change)
            assert set(changed) == set(want), (dotted, argument, changed)
            for path, value in want.items():
                ok = (
                    value(changed[path])
                    if callable(value)
                    else (changed[path] == value)
                )
                assert ok, (dotted, argument, path, changed[path])


@pytest.mark.parametrize(
    "dotted",
    sorted(
        dotted
        for dotted, arguments in legacy_arguments.LEGACY_ARGUMENTS.items()
        if all(s == legacy_arguments.REFUSED for s, _ in arguments.values())
    ),
)
def test_refused_constructors_are_refused_by_name(dotted):
    identity = fc.categorical_column_with_identity
    samples = {
        "tf.compat.v1.feature_column.shared_embedding_columns": lambda: (
            tf.compat.v1.feature_column.shared_embedding_columns(
                [identity("a", 5), identity("b", 5)], 2
            )[0]
        ),
    }
    with tf.Graph().as_default():
        column = samples[dotted]()
        with pytest.raises(TypeError, match=type(column).__name__):
            if "embedding" in dotted:
                conversion.to_embedding_column(column)
            else:
                conversion.to_categorical_column(column)


def test_migration_guide_has_the_current_migration_table():
    guide = os.path.join(HERE, os.pardir, "docs", "migration.md")
    with open(guide) as handle:
        readme = handle.read()
    assert legacy_arguments.migration_table() in readme
