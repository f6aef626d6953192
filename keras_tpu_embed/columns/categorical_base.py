"""What every categorical column kind gives: the `CategoricalColumn` base.

A kind is a frozen dataclass under this base (`categorical.py`,
`derived.py`, or a user's own): its feature key and id count, and the
answers that the rest of the package asks of every column instead of
switching on its type: `id_mapping()` (raw features to ids),
`out_of_range_id`, `vocabulary()`, `vocabulary_files()` /
`with_vocabulary_files()` (`.keras` assets), `numeric_sources` (parse
spec) and `crossed_padding` (serving signature). The defaults here are
those of a kind with none of these.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING
from typing import Any
from typing import Mapping
from typing import Protocol

from keras_tpu_embed._compat import tf
from keras_tpu_embed.types import KerasConfig
from keras_tpu_embed.types import LookupTable
from keras_tpu_embed.types import Tensor


class IdMapping(Protocol):
    """How one column turns its raw features into ids.

    Attributes:
        table: The `tf.lookup` table the mapping holds (tracked by a
            SavedModel), or None.
    """

    table: LookupTable | None

    def __call__(self, features: Mapping[str, Tensor]) -> tf.SparseTensor:
        """The column's ids `[batch, n]` from the raw `features` it reads
        (`column.raw_inputs`)."""


class VocabularyFile(Protocol):
    """A column that reads a vocabulary file (`VocabularyFileColumn`)."""

    @property
    def key(self) -> str:
        """The column's feature key."""

    @property
    def vocabulary_file(self) -> str:
        """The file's path."""

    @property
    def vocabulary_size(self) -> int | None:
        """The lines it reads."""


class CategoricalColumn:
    """Base of the categorical specs: a feature key and a number of ids."""

    key: str
    is_sequence: bool

    @property
    def name(self) -> str:
        """The column's name, as `tf.feature_column` names it."""
        return self.key

    @property
    def feature_key(self) -> str:
        """The key of the ids feature in the input dict."""
        return self.key

    # The key of the weights feature; only weighted columns have one.
    weight_feature_key: str | None = None

    if TYPE_CHECKING:
        # A field of some specs, a property of others.
        @property
        def num_buckets(self) -> int:
            """The number of distinct ids: the table's row count."""

    @property
    def input_dtype(self) -> str:
        """The dtype of the raw feature: `"string"` or an integer dtype."""
        return "int64"

    @property
    def base(self) -> CategoricalColumn:
        """The column that maps raw values to ids (unwraps weighting)."""
        return self

    @property
    def raw_inputs(self) -> dict[str, str]:
        """The raw features the ids come from (not weights), with dtypes.

        The ids feature itself for most columns; bucketized and crossed
        columns read other features (`derived.py`).
        """
        return {self.feature_key: self.input_dtype}

    @property
    def numeric_sources(self) -> dict[str, Any]:
        """The numeric columns whose numbers the ids come from, by key
        (their `tf.io.parse_example` spec is a fixed-length one)."""
        return {}

    @property
    def crossed_padding(self) -> dict[str, Any]:
        """Raw keys this column crosses -> their padding value (`""`, or
        -1 for integer keys); a dense input's padding is crossed like a
        value, so a serving signature drops it first."""
        return {}

    def id_mapping(self) -> IdMapping:
        """The object that maps this column's raw features to ids.

        Each kind gives its own (`id_mapping.py`); a new kind gives one
        with a `table` (None, or its `tf.lookup` table) and a call from
        the features of `raw_inputs` to a `[batch, n]` SparseTensor.
        """
        raise NotImplementedError(
            f"Column kind {type(self).__name__} gives no id_mapping(): "
            "define it, returning an object with `table` and a call from "
            "raw features to ids (see keras_tpu_embed.columns.id_mapping)."
        )

    @property
    def out_of_range_id(self) -> int | None:
        """The id that ids outside `[0, num_buckets)` map to at lookup.

        None, so that they raise, except for identity columns with a
        `default_value`.
        """
        return None

    def vocabulary(self) -> tuple[list[Any], bool] | None:
        """The column's tokens in id order and whether they are strings;
        None for a kind without a vocabulary."""
        return None

    def vocabulary_files(self) -> list[VocabularyFile]:
        """The columns under this one that read a vocabulary file."""
        return []

    def with_vocabulary_files(self, moved: dict[str, str]) -> CategoricalColumn:
        """This column reading each vocabulary file at `moved[file]`."""
        return self

    def get_config(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
        }

    @classmethod
    def from_config(cls, config: KerasConfig) -> Any:
        return cls(**config)
