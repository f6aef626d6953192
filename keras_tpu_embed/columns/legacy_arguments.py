"""What becomes of every argument of every legacy column constructor.

`LEGACY_ARGUMENTS` lists, per constructor of `tf.feature_column`,
`tf.compat.v1.feature_column` and `tf.compat.v1.tpu.experimental`, each of
its arguments with what this package does with it: honoured (and where),
or refused (and what to do instead). A test compares it with the
constructors' signatures in the installed TensorFlow, so that an argument
TensorFlow adds cannot go unhandled, and the migration table of the README
is generated from it (`migration_table`).
"""

from __future__ import annotations

HONOURED = "honoured"
REFUSED = "refused"

_SAME = "kept as given"
_KEY = "the input feature's key"
_ENGINE_NOTE = (
    "on the host, tensor-core and serving lookups; the TPU embedding engine "
    "refuses the column at build, naming it"
)

_IDENTITY = {
    "key": (HONOURED, _KEY),
    "num_buckets": (HONOURED, "the table's row count"),
    "default_value": (
        HONOURED,
        "id of inputs >= num_buckets; without it they are an error",
    ),
}
_VOCABULARY_LIST = {
    "key": (HONOURED, _KEY),
    "vocabulary_list": (HONOURED, _SAME),
    "dtype": (HONOURED, "string or integer; inferred when None, as TF does"),
    "default_value": (HONOURED, "id of out-of-vocabulary values"),
    "num_oov_buckets": (HONOURED, "hashed as TF hashes them"),
}
_VOCABULARY_FILE = {
    "key": (HONOURED, _KEY),
    "vocabulary_file": (
        HONOURED,
        "read and checked at construction; an asset of exports",
    ),
    "vocabulary_size": (HONOURED, "the first lines only; all when None"),
    "dtype": (HONOURED, "string or integer"),
    "default_value": (HONOURED, "id of out-of-vocabulary values"),
    "num_oov_buckets": (HONOURED, "hashed as TF hashes them"),
}
_HASH_BUCKET = {
    "key": (HONOURED, _KEY),
    "hash_bucket_size": (HONOURED, "TF's fingerprint hash"),
    "dtype": (HONOURED, "integers hashed through their decimal string"),
}
_EMBEDDING_COMMON = {
    "dimension": (HONOURED, _SAME),
    "combiner": (HONOURED, "mean, sum or sqrtn"),
    "initializer": (
        HONOURED,
        "TF's default truncated normal becomes Keras' TruncatedNormal",
    ),
    "use_safe_embedding_lookup": (HONOURED, "prunes invalid ids and weights"),
}
_FEATURE_COLUMN_EMBEDDING = {
    **_EMBEDDING_COMMON,
    "ckpt_to_load_from": (
        HONOURED,
        "the table starts from that checkpoint tensor at build (every "
        "path); a missing tensor or another shape is an error",
    ),
    "tensor_name_in_ckpt": (HONOURED, "with ckpt_to_load_from"),
    "max_norm": (
        HONOURED,
        f"rows clipped to the norm before combining, {_ENGINE_NOTE}",
    ),
    "trainable": (
        HONOURED,
        f"False: never updated, no optimizer slots, {_ENGINE_NOTE}",
    ),
}
_TPU_EMBEDDING = {
    **_EMBEDDING_COMMON,
    "learning_rate_fn": (HONOURED, "function of the embedding step"),
    "embedding_lookup_device": (
        HONOURED,
        "cpu, tpu_tensor_core or tpu_embedding_core",
    ),
    "tensor_core_shape": (
        HONOURED,
        "width of the dense XLA lookup (TF keeps it only with an "
        "embedding_lookup_device)",
    ),
}
_WEIGHTED = {
    "categorical_column": (HONOURED, "converted"),
    "weight_feature_key": (HONOURED, _SAME),
    "dtype": (HONOURED, "a float dtype"),
}

