"""Reading JSON that drape wrote earlier (manifests, records, results, reports) as untrusted input.

A file can be truncated by a crash, damaged on disk, or replaced by hand; `json.loads` then says
"Expecting value: line 1 column 1" and nothing about which of hundreds of files it was. Every
manifest and report drape reads back goes through `read_json` (a local file) or `parse_json`
(bytes from the object store), whose error names the file or object, where in it, and what it is.
Both are bounded: at most `MAX_JSON_BYTES` and `MAX_JSON_DEPTH` levels of nesting (a file of a
million `[` would otherwise end in a RecursionError naming nothing, or stall a reader).
"""

from __future__ import annotations

import json
from pathlib import Path

MAX_JSON_BYTES = 256 << 20  # the largest drape writes (a data manifest of a million samples) is tens of MB
MAX_JSON_DEPTH = 64  # drape's deepest document (a job holding its config) nests about ten levels


class JsonFileError(ValueError):
    """A JSON file or object that cannot be read; the message names it, the position and what it holds."""


def _depth(value: object) -> int:
    """How deeply `value` nests, walked without recursion, stopping past the bound."""
    deepest, stack = 0, [(value, 1)]
    while stack and deepest <= MAX_JSON_DEPTH:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def parse_json(payload: bytes | str, where: str, what: str = "JSON") -> object:
    """`payload` decoded; JsonFileError naming `where` (a path or a redacted object URL) otherwise,
    also past `MAX_JSON_BYTES` or nested deeper than `MAX_JSON_DEPTH`."""
    if len(payload) > MAX_JSON_BYTES:
        raise JsonFileError(f"{where}: {len(payload)} bytes, more than a {what} may hold ({MAX_JSON_BYTES} bytes)")
    try:
        value = json.loads(payload)
    except RecursionError:
        raise JsonFileError(f"{where}: nested deeper than a {what} may be ({MAX_JSON_DEPTH} levels); refused") from None
    except UnicodeDecodeError:
        raise JsonFileError(f"{where}: not JSON (not UTF-8 text); the {what} is damaged") from None
    except json.JSONDecodeError as error:
        raise JsonFileError(
            f"{where}: not JSON ({error.msg} at line {error.lineno} column {error.colno}); the {what} is damaged"
        ) from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise JsonFileError(f"{where}: nested deeper than a {what} may be ({MAX_JSON_DEPTH} levels); refused")
    return value


def read_json(path: str | Path, what: str = "JSON") -> object:
    """The JSON document in `path`; JsonFileError naming the file when it is not JSON (a missing
    file stays FileNotFoundError)."""
    with open(path, "rb") as handle:  # at most the bound, whatever the file's size says
        return parse_json(handle.read(MAX_JSON_BYTES + 1), str(path), what)


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
