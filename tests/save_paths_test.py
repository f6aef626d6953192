"""Every way users save a model carries every table, slot and step.

A model with a vocabulary-file column, a weighted column and a shared
sequence table trains, is saved with `tf.train.Checkpoint`,
`tf.train.CheckpointManager`, Keras' `ModelCheckpoint` (weights and `.keras`)
and `BackupAndRestore` callbacks, `save_weights` and `model.save`, and is
restored in a fresh process (the `.keras` files with the original vocabulary
file gone). Tables, slots, embedding steps and predictions must come back bit
for bit, and one more training step must give the same state on both sides.
"""

import json
import pathlib
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_tpu_embed as kte
from tests import state_models
from tests import testing

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Restores every save of each optimizer's model, one optimizer after the
# other (Keras' session cleared between them), and prints one report for all.
RESTORE_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np, keras, tensorflow as tf
from tests import state_models as sm


def restore_every_save(paths):
    reference = np.load(paths["reference"])
    copy = paths["vocabulary_copy"]
    _, pre = sm.build(copy, paths["optimizer"])
    report = {}

    def compare(model, prefix):
        got = sm.state(model)
        want = {k[len(prefix) + 1:]: reference[k] for k in reference.files
                if k.startswith(prefix + ":")}
        assert set(got) == set(want), (sorted(got), sorted(want))
        return sorted(k for k in want if not np.array_equal(got[k], want[k]))

    def check(name, model, resume=True):
        differ = compare(model, "before")
        preds = np.array_equal(sm.predictions(model, pre), reference["preds"])
        after = None
        if resume:
            sm.train(model, pre, 1, seed=50)
            after = compare(model, "after")
        report[name] = {"differ": differ, "preds": preds, "after": after}

    model, _ = sm.build(copy, paths["optimizer"])
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).read(
        paths["checkpoint"]).assert_existing_objects_matched()
    check("tf.train.Checkpoint", model)

    model, _ = sm.build(copy, paths["optimizer"])
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model), paths["manager"], max_to_keep=2)
    assert manager.restore_or_initialize() is not None
    check("CheckpointManager", model)

    model, _ = sm.build(copy, paths["optimizer"])
    model.load_weights(paths["weights"])
    check("save_weights", model)

    model, _ = sm.build(copy, paths["optimizer"])
    model.load_weights(paths["callback_weights"])
    check("ModelCheckpoint(save_weights_only)", model)

    check("model.save", keras.models.load_model(paths["keras"]))
    check("ModelCheckpoint(.keras)",
          keras.models.load_model(paths["callback_keras"]))

    class Snapshot(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            check("BackupAndRestore", self.model, resume=False)

        def on_epoch_begin(self, epoch, logs=None):
            report["BackupAndRestore"]["resumed_at_epoch"] = epoch

    model, _ = sm.build(copy, paths["optimizer"])
    model.fit(sm.dataset(pre, 3), epochs=2, verbose=0, callbacks=[
        keras.callbacks.BackupAndRestore(
            paths["backup"], delete_checkpoint=False),
        Snapshot()])
    return report


reports = {}
for paths in json.loads(sys.argv[2]):
    keras.backend.clear_session()
    reports[paths["optimizer"]] = restore_every_save(paths)
print("REPORT " + json.dumps(reports))
"""

OPTIMIZERS = ["adagrad", "ftrl"]


def _train_and_save_every_way(tmp_path, optimizer):
    """Trains `state_models`' model, saves it every way, writes the
    reference state (before and after one more step) and removes the
    original vocabulary file. Returns the paths for the restore and the
    tables and slots the fit left at their initial value."""
    vocabulary = tmp_path / "vocabulary" / "users.txt"
    vocabulary.parent.mkdir()
    vocabulary.write_text("\n".join(state_models.USERS) + "\n")
    copy = tmp_path / "elsewhere" / "users.txt"
    copy.parent.mkdir()
    shutil.copy(vocabulary, copy)

    model, pre = state_models.build(str(vocabulary), optimizer)
    paths = {
        "optimizer": optimizer,
        "vocabulary_copy": str(copy),
        "callback_weights": str(tmp_path / "callback.weights.h5"),
        "callback_keras": str(tmp_path / "callback.keras"),
        "backup": str(tmp_path / "backup"),
        "weights": str(tmp_path / "model.weights.h5"),
        "keras": str(tmp_path / "model.keras"),
        "manager": str(tmp_path / "manager"),
        "reference": str(tmp_path / "reference.npz"),
    }
    model.fit(
        state_models.dataset(pre, 3),
        epochs=1,
        verbose=0,
        callbacks=[
            keras.callbacks.ModelCheckpoint(
                paths["callback_weights"], save_weights_only=True
            ),
            keras.callbacks.ModelCheckpoint(paths["callback_keras"]),
            keras.callbacks.BackupAndRestore(
                paths["backup"], delete_checkpoint=False
            ),
        ],
    )
    paths["checkpoint"] = tf.train.Checkpoint(
        model=model, optimizer=model.optimizer
    ).write(str(tmp_path / "checkpoint" / "ckpt"))
    tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model), paths["manager"], max_to_keep=2
    ).save()
    model.save_weights(paths["weights"])
    model.save(paths["keras"])

    before = state_models.state(model)
    fresh, _ = state_models.build(str(vocabulary), optimizer)
    initial = state_models.state(fresh)
    assert sorted(before) == sorted(initial)
    unmoved = [k for k in before if np.array_equal(before[k], initial[k])]
    reference = {f"before:{k}": v for k, v in before.items()}
    reference["preds"] = state_models.predictions(model, pre)
    state_models.train(model, pre, 1, seed=50)
    reference.update(
        {f"after:{k}": v for k, v in state_models.state(model).items()}
    )
    np.savez(paths["reference"], **reference)
    # The .keras files must carry the vocabulary themselves.
    shutil.rmtree(vocabulary.parent)
    return paths, unmoved


@pytest.fixture(scope="module")
def restored(tmp_path_factory):
    """Per optimizer: the tables and slots its fit left unmoved, and the
    report of every restore, all made in one fresh process (a process
    each cost a TensorFlow start)."""
    saved = {
        optimizer: _train_and_save_every_way(
            tmp_path_factory.mktemp(optimizer), optimizer
        )
        for optimizer in OPTIMIZERS
    }
    result = testing.run_python(
        "-c",
        RESTORE_SCRIPT,
        str(ROOT),
        json.dumps([paths for paths, _ in saved.values()]),
        timeout=900,
        KERAS_BACKEND="tensorflow",
    )
    lines = [x for x in result.stdout.splitlines() if x.startswith("REPORT ")]
    assert result.returncode == 0 and lines, result.stderr[-4000:]
    reports = json.loads(lines[-1][len("REPORT ") :])
    return {
        optimizer: (unmoved, reports[optimizer])
        for optimizer, (_, unmoved) in saved.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_save_path_restores_in_a_fresh_process(restored, optimizer):
    unmoved, report = restored[optimizer]
    # A test that passes on untrained tables proves nothing: the fit changed
    # every table and slot away from its initial value.
    assert unmoved == [], unmoved
    assert sorted(report) == sorted(
        [
            "tf.train.Checkpoint",
            "CheckpointManager",
            "save_weights",
            "ModelCheckpoint(save_weights_only)",
            "model.save",
            "ModelCheckpoint(.keras)",
            "BackupAndRestore",
        ]
    )
    for name, outcome in report.items():
        assert outcome["differ"] == [], (name, outcome)
        assert outcome["preds"], (name, outcome)
        if name != "BackupAndRestore":
            assert outcome["after"] == [], (name, outcome)
    assert report["BackupAndRestore"]["resumed_at_epoch"] == 1


@pytest.mark.parametrize("style", ["functional", "subclassed", "sequential"])
@pytest.mark.parametrize("optimizer", ["adagrad", "ftrl"])
def test_every_table_and_slot_exists_once(style, optimizer):
    """A subclassed model built eagerly held two copies of each table."""
    embedding_optimizer = {
        "adagrad": kte.optimizers.Adagrad(0.1),
        "ftrl": kte.optimizers.FTRL(0.1),
    }[optimizer]
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 10), 4
    )

    def embedding():
        return kte.TPUEmbeddingLayer(
            [column],
            config=kte.EmbeddingConfig(optimizer=embedding_optimizer),
            output="concat",
        )

    ids = tf.constant([[1, 2], [3, -1]])
    if style == "functional":
        inputs = keras.Input((2,), dtype="int64", name="item")
        model = keras.Model(inputs, keras.layers.Dense(1)(embedding()(inputs)))
    elif style == "sequential":
        model = keras.Sequential(
            [
                keras.Input((2,), dtype="int64"),
                embedding(),
                keras.layers.Dense(1),
            ]
        )
    else:

        class Ranker(keras.Model):
            def __init__(self):
                super().__init__()
                self.embedding = embedding()
                self.head = keras.layers.Dense(1)

            def call(self, x):
                return self.head(self.embedding(x))

        model = Ranker()
    model(ids)
    layer = next(
        x for x in model.layers if isinstance(x, kte.TPUEmbeddingLayer)
    )
    paths = [w.path for w in model.weights]
    assert len(paths) == len(set(paths)), paths
    assert len({id(w) for w in model.weights}) == len(paths)
    slots = len(embedding_optimizer.SLOTS)
    tables = [p for p in paths if p.split("/")[-1].startswith("item")]
    assert len(tables) == 1 + slots, paths
    # The layer reads the variables the model holds.
    held = {id(w) for w in model.weights}
    assert id(layer.table_variable("item")) in held


def test_tf_checkpoint_of_a_model_holds_its_tables(tmp_path):
    column = kte.embedding_column(
        kte.categorical_column_with_identity("item", 10), 4
    )
    config = kte.EmbeddingConfig(optimizer=kte.optimizers.Adagrad(0.1))

    def model():
        inputs = keras.Input((2,), dtype="int64", name="item")
        layer = kte.TPUEmbeddingLayer([column], config=config, output="concat")
        return keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))

    source = model()
    path = tf.train.Checkpoint(model=source).write(str(tmp_path / "ck"))
    keys = [name for name, _ in tf.train.list_variables(path)]
    assert any(
        k.endswith("embedding_tables/item/.ATTRIBUTES/VARIABLE_VALUE")
        for k in keys
    ), keys
    assert any("embedding_tables/item.Saccumulators" in k for k in keys), keys
    # Restoring before the target is built (deferred restoration) works too.
    inputs = keras.Input((2,), dtype="int64", name="item")
    layer = kte.TPUEmbeddingLayer([column], config=config, output="concat")
    checkpoint = tf.train.Checkpoint(layer=layer)
    tf.train.Checkpoint(layer=source.layers[1]).write(str(tmp_path / "l"))
    status = checkpoint.read(str(tmp_path / "l"))
    keras.Model(inputs, layer(inputs))
    status.assert_existing_objects_matched()
    np.testing.assert_array_equal(
        layer.table_variable("item").numpy(),
        source.layers[1].table_variable("item").numpy(),
    )
