"""Reading JSON that drape wrote earlier (manifests, records, results, reports) as untrusted input.

A file can be truncated by a crash, damaged on disk, or replaced by hand; `json.loads` then says
"Expecting value: line 1 column 1" and nothing about which of hundreds of files it was. Every
manifest and report drape reads back goes through `read_json` (a local file) or `parse_json`
(bytes from the object store), whose error names the file or object, where in it, and what it is.
"""

from __future__ import annotations

import json
from pathlib import Path


class JsonFileError(ValueError):
    """A JSON file or object that cannot be read; the message names it, the position and what it holds."""


def parse_json(payload: bytes | str, where: str, what: str = "JSON") -> object:
    """`payload` decoded; JsonFileError naming `where` (a path or a redacted object URL) otherwise."""
    try:
        return json.loads(payload)
    except UnicodeDecodeError:
        raise JsonFileError(f"{where}: not JSON (not UTF-8 text); the {what} is damaged") from None
    except json.JSONDecodeError as error:
        raise JsonFileError(
            f"{where}: not JSON ({error.msg} at line {error.lineno} column {error.colno}); the {what} is damaged"
        ) from None


def read_json(path: str | Path, what: str = "JSON") -> object:
    """The JSON document in `path`; JsonFileError naming the file when it is not JSON (a missing
    file stays FileNotFoundError)."""
    return parse_json(Path(path).read_bytes(), str(path), what)


def read_json_object(path: str | Path, what: str = "JSON") -> dict:
    """`read_json`, and a JsonFileError unless the document is an object."""
    value = read_json(path, what)
    if not isinstance(value, dict):
        raise JsonFileError(f"{path}: expected a JSON object, got {type(value).__name__}; the {what} is damaged")
    return value


def parse_json_object(store, key: str, what: str = "JSON") -> dict:
    """The JSON object at `key` of an ObjectStore; JsonFileError naming the object (its redacted URL) otherwise."""
    value = parse_json(store.read_bytes(key), store.key_url(key), what)
    if not isinstance(value, dict):
        raise JsonFileError(f"{store.key_url(key)}: expected a JSON object, got {type(value).__name__}; the {what} is damaged")
    return value
