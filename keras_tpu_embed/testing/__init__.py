"""Testing without a TPU: `emulated_tpu`, a TPU system on CPU devices."""

from keras_tpu_embed.testing.emulated_tpu import (
    EmulatedTPUStrategy as EmulatedTPUStrategy,
)
from keras_tpu_embed.testing.emulated_tpu import emulated_tpu as emulated_tpu

__all__ = ["EmulatedTPUStrategy", "emulated_tpu"]
