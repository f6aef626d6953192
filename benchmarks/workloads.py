"""The benchmark workloads W1-W3: their shapes and deterministic data.

Every candidate reads the same batches, drawn once from a seeded numpy
generator, in the form it handles best (ragged, sparse, or dense padded with
-1); the conversion happens before timing, as a real input pipeline would do
it on the host. Ids are uniform over the vocabulary: the worst case for
caches, and the case the gather-bandwidth bound describes.

Features (W1):
    bag     multi-hot, 1-15 ids per example (mean 8), combiner mean,
            table `bag` [bag_rows, 64].
    single  one id per example, table `single` [single_rows, 32].
    seq_a,  sequences of 1-24 ids, `max_sequence_length` 20, sharing
    seq_b   table `seq` [seq_rows, 64]; output [batch, 20, 64] each.

W2 mean-pools the two sequences over their valid positions and trains
Dense(256, relu) -> Dense(1) on the concatenation with binary
cross-entropy; the tables learn with Adagrad(0.05, accumulator 0.1).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

SEED = 20240606
LEARNING_RATE = 0.05
INITIAL_ACCUMULATOR = 0.1
BAG_MAX = 15
SEQUENCE_MAX = 24
MAX_SEQUENCE_LENGTH = 20
SEQUENCE_FEATURES = ("seq_a", "seq_b")
HIDDEN = 256
SCALE_ROWS = (10_000, 1_000_000, 10_000_000)
"""W3: the sizes of the big tables (in cache; beyond it; 10x beyond)."""
QUICK_SCALE_ROWS = (1_000, 5_000, 20_000)


@dataclasses.dataclass(frozen=True)
class Workload:
    """Shapes of one workload; `rows` sizes the two big tables."""

    name: str
    batch_size: int = 4096
    rows: int = 1_000_000
    single_rows: int = 100_000
    bag_dim: int = 64
    single_dim: int = 32
    seq_dim: int = 64
    training: bool = False
    batches: int = 8

    def table_shapes(self) -> dict[str, tuple[int, int]]:
        return {
            "bag": (self.rows, self.bag_dim),
            "single": (self.single_rows, self.single_dim),
            "seq": (self.rows, self.seq_dim),
        }

    def table_bytes(self) -> int:
        return sum(r * d * 4 for r, d in self.table_shapes().values())

    def dense_model_bytes(self) -> int:
        width = self.bag_dim + self.single_dim + 2 * self.seq_dim
        return (width * HIDDEN + HIDDEN + HIDDEN + 1) * 4


def workload(name: str, quick: bool = False, rows: int | None = None) -> Any:
    """W1 (serving), W2 (training); W3 is W2 at each `rows` of SCALE_ROWS."""
    scale = (
        {"batch_size": 256, "rows": 5_000, "single_rows": 1_000, "batches": 2}
        if quick
        else {}
    )
    if rows is not None:
        scale["rows"] = rows
    return Workload(name=name, training=name != "W1", **scale)


@dataclasses.dataclass(frozen=True)
class Ragged:
    """Ids of one feature for one batch: flat values and row lengths."""

    values: np.ndarray
    lengths: np.ndarray

    def dense(self, width: int, pad: float = -1) -> np.ndarray:
        """`[batch, width]`, padded with `pad`, truncated to `width`."""
        out = np.full((len(self.lengths), width), pad, self.values.dtype)
        mask = np.arange(width)[None, :] < self.lengths[:, None]
        starts = np.cumsum(self.lengths) - self.lengths
        index = starts[:, None] + np.arange(width)[None, :]
        out[mask] = self.values[index[mask]]
        return out

    def sparse_indices(self) -> np.ndarray:
        """`[n, 2]` (example, position) of each value."""
        rows = np.repeat(np.arange(len(self.lengths)), self.lengths)
        starts = np.cumsum(self.lengths) - self.lengths
        return np.stack([rows, np.arange(len(rows)) - starts[rows]], axis=1)

    def truncated(self, width: int) -> "Ragged":
        keep = self.sparse_indices()[:, 1] < width
        return Ragged(self.values[keep], np.minimum(self.lengths, width))


@dataclasses.dataclass(frozen=True)
class Batch:
    """One batch: ids per feature and, for training, labels `[batch, 1]`."""

    features: dict[str, Ragged]
    labels: np.ndarray

    def gathered_rows(self) -> dict[str, int]:
        """Rows each table must read for this batch (truncated sequences)."""
        seq = sum(
            int(np.minimum(self.features[f].lengths, MAX_SEQUENCE_LENGTH).sum())
            for f in SEQUENCE_FEATURES
        )
        return {
            "bag": int(self.features["bag"].lengths.sum()),
            "single": int(self.features["single"].lengths.sum()),
            "seq": seq,
        }


def _ragged(rng: np.random.Generator, lengths: np.ndarray, rows: int) -> Any:
    values = rng.integers(0, rows, int(lengths.sum()), dtype=np.int64)
    return Ragged(values, lengths.astype(np.int64))


def make_batches(spec: Workload, seed: int = SEED) -> list[Batch]:
    """`spec.batches` batches, identical for every candidate and run."""
    rng = np.random.default_rng(seed)
    batches = []
    size = spec.batch_size
    for _ in range(spec.batches):
        features = {
            "bag": _ragged(rng, rng.integers(1, BAG_MAX + 1, size), spec.rows),
            "single": _ragged(rng, np.ones(size, np.int64), spec.single_rows),
        }
        for name in SEQUENCE_FEATURES:
            lengths = rng.integers(1, SEQUENCE_MAX + 1, size)
            features[name] = _ragged(rng, lengths, spec.rows)
        labels = rng.integers(0, 2, (size, 1)).astype(np.float32)
        batches.append(Batch(features, labels))
    return batches
