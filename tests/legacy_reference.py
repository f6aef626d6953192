"""Computes legacy feature-column outputs for `reference_cases`.

Run as a subprocess with `TF_USE_LEGACY_KERAS=1`, so that `tf.keras` is
`tf_keras` (Keras 2) and `DenseFeatures` / `SequenceFeatures` exist. Runs in
graph mode because `tf.feature_column.shared_embeddings` requires it.

Usage: python legacy_reference.py WORK_DIR OUTPUT.npz
"""

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_cases as cases  # noqa: E402


def _table_name(column):
    categorical = column.categorical_column
    return categorical.name


def main(work_dir, output_path):
    vocabulary = cases.write_vocabulary(work_dir)
    results = {}
    with tf.Graph().as_default():
        features = {
            key: cases.reference_input(key)
            for key in list(cases.RAW) + list(cases.NUMERIC)
        }
        fetches, assignments = {}, []

        def assign(layer_variables, name):
            for variable in layer_variables:
                shape = variable.shape.as_list()
                values = cases.table_values(name, shape)
                assignments.append(variable.assign(values))

        dense = (
            cases.dense_columns(vocabulary)
            + cases.max_norm_columns()
            + cases.derived_columns()
            + [cases.weighted_sum_column()]
        )
        for index, column in enumerate(dense):
            layer = tf.keras.layers.DenseFeatures([column], name=f"df{index}")
            key = column.name + ("__sum" if index == len(dense) - 1 else "")
            fetches[key] = layer(features)
            assign(layer.variables, _table_name(column))

        # Crossed columns cross a dense input's padding like a value:
        # their outputs for dense ("", -1 padded) inputs, too.
        dense_features = dict(features)
        dense_features.update(
            {key: cases.dense_input(key) for key in cases.RAW}
        )
        for index, column in enumerate(cases.derived_columns()):
            layer = tf.keras.layers.DenseFeatures([column], name=f"dd{index}")
            fetches[column.name + "__dense"] = layer(dense_features)
            assign(layer.variables, _table_name(column))

        shared = tf.feature_column.shared_embeddings(
            cases.shared_categorical_columns(), 5, combiner="mean"
        )
        for column in shared:
            layer = tf.keras.layers.DenseFeatures([column])
            fetches[column.name] = layer(features)
        shared_variables = [
            v
            for v in tf.compat.v1.global_variables()
            if "s1_s2_shared_embedding" in v.name
        ]
        assert len(shared_variables) == 1, shared_variables
        assign(shared_variables, "s1_s2_shared_embedding")

        for column, _ in cases.sequence_columns():
            layer = tf.keras.experimental.SequenceFeatures([column])
            value, length = layer(features)
            fetches[column.name] = value
            fetches[column.name + "__length"] = length
            assign(layer.variables, _table_name(column))

        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.tables_initializer())
            session.run(assignments)
            results = session.run(fetches)
    np.savez(output_path, **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
