"""Where a shopper's data can be, each able to erase it and to scan for what remains.

- `ObjectStorePlace`: every object version and delete marker under ``shoppers/<id>/`` (a
  versioned bucket keeps each overwritten or deleted object as a noncurrent version, which a plain
  delete leaves behind); the scan lists every version in the store and reads back the ones whose
  size is a photo's.
- `LivePlace`: ``live/shoppers/<id>/``, try-on folders written elsewhere (only the files
  `drape tryon` wrote there), and a scan of live storage and the shard cache: paths naming the
  shopper, files with a photo's digest, small text files (JSON, logs) holding the id.
- `MlflowPlace`: the runs tagged with the shopper (and those the ledger names), deleted with their
  artifacts for good (`mlflow gc`, which needs the tracking database); the scan reads every run
  of every experiment, deleted ones too.

The queue's records are a place of the scheduler's (`scheduler.privacy`), added by the CLI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from drape.jsonfile import read_json_object
from drape.layout import shopper_prefix
from drape.shoppers import ShopperError
from drape.shoppers.forget import Subject
from drape.storage.checksum import sha256_bytes, sha256_file
from drape.storage.network import bounded_on
from drape.storage.store import ObjectStore

TEXT_SUFFIXES = (".json", ".jsonl", ".log", ".txt", ".yaml", ".yml", ".csv", ".md")
TEXT_LIMIT = 4 << 20  # text files larger than this are not read for the id (logs of that size hold no ids of ours)


class ObjectStorePlace:
    name = "object store"

    def __init__(self, store: ObjectStore):
        self.store = store

    def _bucket(self) -> tuple[str, str]:
        bucket, _, base = self.store.base.partition("/")
        return bucket, f"{base}/" if base else ""

    def _s3(self, method: str, **kwargs) -> dict:
        """One S3 call through s3fs's client; a timeout or stall is an error naming the endpoint."""
        with bounded_on(self.store):
            return self.store.fs.call_s3(method, **kwargs)

    def _versions(self, prefix: str):
        """(key, version id, size or None for a delete marker) of every version under `prefix`."""
        bucket, base = self._bucket()
        marker: dict = {}
        while True:
            page = self._s3("list_object_versions", Bucket=bucket, Prefix=base + prefix, **marker)
            for version in page.get("Versions", []):
                yield version["Key"], version["VersionId"], version["Size"]
            for deleted in page.get("DeleteMarkers", []):
                yield deleted["Key"], deleted["VersionId"], None
            if not page.get("IsTruncated"):
                return
            marker = {"KeyMarker": page["NextKeyMarker"], "VersionIdMarker": page.get("NextVersionIdMarker", "")}

    def erase(self, subject: Subject) -> dict[str, int]:
        prefix = shopper_prefix(subject.shopper)
        if not self.store.is_s3:
            files = self.store.list(prefix)
            if self.store.fs.exists(self.store.path(prefix)):
                self.store.fs.rm(self.store.path(prefix), recursive=True)
            return {"objects": len(files)}
        bucket, _ = self._bucket()
        found = list(self._versions(prefix))
        for start in range(0, len(found), 1000):  # DeleteObjects takes 1000 keys a call
            batch = [{"Key": key, "VersionId": version} for key, version, _ in found[start : start + 1000]]
            result = self._s3("delete_objects", Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
            if result.get("Errors"):
                error = result["Errors"][0]
                raise ShopperError(
                    f"{self.store!r}: deleting a version under {prefix} failed: {error.get('Code')} {error.get('Message')}"
                )
        self.store.fs.invalidate_cache()
        return {
            "object_versions": sum(1 for *_, size in found if size is not None),
            "delete_markers": sum(1 for *_, s in found if s is None),
        }

    def _version_sha256(self, bucket: str, key: str, version: str) -> str:
        from fsspec.asyn import sync

        with bounded_on(self.store):  # a body that stalls mid-stream: an error naming the endpoint
            body = self.store.fs.call_s3("get_object", Bucket=bucket, Key=key, VersionId=version)["Body"]
            return sha256_bytes(sync(self.store.fs.loop, body.read))  # aiobotocore's body reads on s3fs's loop

    def scan(self, subject: Subject) -> list[str]:
        digests, found = subject.photo_digests, []
        if not self.store.is_s3:
            for key in self.store.list(""):
                if subject.shopper in key or (self.store.size(key) in digests.sizes and self.store.sha256(key) in digests.sha256):
                    found.append(f"{self.store.key_url(key)}")
            return found
        bucket, _ = self._bucket()
        for key, version, size in self._versions(""):
            if subject.shopper in key:
                found.append(f"{key} version {version}")
            elif size in digests.sizes:
                if self._version_sha256(bucket, key, version) in digests.sha256:
                    found.append(f"{key} version {version} (a photo's digest)")
        return found


class LivePlace:
    name = "live storage"

    def __init__(self, shopper_root: Path, scan_roots: list[Path], skip: list[Path]):
        self.shopper_root, self.scan_roots, self.skip = shopper_root, scan_roots, skip

    def erase(self, subject: Subject) -> dict[str, int]:
        files = sum(1 for p in self.shopper_root.rglob("*") if p.is_file()) if self.shopper_root.exists() else 0
        shutil.rmtree(self.shopper_root, ignore_errors=True)
        for folder in subject.outputs:
            files += _erase_tryons(Path(folder), subject.shopper)
        return {"files": files}

    def scan(self, subject: Subject) -> list[str]:
        roots = [*self.scan_roots, *(Path(folder) for folder in subject.outputs)]
        digests, needle, found = subject.photo_digests, subject.shopper.encode(), []
        for root in roots:
            for path in root.rglob("*") if root.is_dir() else []:
                if any(path.is_relative_to(skip) for skip in self.skip) or not path.is_file():
                    continue
                size = path.stat().st_size
                if subject.shopper in path.as_posix():
                    found.append(str(path))
                elif size in digests.sizes and sha256_file(path) in digests.sha256:
                    found.append(f"{path} (a photo's digest)")
                elif path.suffix in TEXT_SUFFIXES and size <= TEXT_LIMIT and needle in path.read_bytes():
                    found.append(f"{path} (names the shopper)")
        return found


def _erase_tryons(folder: Path, shopper: str) -> int:
    """The files `drape tryon --shopper` wrote in `folder` (its tryon.json lists them), nothing else."""
    summary = folder / "tryon.json"
    if not summary.is_file():
        return 0
    record = read_json_object(summary, "summary")
    if record.get("shopper") != shopper:
        return 0
    names = [*record.get("outputs", []), record.get("grid", "grid.png"), "tryon.json"]
    if record.get("rendering"):  # interrupted while rendering: every image there is one of its
        names += [path.name for path in folder.glob("*.png")] + [path.name for path in folder.glob(".*.tmp.png")]
    removed = 0
    for name in names:
        path = folder / Path(str(name)).name  # names only: a record cannot point outside its folder
        if path.is_file():
            path.unlink()
            removed += 1
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
    return removed


class MlflowPlace:
    name = "mlflow"

    def __init__(self, tracking_uri: str, backend_store_uri: str | None = None):
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri
        self.backend = backend_store_uri or (None if tracking_uri.startswith("http") else tracking_uri)
        self.client = MlflowClient(tracking_uri=tracking_uri)

    def _runs(self, filter_string: str = ""):
        from mlflow.entities import ViewType

        experiments = [e.experiment_id for e in self.client.search_experiments(view_type=ViewType.ALL)]
        token = None
        while experiments:
            page = self.client.search_runs(
                experiments, filter_string, run_view_type=ViewType.ALL, max_results=1000, page_token=token
            )
            yield from page
            token = page.token
            if not token:
                return

    def erase(self, subject: Subject) -> dict[str, int]:
        runs = {run.info.run_id: run for run in self._runs(f"tags.`drape.shopper` = '{subject.shopper}'")}
        for run_id in subject.mlflow_runs:
            if run_id not in runs and (run := self._get(run_id)) is not None:
                runs[run_id] = run
        if not runs:
            return {"runs": 0}
        if self.backend is None:
            raise ShopperError(
                "MLflow runs can be deleted for good only through the tracking database (`mlflow gc`); "
                "tracking.uri is a server: set shoppers.mlflow_backend_store_uri"
            )
        for run_id, run in runs.items():
            if run.info.lifecycle_stage != "deleted":
                self.client.delete_run(run_id)
        command = [sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", self.backend, "--tracking-uri", self.uri]
        command += ["--run-ids", ",".join(runs)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise ShopperError(f"mlflow gc of {len(runs)} runs failed: {done.stderr.strip()[-500:]}")
        return {"runs": len(runs)}

    def _get(self, run_id: str):
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id)
        except MlflowException:
            return None

    def scan(self, subject: Subject) -> list[str]:
        needles = [subject.shopper, *subject.photo_digests.sha256]
        found = [f"run {run_id} (still in the tracking store)" for run_id in subject.mlflow_runs if self._get(run_id)]
        for run in self._runs():
            text = json.dumps([run.info.run_name, run.data.tags, run.data.params])
            if any(needle in text for needle in needles):
                found.append(f"run {run.info.run_id} of experiment {run.info.experiment_id}")
        return found
