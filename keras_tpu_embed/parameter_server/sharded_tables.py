"""Tables sharded over TensorFlow's parameter servers, each shard made there.

Under `tf.distribute.experimental.ParameterServerStrategy` each table and
each of its slots is a `ShardedVariable`: its rows split into one shard per
parameter server, contiguous, the first `rows % shards` shards one row
longer (TF's "div" layout, the only one `ShardedVariable`'s scatters and
`tf.nn.embedding_lookup` accept). Each shard is placed by the strategy's
round robin on its own server, and its initial rows are computed there by
`EngineInitializer` from the shard's offset: bit for bit the rows the same
column's table has on one device, and never the whole table on the
coordinator.

Keras' `add_weight` cannot ask for that alone: it gives `tf.Variable` a
callable without `shape`, and the strategy then evaluates a partitioned
variable's value whole on the coordinator and slices it
(`parameter_server_strategy_v2.py`, `_create_variable`). So the table is
created through `add_weight` (a Keras variable, tracked and named as on one
device) inside a `tf.variable_creator_scope` that replaces the one
`tf.Variable` Keras asks for with the shards, each created by the
strategy's own creator with its shape and its rows.

Only the tables are sharded: a strategy given a `variable_partitioner`
would shard Keras' dense weights too, which Keras' optimizer cannot update
(`ParameterServerStrategyExtended._update` takes resource variables only),
so `placement/hardware.py` refuses one.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any
from typing import Callable

from keras_tpu_embed._compat import keras
from keras_tpu_embed._compat import tf
from keras_tpu_embed._tf_private import keras_track_variable
from keras_tpu_embed._tf_private import parameter_server_count
from keras_tpu_embed._tf_private import sharded_variable_class
from keras_tpu_embed._tf_private import sharded_variable_saveables
from keras_tpu_embed.types import InitializerLike
from keras_tpu_embed.types import ShardedTableValue
from keras_tpu_embed.types import Tensor

PARAMETER_SERVER_STRATEGY = tf.distribute.experimental.ParameterServerStrategy


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard's place in its table: what `EngineInitializer` reads as
    `shard_info` (TF's `ShardInfo` has the same two fields)."""

    offset: tuple[int, int]
    shape: tuple[int, int]


def on_parameter_servers() -> bool:
    """Whether the strategy in scope is `ParameterServerStrategy` (TF2)."""
    return isinstance(tf.distribute.get_strategy(), PARAMETER_SERVER_STRATEGY)


def shard_layout(shape: tuple[int, int], shards: int) -> list[Shard]:
    """TF's "div" layout of `shape`'s rows over at most `shards` shards.

    >>> [s.offset[0] for s in shard_layout((10, 4), 3)]
    [0, 4, 7]
    >>> [s.shape for s in shard_layout((2, 4), 3)]
    [(1, 4), (1, 4)]
    """
    rows, dimension = shape
    count = max(1, min(shards, rows))
    base, extra = divmod(rows, count)
    layout, offset = [], 0
    for index in range(count):
        size = base + (1 if index < extra else 0)
        layout.append(Shard((offset, 0), (size, dimension)))
        offset += size
    return layout


def create_sharded_table(
    layer: keras.layers.Layer,
    name: str,
    shape: tuple[int, int],
    rows_of: Callable[..., Tensor],
) -> Any:
    """A non-trainable float32 weight of `layer` whose value is a
    `ShardedVariable` over the parameter servers, each shard initialized
    on its server (see the module docstring).

    Args:
        layer: The layer that owns the table.
        name: The table's (or slot's) name.
        shape: The whole table's shape.
        rows_of: Called as `rows_of(shape, dtype, shard_info)` for each
            shard's rows (`lookup.initialization.EngineInitializer`).
    """
    strategy = tf.distribute.get_strategy()
    layout = shard_layout(shape, parameter_server_count(strategy))
    # What `layer.add_weight` does, with a variable that makes its shards.
    with keras.name_scope(layer.name, caller=layer):
        variable = ShardedTable(
            layout,
            rows_of,
            strategy,
            # Never called: `ShardedTable` makes the values.
            initializer=keras.initializers.Zeros(),
            shape=shape,
            dtype="float32",
            trainable=False,
            autocast=False,
            name=name,
        )
    keras_track_variable(layer, variable)
    return variable


class ShardedTable(keras.Variable):  # type: ignore[misc]
    """A Keras variable whose value is made shard by shard on the servers.

    Keras creates a variable's value in `_initialize_with_initializer`,
    at once or, in a symbolic build, when the build's stateless scope ends
    (`keras/src/backend/common/stateless_scope.py`): both take the
    creator below, which makes the shards instead of the one `tf.Variable`
    Keras asks for.
    """

    def __init__(
        self,
        layout: list[Shard],
        rows_of: Callable[..., Tensor],
        strategy: Any,
        **kwargs: Any,
    ) -> None:
        self._table_shards = layout
        self._rows_of = rows_of
        self._strategy = strategy
        super().__init__(**kwargs)

    def _initialize_with_initializer(
        self, initializer: InitializerLike
    ) -> None:
        with self._strategy.scope(), tf.variable_creator_scope(self._shards):
            super()._initialize_with_initializer(initializer)

    def _gather_saveables_for_checkpoint(self) -> Any:
        # One slice per shard, saved on its server, under the key a table
        # on one device has (`ShardedVariable`'s saveables); Keras'
        # `_serialize_to_tensors` would hand TF's saver the
        # `ShardedVariable` whole, which it cannot place ("no attribute
        # 'device'", `functional_saver.py`). TF takes this method over
        # that one when the class defines it first in its MRO
        # (`saveable_object_util.trackable_has_serialize_to_tensor`).
        return sharded_variable_saveables(self.value)

    def _shards(self, next_creator: Any, **kwargs: Any) -> Any:
        shape = tuple(int(d) for d in self._shape)
        shards = []
        for index, shard in enumerate(self._table_shards):
            shards.append(
                next_creator(
                    initial_value=functools.partial(
                        self._rows_of, shape, tf.float32, shard
                    ),
                    shape=shard.shape,
                    dtype=tf.float32,
                    trainable=False,
                    name=f"{kwargs['name']}/part_{index}",
                )
            )
        return sharded_variable_class()(shards, name=kwargs["name"])


def sharded_value(table: ShardedTableValue) -> Any:
    """The `ShardedVariable` itself, out of the Keras variable holding it
    (or any other table's TF value)."""
    value: Any = table.value if isinstance(table, keras.Variable) else table
    return value


def is_sharded(table: ShardedTableValue) -> bool:
    """Whether `table` is a `ShardedVariable` (a table on parameter
    servers), or a Keras variable holding one."""
    return isinstance(sharded_value(table), sharded_variable_class())


def shards_of(table: ShardedTableValue) -> list[Any]:
    """The shard variables of a sharded table, in row order."""
    shards: list[Any] = list(sharded_value(table).variables)
    return shards
