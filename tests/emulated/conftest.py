"""Emulated-TPU tests: 2 logical CPU devices, configured before TF starts.

This directory is skipped by the normal run (the root `conftest.py`) and
run in its own process by `tests/emulated_tpu_test.py`: splitting the CPU
into logical devices is only possible before TensorFlow's runtime starts,
which the rest of the suite does at once.
"""

import tensorflow as tf

REPLICAS = 2

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS
)
