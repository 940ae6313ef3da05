"""The digest of what drape's image installs from this tree: every file of the packages that
pyproject.toml lists (drape, flows, tasks, scheduler) and pyproject.toml itself, as they are on disk.

infra/image/build.sh labels the image with it (`drape.source`); tests/integration/test_pods_play.py
refuses to play pods in an image whose label differs from this tree's, naming the command that
rebuilds it, rather than failing later on whatever the old code does with today's job files.

    python3 infra/image/source_digest.py [REPO]    # prints the digest (16 hex digits)
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

PACKAGES = ("drape", "flows", "tasks", "scheduler")
SKIP = {"__pycache__"}


def source_digest(repo: Path) -> str:
    """SHA-256 (first 16 hex digits) over the relative path and bytes of each package file, in path order."""
    files = [repo / "pyproject.toml"]
    for package in PACKAGES:
        files += [p for p in (repo / package).rglob("*") if p.is_file() and not SKIP & set(p.parts) and p.suffix != ".pyc"]
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.relative_to(repo).as_posix()):
        digest.update(path.relative_to(repo).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    print(source_digest(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])))
