"""Test helpers shared by the test modules.

Keras-style round trips; fresh-process runners and serving feeds; the small
identity table, id batches and numpy references (pooling, one engine step,
a whole training run) that several test modules check the package against.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

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
