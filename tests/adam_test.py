"""Adam as the TPU embedding engine computes it: lazy or dense."""

import numpy as np
import pytest

import keras_tpu_embed as kte
from tests import testing


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: kte.optimizers.Adam(beta_1=1.0), "beta_1"),
        (lambda: kte.optimizers.Adam(beta_2=-0.1), "beta_2"),
        (lambda: kte.optimizers.Adam(epsilon=0), "epsilon"),
        (
            lambda: kte.optimizers.Adam(
                lazy_adam=False, use_gradient_accumulation=False
            ),
            "lazy_adam",
        ),
    ],
)
def test_invalid_arguments(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_lazy_adam_leaves_untouched_rows_and_dense_adam_moves_them():
    for lazy in (True, False):
        layer = kte.TPUEmbeddingLayer(
            [testing.identity_column(combiner="mean", vocabulary_size=9)],
            config=kte.EmbeddingConfig(
                optimizer=kte.optimizers.Adam(0.1, lazy_adam=lazy)
            ),
        )
        layer.build()
        snapshots = [layer.table_variable("ids").numpy().copy()]
        for ids in ([[1, 2]], [[3, 3]]):
            testing.train_steps(layer, [ids], 1.0)
            snapshots.append(layer.table_variable("ids").numpy().copy())
        second = np.any(snapshots[1] != snapshots[2], axis=1)
        # Step 2 touches row 3 only; non-lazy Adam also moves rows 1 and 2
        # through their momenta. Rows never touched have zero momenta.
        expected = {3} if lazy else {1, 2, 3}
        assert set(np.where(second)[0]) == expected, (lazy, second)


@pytest.mark.parametrize("name", ["adam", "adam_outside_sqrt", "adam_dense"])
def test_update_matches_numpy(name):
    testing.assert_update_matches_numpy(testing.OPTIMIZER_CASES[name])


def test_only_dense_adam_updates_every_row():
    assert not kte.optimizers.Adam().updates_all_rows()
    assert kte.optimizers.Adam(lazy_adam=False).updates_all_rows()
    assert [s.name for s in kte.optimizers.Adam.SLOTS] == [
        "momenta",
        "velocities",
    ]