LEGACY_ARGUMENTS: dict[str, dict[str, tuple[str, str]]] = {
    "tf.feature_column.categorical_column_with_identity": _IDENTITY,
    "tf.feature_column.sequence_categorical_column_with_identity": _IDENTITY,
    "tf.feature_column.categorical_column_with_vocabulary_list": (
        _VOCABULARY_LIST
    ),
    "tf.feature_column.sequence_categorical_column_with_vocabulary_list": (
        _VOCABULARY_LIST
    ),
    "tf.feature_column.categorical_column_with_vocabulary_file": {
        **_VOCABULARY_FILE,
        "file_format": (
            HONOURED,
            "'text' (None for text paths); 'tfrecord_gzip' is refused: "
            "write the tokens to a text file",
        ),
    },
    "tf.compat.v1.feature_column.categorical_column_with_vocabulary_file": (
        _VOCABULARY_FILE
    ),
    "tf.feature_column.sequence_categorical_column_with_vocabulary_file": (
        _VOCABULARY_FILE
    ),
    "tf.feature_column.categorical_column_with_hash_bucket": _HASH_BUCKET,
    "tf.feature_column.sequence_categorical_column_with_hash_bucket": (
        _HASH_BUCKET
    ),
    "tf.feature_column.weighted_categorical_column": _WEIGHTED,
    "tf.feature_column.numeric_column": {
        "key": (HONOURED, "the numeric feature (source of bucketized ids)"),
        "shape": (HONOURED, "numbers per example; one id range each"),
        "default_value": (HONOURED, "in make_parse_example_spec"),
        "dtype": (HONOURED, "cast to float32 before bucketizing, as TF does"),
        "normalizer_fn": (
            REFUSED,
            "a Python function cannot travel in saved configs and serving "
            "exports: apply it in the input pipeline",
        ),
    },
    "tf.feature_column.bucketized_column": {
        "source_column": (HONOURED, "a numeric_column, dense input"),
        "boundaries": (HONOURED, "TF's Bucketize op, TF's id ranges"),
    },
    "tf.feature_column.crossed_column": {
        "keys": (
            HONOURED,
            "feature keys (string or integer) and bucketized columns; other "
            "categorical columns are refused by name (cross their raw key)",
        ),
        "hash_bucket_size": (HONOURED, "TF's sparse_cross_hashed"),
        "hash_key": (HONOURED, "passed to sparse_cross_hashed"),
    },
    "tf.feature_column.embedding_column": {
        "categorical_column": (HONOURED, "converted"),
        **_FEATURE_COLUMN_EMBEDDING,
    },
    "tf.compat.v1.feature_column.embedding_column": {
        "categorical_column": (HONOURED, "converted"),
        **_FEATURE_COLUMN_EMBEDDING,
    },
    "tf.feature_column.shared_embeddings": {
        "categorical_columns": (HONOURED, "converted"),
        "shared_embedding_collection_name": (HONOURED, "the table's name"),
        **_FEATURE_COLUMN_EMBEDDING,
    },
    "tf.compat.v1.feature_column.shared_embedding_columns": {
        name: (
            REFUSED,
            "the column kind (TF1's _SharedEmbeddingColumn) is refused by "
            "name when converted; use tf.feature_column.shared_embeddings "
            "or kte.shared_embedding_columns",
        )
        for name in (
            "categorical_columns",
            "dimension",
            "combiner",
            "initializer",
            "shared_embedding_collection_name",
            "ckpt_to_load_from",
            "tensor_name_in_ckpt",
            "max_norm",
            "trainable",
            "use_safe_embedding_lookup",
        )
    },
    "tf.compat.v1.tpu.experimental.embedding_column": {
        "categorical_column": (HONOURED, "converted"),
        "max_sequence_length": (HONOURED, "pads and truncates sequences"),
        **_TPU_EMBEDDING,
    },
    "tf.compat.v1.tpu.experimental.shared_embedding_columns": {
        "categorical_columns": (HONOURED, "converted"),
        "shared_embedding_collection_name": (HONOURED, "the table's name"),
        "max_sequence_lengths": (HONOURED, "one per column"),
        **_TPU_EMBEDDING,
    },
}
"""Per constructor, per argument: `(HONOURED or REFUSED, what happens)`."""


def migration_table() -> str:
    """The README's table: legacy argument -> what the package does.

    Returns:
        A Markdown table, one row per constructor argument.

    Example:

    >>> table = migration_table()
    >>> table.splitlines()[0]
    '| Constructor | Argument | Status | What keras_tpu_embed does |'
    >>> "| `max_norm` | honoured |" in table
    True
    """
    lines = [
        "| Constructor | Argument | Status | What keras_tpu_embed does |",
        "|---|---|---|---|",
    ]
    for constructor, arguments in LEGACY_ARGUMENTS.items():
        for argument, (status, effect) in arguments.items():
            lines.append(
                f"| `{constructor}` | `{argument}` | {status} | {effect} |"
            )
    return "\n".join(lines)
