"""Where `kte.profile_lookups` keeps each table's statistics, read back.

One JSON file per table in the profile directory (TPUEstimator's
`profile_data_directory`); the SparseCore engine reads each column's
`max_ids_per_example` from it when the column's inputs do not bound it
(`engines/sparsecore/sparsecore_buffers.py`).
"""

from __future__ import annotations

import json
import os

PROFILE_SUFFIX = ".lookup_profile.json"


def profile_path(directory: str, table_name: str) -> str:
    """Where the profile of `table_name` lives in `directory`."""
    return os.path.join(directory, table_name + PROFILE_SUFFIX)


def profiled_max_ids(directory: str, table_name: str) -> dict[str, int]:
    """`{column name: max_ids_per_example}` from the table's profile in
    `directory`; empty when it has none."""
    path = profile_path(directory, table_name)
    if not os.path.exists(path):
        return {}
    with open(path) as handle:
        profile = json.load(handle)
    return {
        feature["column"]: int(feature["max_ids_per_example"])
        for feature in profile.get("features", {}).values()
    }
