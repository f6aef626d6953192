"""Scripts run one after another in one fresh process, each on its own.

A fresh process costs about 6 CPU seconds before it runs a line (importing
TensorFlow, Keras and the package); the docs pages and notebooks that need
nothing of a process to themselves share one. Each script runs:

- as `__main__` in a namespace of its own, in its own directory;
- after `keras.backend.clear_session()` (Keras' names and graph anew);
- inside `warnings.catch_warnings()`: the warning filters as they were
  before it, and every module's warning registry reset, so that it shows
  every warning an earlier script already showed;
- with `sys.stderr` its own, so that a warning is counted against the
  script that showed it.

One script's exception is reported as its traceback; the scripts after it
still run.
"""

import json

from tests import testing

RUNNER = r"""
import contextlib, io, json, os, sys, traceback, warnings

# What every script imports first, imported before any of them: the warning
# filters these imports add then hold for every script, as they would in a
# process of its own.
import keras, tensorflow, keras_tpu_embed

jobs, output = json.loads(open(sys.argv[1]).read()), sys.argv[2]
results = {}
for name, path, directory in jobs:
    keras.backend.clear_session()
    os.chdir(directory)
    stderr, error = io.StringIO(), None
    with warnings.catch_warnings(), contextlib.redirect_stderr(stderr):
        try:
            code = compile(open(path).read(), path, "exec")
            exec(code, {"__name__": "__main__", "__file__": path})
        except BaseException:
            error = traceback.format_exc()
    results[name] = {"error": error, "stderr": stderr.getvalue()}
    print(f"--- {name}: {'failed' if error else 'ran'}", flush=True)
with open(output, "w") as handle:
    json.dump(results, handle)
"""


def run_scripts(scripts, root, timeout, cwd=None, **extra_env):
    """Runs `scripts` ({name: (code, working directory)}, in order) in one
    fresh process started in `cwd` (default `root`, a scratch folder); per
    name, `{"error": traceback or None, "stderr": what the script wrote to
    sys.stderr}`."""
    folder = root / "scripts"
    folder.mkdir()
    jobs = []
    for index, (name, (code, directory)) in enumerate(scripts.items()):
        path = folder / f"{index}.py"
        path.write_text(code)
        jobs.append([name, str(path), str(directory)])
    listing, output = folder / "jobs.json", folder / "results.json"
    listing.write_text(json.dumps(jobs))
    completed = testing.run_python(
        "-c",
        RUNNER,
        str(listing),
        str(output),
        timeout=timeout,
        cwd=str(cwd or root),
        **extra_env,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = json.loads(output.read_text())
    assert list(results) == list(scripts), completed.stdout[-2000:]
    return results
