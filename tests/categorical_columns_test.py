"""The `categorical_column_with_*` factories, as TF spells them."""

import tensorflow as tf

import keras_tpu_embed as kte
from keras_tpu_embed.columns import categorical
from keras_tpu_embed.columns import input_keys


def test_each_factory_builds_its_spec(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a\nb\n")
    built = {
        categorical.IdentityColumn: kte.categorical_column_with_identity(
            "i", 3
        ),
        categorical.VocabularyListColumn: (
            kte.categorical_column_with_vocabulary_list("l", ["x"])
        ),
        categorical.VocabularyFileColumn: (
            kte.categorical_column_with_vocabulary_file("f", path)
        ),
        categorical.HashedColumn: kte.categorical_column_with_hash_bucket(
            "h", 4
        ),
    }
    for spec, column in built.items():
        assert type(column) is spec
        assert not column.is_sequence
    # A pathlib.Path is accepted and stored as a string.
    assert built[categorical.VocabularyFileColumn].vocabulary_file == str(path)


def test_sequence_factories_build_the_sequence_form(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a\nb\n")
    factories = [
        (
            kte.sequence_categorical_column_with_identity,
            kte.categorical_column_with_identity,
            ("i", 3, 1),
        ),
        (
            kte.sequence_categorical_column_with_vocabulary_list,
            kte.categorical_column_with_vocabulary_list,
            ("l", ["x", "y"], None, -1, 2),
        ),
        (
            kte.sequence_categorical_column_with_vocabulary_file,
            kte.categorical_column_with_vocabulary_file,
            ("f", str(path), None, 1),
        ),
        (
            kte.sequence_categorical_column_with_hash_bucket,
            kte.categorical_column_with_hash_bucket,
            ("h", 4, "int64"),
        ),
    ]
    for sequence_factory, flat_factory, arguments in factories:
        sequence, flat = sequence_factory(*arguments), flat_factory(*arguments)
        assert sequence.is_sequence and not flat.is_sequence
        assert sequence.get_config() == dict(
            flat.get_config(), is_sequence=True
        )


def test_vocabulary_list_dtype_is_inferred_from_the_tokens():
    words = kte.categorical_column_with_vocabulary_list("a", ["x", "y"])
    assert words.dtype == "string"
    numbers = kte.categorical_column_with_vocabulary_list("a", [5, 2])
    assert numbers.dtype == "int64" and numbers.vocabulary_list == (5, 2)
    narrow = kte.categorical_column_with_vocabulary_list(
        "a", [5, 2], dtype=tf.int32
    )
    assert narrow.dtype == "int32"


def test_input_keys_lists_ids_then_weights_once():
    tags = kte.weighted_categorical_column(
        kte.categorical_column_with_hash_bucket("tags", 5), "tag_w"
    )
    item = kte.categorical_column_with_identity("item", 5)
    columns = [tags, item, kte.embedding_column(tags, 2)]
    assert input_keys(columns) == ["tags", "tag_w", "item"]
