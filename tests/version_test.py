"""The version number: one source, read by the build, PEP 440."""

import pathlib
import re
import tomllib

from packaging.version import Version

import keras_tpu_embed as kte
from keras_tpu_embed import version

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Hatch's default pattern for a version file.
HATCH_PATTERN = r"(?im)^__version__\s*=\s*['\"](?P<version>[^'\"]+)['\"]"


def test_pyproject_reads_the_version_from_version_py():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]
    assert "version" not in project["project"]
    path = project["tool"]["hatch"]["version"]["path"]
    assert ROOT / path == pathlib.Path(version.__file__).resolve()
    matches = re.findall(HATCH_PATTERN, (ROOT / path).read_text())
    assert matches == [version.__version__]


def test_version_is_pep_440_and_exported():
    assert str(Version(version.__version__)) == version.__version__
    assert kte.__version__ == version.__version__
    assert "__version__" in kte.__all__
