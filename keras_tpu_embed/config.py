"""`EmbeddingConfig`: the `EmbeddingConfigSpec` of this package."""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable

from keras_tpu_embed import optimizers
from keras_tpu_embed._compat import keras
from keras_tpu_embed.serialization import serializable
from keras_tpu_embed.types import KerasConfig

SUPPORTED_PARTITION_STRATEGIES: tuple[str, ...] = ("div", "mod")
NON_FINITE_UPDATE_MODES: tuple[str, ...] = ("raise", "allow")


def _default_optimizer() -> optimizers.EmbeddingOptimizer:
    return optimizers.SGD(learning_rate=0.01)


@serializable
@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddingConfig:
    """How embedding tables are trained, on the TPU engine and off it.

    The tables are updated by `optimizer` with the TPU embedding engine's
    rules, never by the Keras optimizer passed to `model.compile` (that one
    trains the rest of the model).

    Args:
        optimizer: One of `kte.optimizers.SGD`, `Adagrad`,
            `AdagradMomentum`, `Adam`, `FTRL` (or their
            `tf.tpu.experimental.embedding` twins). Defaults to
            `SGD(learning_rate=0.01)`.
        clipping_limit: If set, every element of a row's gradient (after the
            batch's duplicate ids are summed) is clipped to
            `[-clipping_limit, clipping_limit]`, as `EmbeddingConfigSpec` does.
        pipeline_execution_with_tensor_core: Passed to the TPU engine, where
            it overlaps embedding and TensorCore work at the price of one
            step of staleness; it has no effect off-TPU.
        gradient_multiplier_fn: A function of the global embedding step (the
            number of embedding updates already applied, 0 at the first)
            whose value scales every embedding gradient, before
            `clipping_limit` is applied.
        feature_to_config_dict: Raw `tf.tpu.experimental.embedding`
            `FeatureConfig`s for users who already have them; used by the
            TPU engine path.
        table_to_config_dict: Raw `TableConfig`s, as above.
        partition_strategy: `"div"` or `"mod"`: how table rows are sharded
            over TPU hosts.
        profile_data_directory: Where `kte.profile_lookups(dataset, layer)`
            writes (and later reuses) per-table lookup statistics. On
            SparseCore TPUs, a column fed ragged ids (no width before the
            step) and not in `max_ids_per_example` sizes its buffers from
            its profile's `max_ids_per_example` here.
        non_finite_updates: What an embedding update does when a table's
            gradient holds NaN or inf, which would make every touched row
            NaN while the loss may stay finite. `"raise"` (default): the
            table's update is skipped and the step fails with an
            `InvalidArgumentError` naming the table and the step; XLA drops
            assertions, so in a jit-compiled step the update is only
            skipped. `"allow"`: the update is applied as computed. On the
            TPU embedding engine the check runs on the host before the
            gradients are sent (the whole step's update is skipped).
        max_ids_per_example: On SparseCore TPUs (v5p, v6e and later), the
            most ids one example of a column holds, by column name. The
            SparseCore engine holds each step's ids in buffers of a fixed
            size, which the layer sizes at the first step from the
            per-replica batch and each column's ids per example: the width
            of dense or sparse ids, `max_sequence_length` for sequence
            columns. Columns fed ragged ids (or sparse ids of unknown
            width) must be given here or profiled
            (`profile_data_directory`); the first step raises naming them
            otherwise. A value here wins over the width of the inputs, and
            a step with more ids than it fails with TensorFlow's error. It
            has no effect off SparseCore.

    Example:

    >>> config = EmbeddingConfig(optimizer=optimizers.Adagrad(0.05),
    ...                          clipping_limit=1.0)
    >>> config.partition_strategy
    'div'
    """

    optimizer: optimizers.EmbeddingOptimizer = dataclasses.field(
        default_factory=_default_optimizer
    )
    clipping_limit: float | None = None
    pipeline_execution_with_tensor_core: bool = False
    gradient_multiplier_fn: Callable[[Any], Any] | None = None
    feature_to_config_dict: dict[str, Any] | None = None
    table_to_config_dict: dict[str, Any] | None = None
    partition_strategy: str = "div"
    profile_data_directory: str | None = None
    non_finite_updates: str = "raise"
    max_ids_per_example: dict[str, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "optimizer", optimizers.get(self.optimizer))
        if self.clipping_limit is not None and (
            isinstance(self.clipping_limit, bool)
            or not isinstance(self.clipping_limit, (int, float))
            or self.clipping_limit <= 0
        ):
            raise ValueError(
                "`clipping_limit` must be a positive number or None. "
                f"Received: clipping_limit={self.clipping_limit!r}"
            )
        if self.gradient_multiplier_fn is not None and not callable(
            self.gradient_multiplier_fn
        ):
            raise ValueError(
                "`gradient_multiplier_fn` must be a function of the global "
                f"step. Received: {self.gradient_multiplier_fn!r}"
            )
        if self.partition_strategy not in SUPPORTED_PARTITION_STRATEGIES:
            raise ValueError(
                "Invalid value for argument `partition_strategy`. Expected one "
                f"of {SUPPORTED_PARTITION_STRATEGIES}. Received: "
                f"partition_strategy={self.partition_strategy!r}"
            )
        if self.non_finite_updates not in NON_FINITE_UPDATE_MODES:
            raise ValueError(
                "Invalid value for argument `non_finite_updates`. Expected one "
                f"of {NON_FINITE_UPDATE_MODES}. Received: "
                f"non_finite_updates={self.non_finite_updates!r}"
            )
        _check_max_ids_per_example(self.max_ids_per_example)
        for argument in ("feature_to_config_dict", "table_to_config_dict"):
            value = getattr(self, argument)
            if value is not None and not isinstance(value, dict):
                raise TypeError(
                    f"`{argument}` must be a dict or None. Received: "
                    f"{type(value).__name__}"
                )

    def get_config(self) -> dict[str, Any]:
        if self.feature_to_config_dict or self.table_to_config_dict:
            raise ValueError(
                "An EmbeddingConfig holding raw TF feature_to_config_dict / "
                "table_to_config_dict cannot be serialized; rebuild the layer "
                "with them instead of saving its config."
            )
        return {
            "optimizer": keras.saving.serialize_keras_object(self.optimizer),
            "clipping_limit": self.clipping_limit,
            "pipeline_execution_with_tensor_core": (
                self.pipeline_execution_with_tensor_core
            ),
            "gradient_multiplier_fn": (
                None
                if self.gradient_multiplier_fn is None
                else keras.saving.serialize_keras_object(
                    self.gradient_multiplier_fn
                )
            ),
            "partition_strategy": self.partition_strategy,
            "profile_data_directory": self.profile_data_directory,
            "non_finite_updates": self.non_finite_updates,
            "max_ids_per_example": self.max_ids_per_example,
        }

    @classmethod
    def from_config(cls, config: KerasConfig) -> EmbeddingConfig:
        config = dict(config)
        config["optimizer"] = keras.saving.deserialize_keras_object(
            config["optimizer"]
        )
        if config.get("gradient_multiplier_fn") is not None:
            config["gradient_multiplier_fn"] = (
                keras.saving.deserialize_keras_object(
                    config["gradient_multiplier_fn"]
                )
            )
        return cls(**config)


def _check_max_ids_per_example(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not all(
        isinstance(name, str)
        and isinstance(count, int)
        and not isinstance(count, bool)
        and count > 0
        for name, count in value.items()
    ):
        raise ValueError(
            "`max_ids_per_example` must be a dict of column name to a "
            f"positive int, or None. Received: max_ids_per_example={value!r}"
        )


def as_config(config: EmbeddingConfig | None) -> EmbeddingConfig:
    """`config`, or the default `EmbeddingConfig()` for None.

    Raises:
        TypeError: anything but an `EmbeddingConfig` or None.
    """
    if config is None:
        return EmbeddingConfig()
    if not isinstance(config, EmbeddingConfig):
        raise TypeError(
            "`config` must be a kte.EmbeddingConfig. Received: "
            f"{config!r} (of type {type(config).__name__})"
        )
    return config
