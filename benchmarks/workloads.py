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


# ---------------------------------------------------------------------- W4

CRITEO_KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683,
    8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15,
    286181, 105, 142572,
)  # fmt: skip
"""Distinct values of the 26 categorical features of the Criteo Kaggle
(Display Advertising Challenge) data set, as DLRM's preprocessing counts
them (`kaggleAdDisplayChallenge_processed.npz`, the counts the DLRM paper's
Kaggle runs size their tables with). Source used here: the list in
github.com/real-zhangzhe/wukong, `exp/train_wukong_on_criteo_kaggle_dataset.py`
("from dataset.npz"). TorchRec's `torchrec/datasets/criteo.py` /
`scripts/nvt/utils/criteo_constant.py` `NUM_EMBEDDINGS_PER_FEATURE` holds the
Criteo 1TB counts instead (four features at its 40,000,000 cap)."""

CRITEO_ROW_CAP = 10_000_000
CRITEO_DIM = 16
CRITEO_NUMERIC = 13
CRITEO_SEED = 20261124
ZIPF_EXPONENT = 1.1
CRITEO_BOTTOM = (64, CRITEO_DIM)
"""The bottom MLP on the 13 numeric features (relu), ending at `dim`, as in
DLRM (its Kaggle run: 512-256-64-16)."""
CRITEO_TOP = (256, 64)
"""The top MLP (relu) on the pairwise dot products and the bottom output,
then Dense(1) (DLRM's Kaggle run: 512-256-1)."""
CRITEO_CLICK_RATE = 0.25
"""Labels are Bernoulli at about Criteo's click rate (~26%)."""


QUICK_CRITEO_FEATURES = (1, 2, 8, 13, 20, 25)
"""The Kaggle features a `quick` W4 keeps (by index): tracing and compiling
the models grows with their tables, and the smoke test needs every kind of
table, not 26: under the row cap (583 rows), capped (cat_2, cat_20, cat_25),
and the smallest (3 rows) and a small one (27)."""


@dataclasses.dataclass(frozen=True)
class CriteoWorkload:
    """W4: 26 one-id categorical features with Criteo Kaggle's cardinalities
    (each capped at `row_cap`), `dim` 16, 13 numeric features, Zipf ids;
    `kept`, the features by index, is a subset only in a quick run."""

    name: str = "W4"
    batch_size: int = 4096
    row_cap: int = CRITEO_ROW_CAP
    dim: int = CRITEO_DIM
    batches: int = 8
    training: bool = True
    kept: tuple[int, ...] = tuple(range(len(CRITEO_KAGGLE_CARDINALITIES)))

    def cardinalities(self) -> tuple[int, ...]:
        return tuple(
            min(CRITEO_KAGGLE_CARDINALITIES[i], self.row_cap) for i in self.kept
        )

    def features(self) -> tuple[str, ...]:
        return tuple(f"cat_{i}" for i in self.kept)

    def table_shapes(self) -> dict[str, tuple[int, int]]:
        return {
            name: (rows, self.dim)
            for name, rows in zip(self.features(), self.cardinalities())
        }

    def table_bytes(self) -> int:
        return sum(r * d * 4 for r, d in self.table_shapes().values())


def criteo_workload(
    quick: bool = False, row_cap: int | None = None
) -> CriteoWorkload:
    """W4 at full size (rows capped at 10^7), or `quick` (rows capped at
    2,000, batch 256, 2 batches, the 6 tables of `QUICK_CRITEO_FEATURES`:
    seconds), or with another `row_cap`."""
    scale: dict[str, Any] = (
        {
            "batch_size": 256,
            "row_cap": 2_000,
            "batches": 2,
            "kept": QUICK_CRITEO_FEATURES,
        }
        if quick
        else {}
    )
    if row_cap is not None:
        scale["row_cap"] = row_cap
    return CriteoWorkload(**scale)


_ZIPF_MULTIPLIER = 2_654_435_761
"""Knuth's multiplicative-hash prime: rank r -> id `(r - 1) * m mod rows`
spreads the hot ids over the table, as a real vocabulary's would be."""


def zipf_ids(
    rng: np.random.Generator,
    rows: int,
    size: int,
    exponent: float = ZIPF_EXPONENT,
) -> np.ndarray:
    """`size` ids in `[0, rows)`: Zipf ranks (`P(r) ~ r**-exponent`, the
    distribution truncated to `rows` ranks by rejection), each rank mapped
    to an id by a fixed bijection."""
    ranks = np.empty(0, np.int64)
    while len(ranks) < size:
        draws = rng.zipf(exponent, 2 * size)
        ranks = np.concatenate([ranks, draws[draws <= rows]])
    multiplier = _ZIPF_MULTIPLIER % rows
    while np.gcd(multiplier, rows) != 1:  # a bijection needs a unit
        multiplier += 1
    return ((ranks[:size] - 1) * multiplier) % rows


@dataclasses.dataclass(frozen=True)
class CriteoBatch:
    """One W4 batch: `[batch]` int64 ids per feature, `[batch, 13]`
    float32 numeric features (log1p of heavy-tailed counts, as DLRM feeds
    Criteo's), and labels `[batch, 1]`."""

    ids: dict[str, np.ndarray]
    numeric: np.ndarray
    labels: np.ndarray


def make_criteo_batches(
    spec: CriteoWorkload, seed: int = CRITEO_SEED
) -> list[CriteoBatch]:
    """`spec.batches` W4 batches, identical for every candidate and run."""
    rng = np.random.default_rng(seed)
    batches = []
    size = spec.batch_size
    for _ in range(spec.batches):
        ids = {
            name: zipf_ids(rng, rows, size)
            for name, (rows, _) in spec.table_shapes().items()
        }
        counts = rng.lognormal(1.0, 2.0, (size, CRITEO_NUMERIC))
        numeric = np.log1p(np.floor(counts)).astype(np.float32)
        labels = (rng.random((size, 1)) < CRITEO_CLICK_RATE).astype(np.float32)
        batches.append(CriteoBatch(ids, numeric, labels))
    return batches
