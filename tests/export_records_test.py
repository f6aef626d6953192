"""What an export records beside its graph, and the checks that read it."""

import os

import pytest

from keras_tpu_embed.saving import export_records


def test_digests_name_an_edited_or_missing_file(tmp_path):
    (tmp_path / "variables").mkdir()
    (tmp_path / "variables" / "v.data").write_bytes(b"abc")
    (tmp_path / "saved_model.pb").write_bytes(b"graph")
    export_records.write_digests(str(tmp_path))
    export_records.verify_digests(str(tmp_path))
    (tmp_path / "variables" / "v.data").write_bytes(b"abd")
    with pytest.raises(ValueError, match=r"v\.data is truncated or corrupt"):
        export_records.verify_digests(str(tmp_path))
    os.remove(tmp_path / "variables" / "v.data")
    with pytest.raises(ValueError, match=r"v\.data is missing"):
        export_records.verify_digests(str(tmp_path))


def test_table_dtype_record_and_its_absence(tmp_path):
    assert export_records.read_table_dtype(str(tmp_path)) == "float32"
    export_records.write_export_info(str(tmp_path), "int8")
    assert export_records.read_table_dtype(str(tmp_path)) == "int8"
    with open(tmp_path / export_records.EXPORT_FILE, "w") as handle:
        handle.write("{")
    with pytest.raises(ValueError, match="truncated or corrupt"):
        export_records.read_table_dtype(str(tmp_path))
