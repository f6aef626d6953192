"""The main job end to end, at a reduced size."""

import warnings

import numpy as np

from keras_tpu_embed import demo


def test_demo_learns_exports_and_serves(tmp_path):
    # Every warning, as `python -m keras_tpu_embed.demo` would show it
    # (the suite's filters are off inside): the demo printed the layers'
    # "ignores the input keys" and Keras' "`shuffle=True` was passed".
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = demo.run(str(tmp_path), num_examples=30_000, epochs=3)
    # Python hides DeprecationWarnings outside __main__ (TensorFlow's own).
    shown = [
        f"{w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if not issubclass(w.category, DeprecationWarning)
    ]
    assert not shown, "\n".join(shown)
    assert result["auc"] > 0.6, result["auc"]
    np.testing.assert_allclose(
        result["served"], result["in_process"], atol=1e-6
    )


def test_click_log_is_deterministic():
    first, labels = demo.make_click_log(500, seed=3)
    second, labels_again = demo.make_click_log(500, seed=3)
    np.testing.assert_array_equal(labels, labels_again)
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])
    # Zipf: the most frequent item is far more common than the median one.
    counts = np.bincount(first["item_id"], minlength=demo.NUM_ITEMS)
    assert counts.max() > 20 * max(np.median(counts), 1)
