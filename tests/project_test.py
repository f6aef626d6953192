"""The README's two commands and CI stay in step."""

import ast
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_opens_with_title_pitch_and_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert text.startswith("# keras_tpu_embed\n\n")
    # .ci/run runs the second line of the first bash block.
    match = re.search(r"```bash\n(.*?)\n```", text, re.S)
    assert match, "README.md must hold the two commands in a bash block"
    assert "```" not in text[: match.start()], "the commands come first"
    commands = match.group(1).splitlines()
    assert len(commands) == 2
    assert "keras_tpu_embed.demo" in commands[0]
    assert "pytest" in commands[1]
    # Lint and type checks run before the tests, in the same command.
    for check in (
        ".venv/bin/ruff check .",
        ".venv/bin/ruff format --check .",
        ".venv/bin/mypy --strict keras_tpu_embed",
        ".venv/bin/mkdocs build --strict",
    ):
        assert check in commands[1]
        assert commands[1].index(check) < commands[1].index("pytest")
    # The tests run on 2 processes (xdist), from the dev extra.
    assert "pytest -q -n 2 --dist loadfile" in commands[1]
    dev = (ROOT / "pyproject.toml").read_text()
    assert '"pytest-xdist"' in dev and '"mkdocs' in dev
    assert "README.md" in (ROOT / ".ci" / "run").read_text()


def _import_in_subprocess(code, **env):
    """Runs `code` in a fresh interpreter; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_fails_clearly_on_another_backend():
    completed = _import_in_subprocess(
        "import keras_tpu_embed", KERAS_BACKEND="jax"
    )
    assert completed.returncode != 0
    assert "TensorFlow backend of Keras 3 only" in completed.stderr
    assert "KERAS_BACKEND='jax'" in completed.stderr


def test_import_fails_clearly_without_tensorflow():
    completed = _import_in_subprocess(
        "import sys; sys.modules['tensorflow'] = None\nimport keras_tpu_embed"
    )
    assert completed.returncode != 0
    assert "keras_tpu_embed needs TensorFlow" in completed.stderr
    assert "keras_tpu_embed[cpu]" in completed.stderr


def test_user_facing_text_cites_no_internal_document():
    """Users never see the design notes or the issues: state rules inline."""
    files = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
    files += sorted((ROOT / "docs").glob("*.md"))
    for folder in ("keras_tpu_embed", "notebooks", "examples"):
        files += sorted((ROOT / folder).rglob("*.py"))
        files += sorted((ROOT / folder).rglob("*.ipynb"))
    cited = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"DESIGN|§|the issue's|\(issue \d+\)", line):
                cited.append(f"{path.relative_to(ROOT)}:{number}: {line}")
    assert not cited, "\n".join(cited)


def test_ci_runs_the_suite_and_tfs_own_code_on_both_versions():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    test_command = re.search(r"```bash\n(.*?)\n```", readme, re.S).group(1)
    # Step 1: the README command, which installs the newest allowed (2.21).
    assert "'.[cpu,dev]'" in test_command.splitlines()[1]
    assert "'tf-keras~=2.21.0'" in test_command.splitlines()[1]
    # Step 2: TensorFlow 2.20 in a second virtualenv, the files that only
    # another TensorFlow can break: TF's private fields, the SparseCore
    # suite and a V1 engine smoke under the emulation; each file exists.
    assert "'tensorflow-cpu==2.20.*'" in ci
    assert "'tf-keras~=2.20.0'" in ci
    runs = re.findall(
        r"\.venv220/bin/python -m pytest -q (?:-n 2 --dist loadfile|"
        r"-p no:xdist) ((?:tests/\S+_test\.py ?)+)",
        ci,
    )
    assert len(runs) == 2, ci
    files = [name for run in runs for name in run.split()]
    assert {
        "tests/_tf_private_test.py",
        "tests/_compat_test.py",
        "tests/emulated_sparsecore_test.py",
        "tests/emulated/training_test.py",
        "tests/emulated/engine_checkpoint_test.py",
    } <= set(files)
    assert all((ROOT / name).is_file() for name in files)
    # CI sets CI, so the network tests fail there instead of skipping.
    export = re.search(r"^export CI=true$", ci, re.M)
    assert export and export.start() < ci.index('bash -c "$command"')


# The modules that may touch TF's internals: `_compat.py` imports them,
# `_tf_private.py` reads each private field through a named function.
INTERNALS = {"_compat.py", "_tf_private.py"}


def _private_accesses(path, package):
    """`X._name` (or `getattr(X, "_name")`) where X is not `self`, `cls` or
    `super()`: another module's (or TF's) private name."""
    found = []
    relative = path.relative_to(package).as_posix()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
            and not str(node.args[1].value).startswith("__")
            and not (
                isinstance(node.args[0], ast.Name)
                and node.args[0].id in ("self", "cls")
            )
        ):
            found.append(f"{relative}:{node.lineno} {ast.unparse(node)}")
            continue
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__"):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if (
            isinstance(owner, ast.Call)
            and isinstance(owner.func, ast.Name)
            and owner.func.id == "super"
        ):
            continue
        found.append(f"{relative}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_reads_another_modules_private_names():
    """Only `_tf_private.py` reads TF's private fields, each through a
    named function that says which private it reads and why."""
    package = ROOT / "keras_tpu_embed"
    found = [
        entry
        for path in sorted(package.rglob("*.py"))
        if path.name not in INTERNALS
        for entry in _private_accesses(path, package)
    ]
    assert found == [], (
        f"Private names of other modules read: {found}. Route each through "
        "a named function of keras_tpu_embed/_tf_private.py."
    )


def _folder(module):
    """A module's room in the house: its top folder, or itself at the root
    (`keras_tpu_embed.x.y` is in `x/` if `x` is a folder)."""
    top = module.split(".")[1]
    return top + ("/" if (ROOT / "keras_tpu_embed" / top).is_dir() else ".py")


def _folder_imports():
    """(importing folder, imported folder) for every package import."""
    package = ROOT / "keras_tpu_embed"
    pairs = set()
    for path in package.rglob("*.py"):
        relative = path.relative_to(ROOT).with_suffix("")
        module = ".".join(relative.parts).removesuffix(".__init__")
        if path.name == "__init__.py":
            module += ".__init__"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module]
                if node.module == "keras_tpu_embed":
                    targets = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                if target.startswith("keras_tpu_embed."):
                    pairs.add((_folder(module), _folder(target)))
    return {(a, b) for a, b in pairs if a != b and a != "__init__.py"}


def _circles(graph):
    """Every circle of `graph` (node -> nodes), each as the path walked."""
    circles = []

    def visit(node, path):
        for target in sorted(graph.get(node, ())):
            if target in path:
                circles.append(path[path.index(target) :] + [target])
            else:
                visit(target, path + [target])

    for node in sorted(graph):
        visit(node, [node])
    return circles


def test_the_folders_import_each_other_in_one_direction():
    """The folders are the data flow: each imports only the ones below it
    (placement, tables, lookups, backends, engines, ... the layer, then
    saving and serving), so that a folder can be read, and replaced,
    knowing only what is below it. Root modules count as folders."""
    graph = {}
    for importing, imported in _folder_imports():
        graph.setdefault(importing, set()).add(imported)
    assert {"placement/", "tables/", "lookups/", "engines/"} <= set(graph)
    assert _circles(graph) == []
