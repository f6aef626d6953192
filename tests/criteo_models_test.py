"""W4's models: the DLRM interaction and both models' inputs and outputs."""

import numpy as np

from benchmarks import criteo_models
from benchmarks import workloads


def test_interaction_is_the_bottom_and_every_pair_of_vectors_once():
    rng = np.random.default_rng(0)
    bottom = rng.normal(size=(2, 3)).astype(np.float32)
    embeddings = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(2)]
    out = np.asarray(criteo_models.interaction(bottom, embeddings))
    vectors = [bottom, *embeddings]
    pairs = [(0, 1), (0, 2), (1, 2)]
    want = np.concatenate(
        [bottom]
        + [np.sum(vectors[i] * vectors[j], 1, keepdims=True) for i, j in pairs],
        axis=1,
    )
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_both_models_take_the_batches_and_give_one_logit():
    spec = workloads.criteo_workload(quick=True)
    (features, labels), _ = criteo_models.model_data(
        workloads.make_criteo_batches(spec)
    )
    # The quick workload's 6 tables (`QUICK_CRITEO_FEATURES`), and numeric.
    assert len(features) == 7 and features["cat_1"].shape == (256, 1)
    for model in (
        criteo_models.kte_model(spec, "cpu"),
        criteo_models.keras_model(spec, jit=False),
    ):
        assert model(features, training=False).shape == (256, 1)
