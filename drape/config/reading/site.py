"""Site values: where one installation of drape keeps things (paths, endpoints, secret, node and image
names), kept in a site file of its own, never in a tracked config.

A production config declares the site values it takes with a `site:` mapping, each field
`required` or `optional` (configs/base/production.yaml, configs/clusters/*.yaml); the values come
from the site file named by ``DRAPE_SITE`` (or ``drape --site FILE``, which sets it for the command
and everything it starts). `configs/site.example.yaml` lists every one: copy it, fill it in and
point drape at the copy. One site file serves every production config of an installation: each
config takes the fields it declares and leaves the others (the Slurm partition is no Kubernetes
config's business). A config that declares none (the demo, the rehearsal) reads no site file.

The site file is untrusted input like a config: read through the bounded loader, and a key that is
not a site value (a typo, a training setting) is refused naming the file and the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from drape.config.base import ConfigError
from drape.config.reading.extends import CONFIGS_ROOT, read_mapping

SITE = "site"
SITE_ENV = "DRAPE_SITE"
EXAMPLE_SITE = CONFIGS_ROOT / "site.example.yaml"
Need = Literal["required", "optional"]

# every field a site file may set: where things are, never how a model trains (the config
# reference describes each: docs/reference/config.md)
SITE_FIELDS = (
    "paths.root",
    "data.cache.dir",
    "storage.object_store_url",
    "storage.endpoint_url",
    "storage.region",
    "tracking.uri",
    "tracking.artifact_root",
    "metrics.pushgateway_url",
    "alerts.slack_webhook_secret_block",
    "queue.url",
    "queue.prometheus_url",
    "queue.inventory",
    "queue.kubernetes.namespace",
    "queue.kubernetes.image",
    "queue.kubernetes.service_account",
    "queue.kubernetes.credentials_secret",
    "queue.kubernetes.products",
    "queue.kubernetes.volume_claims",
    "queue.kubernetes.kueue_queue",
    "queue.slurm.partition",
    "queue.slurm.account",
    "queue.slurm.gres_types",
    "queue.slurm.gpu_memory_gib",
    "queue.slurm.setup",
    "queue.slurm.log_dir",
    "shoppers.mlflow_backend_store_uri",
    "eval.inception_path",
    "eval.lpips_backbone_path",
)


def site_path(site: str | Path | None = None) -> Path | None:
    """The site file: `site` when given, else ``$DRAPE_SITE``; None when neither is set."""
    named = site if site not in (None, "") else os.environ.get(SITE_ENV, "")
    return Path(named) if named else None


def declared_site_fields(data: dict, source: str) -> dict[str, Need]:
    """The `site:` directive of a config's (extends-resolved) mapping, checked: field → need."""
    declared = data.get(SITE) or {}
    if not isinstance(declared, dict):
        raise ConfigError(f"{source}: {SITE}: expected a mapping of site fields to required|optional, got {declared!r}")
    for field, need in declared.items():
        if field not in SITE_FIELDS:
            raise ConfigError(f"{source}: {SITE}: {field!r} is not a site value (site values: {', '.join(SITE_FIELDS)})")
        if need not in ("required", "optional"):
            raise ConfigError(f"{source}: {SITE}.{field}: expected required or optional, got {need!r}")
    return declared


def read_site(path: Path) -> dict[str, object]:
    """The values the site file at `path` sets, by dotted field name; ConfigError naming the file and
    the field for anything that is not a site value."""
    data = read_mapping(path, "site")
    values: dict[str, object] = {}
    _collect(data, "", path, values)
    return values


def _collect(data: dict, prefix: str, path: Path, values: dict[str, object]) -> None:
    for key, value in data.items():
        field = f"{prefix}{key}"
        if field in SITE_FIELDS:
            values[field] = value
        elif isinstance(value, dict) and any(name.startswith(f"{field}.") for name in SITE_FIELDS):
            _collect(value, f"{field}.", path, values)
        else:
            raise ConfigError(
                f"{path}: {field}: not a site value (a site file holds where things are, never how a model trains; "
                f"site values: {', '.join(SITE_FIELDS)})"
            )


def apply_site(data: dict, source: str, site: str | Path | None = None) -> tuple[dict, str]:
    """`data` (a config's mapping) with its `site:` directive removed and the fields it declares set
    from the site file; and the source to name in errors (the config, and the site file it read).
    A config that declares no site field is returned as it is, whatever DRAPE_SITE says."""
    declared = declared_site_fields(data, source)
    data = {key: value for key, value in data.items() if key != SITE}
    if not declared:
        return data, source
    path = site_path(site)
    required = [field for field, need in declared.items() if need == "required"]
    if path is None:
        raise ConfigError(
            f"{source}: {SITE}: this config takes its site values ({', '.join(required or declared)}) from a site "
            f"file, and none is given: copy {EXAMPLE_SITE.relative_to(CONFIGS_ROOT.parent)}, fill it in, and set "
            f"{SITE_ENV}=<your copy> (or run drape --site <your copy> ...)"
        )
    values = read_site(path)
    missing = [field for field in required if field not in values]
    if missing:
        raise ConfigError(f"{source}: {SITE}: the site file {path} does not set {', '.join(missing)}, which this config requires")
    for field in declared:
        if field in values:
            data = _set(data, field.split("."), values[field])
    return data, f"{source} (site values from {path})"


def _set(data: dict, keys: list[str], value: object) -> dict:
    """A copy of `data` with the value at `keys` (a dotted field) set, sections created as needed."""
    head, *rest = keys
    inner = data.get(head)
    return {**data, head: _set(inner if isinstance(inner, dict) else {}, rest, value) if rest else value}
