"""One object-store layer over fsspec: `file://` by default, `s3://` through s3fs.

Every upload goes to a temporary key first and is published only after it was read back and
its size and sha256 match the local file, so a reader never sees a partial object and nothing
local is freed before a verified copy exists. Credentials come from the standard chain of the
backend (for S3: environment, profile, instance role), never from drape's config, and URLs are
logged without query strings or user info.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlencode

import fsspec

from drape.layout import safe_key
from drape.secrets import has_credentials
from drape.storage.checksum import sha256_file
from drape.storage.durable import fsync_dir, fsync_file, whole_or_nothing
from drape.storage.network import BoundedReader, StorageError, attempts_within, bounded, redact_url  # two re-exported

T = TypeVar("T")
SINGLE_COPY_LIMIT = 5 * 2**30  # S3 CopyObject's largest source; larger objects are copied in parts


@dataclass(frozen=True)
class StoredObject:
    url: str
    bytes: int
    sha256: str


class ObjectStore:
    """Keys are '/'-separated paths under the store's base URL.

    On S3 a PUT is atomic for readers, so objects go straight to their key (one request, or a
    multipart upload of `multipart_chunk_bytes` parts) with their tags and storage class; on
    other filesystems they are written under a temporary name and renamed. Either way the object
    is read back and checked before the call returns.
    """

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        multipart_chunk_bytes: int = 64 * 2**20,
        retry_attempts: int = 8,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
        max_wait: float = 60.0,
    ):
        for name, value in (("object store URL", url), ("endpoint_url", endpoint_url)):
            if value and has_credentials(value):
                raise StorageError(
                    f"the {name} must not carry credentials (they would reach logs and records); "
                    "S3 reads them from the AWS chain: environment, profile or role"
                )
        self.url = url.rstrip("/")
        self.connect_timeout, self.read_timeout, self.max_wait = connect_timeout, read_timeout, max_wait
        self.endpoint = endpoint_url
        self.retry_attempts = attempts_within(max_wait, retry_attempts, connect_timeout, read_timeout)
        options = {}
        if self.url.startswith("s3://"):
            client = {k: v for k, v in (("endpoint_url", endpoint_url), ("region_name", region)) if v}
            # botocore's standard retry mode: 500, 502-504, 503 SlowDown, throttling, connection
            # resets and timeouts, with exponential backoff and jitter. total_max_attempts counts every
            # attempt (botocore's max_attempts counts retries after the first: one attempt more than
            # max_wait was computed for, which a silent endpoint spent past the budget)
            retries = {"total_max_attempts": self.retry_attempts, "mode": "standard"}
            options = {
                "client_kwargs": client,
                "config_kwargs": {"retries": retries, "connect_timeout": connect_timeout, "read_timeout": read_timeout},
            }
        self.fs, self.base = fsspec.core.url_to_fs(self.url, **options)
        self.base = self.base.rstrip("/")
        self.is_s3 = self.url.startswith("s3://")
        if self.is_s3:
            # botocore's retries are the only ones (s3fs would retry each of its calls 5 times on top):
            # a silent endpoint fails within max_wait: attempts × (connect_timeout + read_timeout) + backoff
            self.fs.retries = 1
        self.is_local = "file" in self.fs.protocol
        self.chunk_bytes = multipart_chunk_bytes
        if not self.is_s3 and "file" in self.fs.protocol:
            os.makedirs(self.base, exist_ok=True)

    def __repr__(self) -> str:
        return f"ObjectStore({redact_url(self.url)!r})"

    def path(self, key: str) -> str:
        """The backend path of `key`, which must be a relative key inside the store (`safe_key`:
        keys come from manifests and records, which are untrusted)."""
        return f"{self.base}/{safe_key(key, f'object key in {self!r}', allow_empty=True)}"

    def key_url(self, key: str) -> str:
        return f"{redact_url(self.url)}/{key}"

    @bounded
    def exists(self, key: str) -> bool:
        """Whether `key` is in the store now (not in a listing s3fs cached before another node wrote it)."""
        self.fs.invalidate_cache(self.path(key))
        return self.fs.exists(self.path(key))

    @bounded
    def size(self, key: str) -> int:
        return int(self.fs.size(self.path(key)))

    @bounded
    def sha256(self, key: str) -> str:
        digest = hashlib.sha256()
        with self.fs.open(self.path(key), "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()

    @bounded
    def verify(self, key: str, *, size: int, sha256: str) -> None:
        """Read the object back; raise StorageError unless size and sha256 match."""
        if not self.exists(key):
            raise StorageError(f"{self.key_url(key)}: missing in the object store")
        actual_size = self.size(key)
        if actual_size != size:
            raise StorageError(f"{self.key_url(key)}: expected {size} bytes, the store has {actual_size}")
        actual = self.sha256(key)
        if actual != sha256:
            raise StorageError(f"{self.key_url(key)}: sha256 mismatch: expected {sha256}, the store has {actual}")

    @bounded
    def put_file(
        self, local: str | Path, key: str, *, tags: dict[str, str] | None = None, storage_class: str | None = None
    ) -> StoredObject:
        """Upload, verify by reading back, publish under `key`. Idempotent for identical content.

        `tags` and `storage_class` apply on S3 (lifecycle rules key on the tags); elsewhere the
        archive manifest carries them.
        """
        local = Path(local)
        if not local.is_file():
            raise StorageError(f"{local}: cannot upload, file not found")
        size, digest = local.stat().st_size, sha256_file(local)
        if self.exists(key):
            try:
                self.verify(key, size=size, sha256=digest)
                return StoredObject(self.key_url(key), size, digest)
            except StorageError:
                pass  # a different or partial object: replace it below
        if self.is_s3:
            return self._put_s3(local, key, size, digest, tags, storage_class)
        temporary = f"{key}.tmp-{uuid.uuid4().hex[:8]}"
        parent = self.path(temporary).rsplit("/", 1)[0]
        self.fs.makedirs(parent, exist_ok=True)
        try:
            with whole_or_nothing(self.path(temporary), self.path(key), f"an object of {self!r}", size):
                self.fs.put_file(str(local), self.path(temporary))
            self.verify(temporary, size=size, sha256=digest)
            if self.is_local:
                fsync_file(self.path(temporary))  # durable before the rename publishes it
            self.fs.mv(self.path(temporary), self.path(key))
            if self.is_local:
                fsync_dir(self.path(key).rsplit("/", 1)[0])
        finally:
            if self.fs.exists(self.path(temporary)):
                self.fs.rm(self.path(temporary))
        self.verify(key, size=size, sha256=digest)
        return StoredObject(self.key_url(key), size, digest)

    def _put_s3(
        self, local: Path, key: str, size: int, digest: str, tags: dict[str, str] | None, storage_class: str | None
    ) -> StoredObject:
        extra = {"ChecksumAlgorithm": "SHA256"}
        if tags:
            extra["Tagging"] = urlencode(tags)
        if storage_class and storage_class != "STANDARD":
            extra["StorageClass"] = storage_class
        self.fs.put_file(str(local), self.path(key), chunksize=self.chunk_bytes, **extra)
        try:
            self.verify(key, size=size, sha256=digest)
        except StorageError:
            self.fs.rm(self.path(key))  # never leave a copy that does not match
            raise
        return StoredObject(self.key_url(key), size, digest)

    @bounded
    def restamp(
        self,
        key: str,
        tags: dict[str, str],
        *,
        size: int,
        sha256: str,
        storage_class: str | None = None,
        single_copy_limit: int = SINGLE_COPY_LIMIT,
        part_bytes: int = 512 * 2**20,
    ) -> None:
        """On S3, copy the object onto itself with `tags`: its creation date becomes now, so lifecycle
        rules count their days from the retag (a superseded baseline's grace period starts when it is
        superseded, not when it was uploaded). Metadata is kept, and the storage class unless
        `storage_class` names another; the copy is
        verified by reading it back. Objects over `single_copy_limit` (S3's 5 GiB CopyObject limit)
        are copied part by part (UploadPartCopy), atomically for readers.
        """
        if not self.is_s3:
            raise StorageError(f"{self!r}: restamp is for s3:// stores; elsewhere the archive manifest holds the dates")
        bucket, inner, _ = self.fs.split_path(self.path(key))
        head = self.fs.call_s3("head_object", Bucket=bucket, Key=inner)
        common = {
            "Tagging": urlencode(tags),
            "Metadata": head.get("Metadata", {}),
            "StorageClass": storage_class or head.get("StorageClass", "STANDARD"),
            "ChecksumAlgorithm": "SHA256",
        }
        copy = {"Bucket": bucket, "Key": inner, "CopySource": {"Bucket": bucket, "Key": inner}}
        if head["ContentLength"] <= single_copy_limit:
            self.fs.call_s3("copy_object", MetadataDirective="REPLACE", TaggingDirective="REPLACE", **copy, **common)
        else:
            self._copy_in_parts(copy, head["ContentLength"], part_bytes, common)
        self.fs.invalidate_cache(self.path(key))
        self.verify(key, size=size, sha256=sha256)

    def _copy_in_parts(self, copy: dict, size: int, part_bytes: int, common: dict) -> None:
        """A multipart copy of an object onto itself (UploadPartCopy); aborted on any error, the original intact."""
        bucket, inner = copy["Bucket"], copy["Key"]
        upload = self.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=inner, **common)["UploadId"]
        try:
            parts = []
            for number, start in enumerate(range(0, size, part_bytes), 1):
                byte_range = f"bytes={start}-{min(start + part_bytes, size) - 1}"
                copied = self.fs.call_s3(
                    "upload_part_copy", UploadId=upload, PartNumber=number, CopySourceRange=byte_range, **copy
                )
                parts.append({"PartNumber": number, "ETag": copied["CopyPartResult"]["ETag"]})
            self.fs.call_s3(
                "complete_multipart_upload", Bucket=bucket, Key=inner, UploadId=upload, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=inner, UploadId=upload)  # the original stays
            raise

    @bounded
    def get_tags(self, key: str) -> dict[str, str]:
        """The object's tags on S3 (empty elsewhere)."""
        return self.fs.get_tags(self.path(key)) if self.is_s3 else {}

    @bounded
    def put_bytes(self, payload: bytes, key: str) -> StoredObject:
        """Write a small object through the same verified path as put_file."""
        scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"drape-put-{uuid.uuid4().hex}"
        try:
            with whole_or_nothing(scratch, scratch, f"the scratch copy of {self.key_url(key)}", len(payload)):
                scratch.write_bytes(payload)
            return self.put_file(scratch, key)
        finally:
            scratch.unlink(missing_ok=True)

    @bounded
    def get_file(self, key: str, local: str | Path, *, sha256: str | None = None) -> Path:
        """Download to a temporary name, verify the hash if given, then rename into place."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        temporary = local.with_name(f".{local.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with whole_or_nothing(temporary, local, f"a download of {self.key_url(key)}", lambda: self.size(key)):
                self.fs.get_file(self.path(key), str(temporary))
        except FileNotFoundError:
            raise StorageError(f"{self.key_url(key)}: missing in the object store") from None
        if sha256 is not None and (actual := sha256_file(temporary)) != sha256:
            temporary.unlink(missing_ok=True)
            raise StorageError(f"{self.key_url(key)}: downloaded sha256 {actual} does not match expected {sha256}")
        fsync_file(temporary)
        os.replace(temporary, local)
        fsync_dir(local.parent)
        return local

    @bounded
    def open_read(self, key: str, offset: int = 0, block_bytes: int = 8 << 20):
        """A binary file object on the object, positioned at `offset` (ranged GETs on S3); its reads
        fail as this store's calls do (`drape.storage.network.BoundedReader`)."""
        try:
            handle = self.fs.open(self.path(key), "rb", block_size=block_bytes)
        except FileNotFoundError:
            raise StorageError(f"{self.key_url(key)}: missing in the object store") from None
        if offset:
            handle.seek(offset)
        return BoundedReader(handle, self)  # a body that stalls mid-stream: a StorageError naming the endpoint

    @bounded
    def read_bytes(self, key: str) -> bytes:
        try:
            return self.fs.cat_file(self.path(key))
        except FileNotFoundError:
            raise StorageError(f"{self.key_url(key)}: missing in the object store") from None

    @bounded
    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix` (recursive), relative to the store base, as the store has them now:
        s3fs's cached listing is dropped first (another node may have written since)."""
        root = self.path(prefix)
        self.fs.invalidate_cache(root)
        if not self.fs.exists(root):
            return []
        found = self.fs.find(root)
        base = self.base + "/"
        return sorted(path.removeprefix(base) for path in found if not path.rsplit("/", 1)[-1].count(".tmp-"))


def open_store(config, url: str | None = None) -> ObjectStore:
    """The pipeline's object store (a `PipelineConfig`), or the store at `url` with the config's
    endpoint, region and retry settings. A plain path means ``file://<absolute path>``."""
    storage = config.storage
    if url and "://" not in url:
        url = f"file://{Path(url).resolve()}"
    return ObjectStore(
        url or config.object_store_url,
        endpoint_url=storage.endpoint_url,
        region=storage.region,
        multipart_chunk_bytes=storage.multipart_chunk_bytes,
        retry_attempts=storage.retry_attempts,
        connect_timeout=storage.connect_timeout_seconds,
        read_timeout=storage.read_timeout_seconds,
        max_wait=storage.max_wait_seconds,
    )


def tree_bytes(path: str | Path) -> int:
    """Bytes of all regular files under `path` (0 if it does not exist)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def remove_tree(path: str | Path) -> None:
    path = Path(path)
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def remove_empty_dirs(directory: Path) -> None:
    """Remove the empty directories under `directory`, deepest first, then `directory` itself if empty."""
    if not directory.exists():
        return
    for path in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(path.iterdir()):
            path.rmdir()
    if not any(directory.iterdir()):
        directory.rmdir()
