"""drape/jsonfile.py: a JSON file or stored object that is damaged is named, with the position and what it held."""

from __future__ import annotations

import pytest

from drape.jsonfile import JsonFileError, read_json_object
from drape.storage.store import ObjectStore


@pytest.mark.parametrize("payload", [b"", b'{"step": 1,', b"\xff\xfe", b"[1, 2]"])
def test_a_json_file_that_is_damaged_is_named_with_the_position(tmp_path, payload):
    path = tmp_path / "run-1" / "manifest.json"
    path.parent.mkdir()
    path.write_bytes(payload)
    with pytest.raises(JsonFileError, match=rf"{path}: (not JSON|expected a JSON object).*manifest is damaged"):
        read_json_object(path, "checkpoint manifest")


def test_a_stage_result_in_the_store_that_is_not_json_names_the_object(tmp_path):
    from drape.jsonfile import parse_json_object

    store = ObjectStore(f"file://{tmp_path}/objects")
    store.put_bytes(b"{truncated", "runs/r/identity/result.json")
    with pytest.raises(JsonFileError, match=r"runs/r/identity/result\.json: not JSON .*line 1 column 2"):
        parse_json_object(store, "runs/r/identity/result.json", "stage job result")
