"""The storage report: bytes by kind and class, modelled cost, next expiries."""

import json
from datetime import UTC, datetime, timedelta

import pytest

from drape.storage.report import live_bytes_by_kind, storage_report
from drape.storage.store import ObjectStore


def test_report_counts_live_and_archived_bytes_and_models_cost(config, tmp_path):
    live = tmp_path / "live"
    for relative, size in {
        "baselines/identity/checkpoint/model/w.safetensors": 1000,
        "baselines/identity/outputs/a.png": 100,
        "shards/texture/shard-00000.tar": 500,
    }.items():
        (live / relative).parent.mkdir(parents=True, exist_ok=True)
        (live / relative).write_bytes(b"x" * size)
    assert live_bytes_by_kind(live) == {"checkpoint": 1000, "validation_output": 100, "synthetic_imagery": 500}
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    now = datetime(2026, 11, 30, tzinfo=UTC)
    records = [
        {
            "key": "runs/r/identity/checkpoints/x",
            "kind": "checkpoint",
            "outcome": "passed",
            "storage_class": "STANDARD_IA",
            "bytes": 2 * 10**9,
            "expires_at": (now + timedelta(days=90)).isoformat(),
        },
        {
            "key": "runs/r/identity/gate/report.json",
            "kind": "gate_report",
            "outcome": "passed",
            "storage_class": "STANDARD",
            "bytes": 10**9,
            "expires_at": None,
        },
        {
            "key": "runs/q/identity/checkpoints/old",
            "kind": "checkpoint",
            "outcome": "failed_candidate",
            "storage_class": "STANDARD",
            "bytes": 5 * 10**9,
            "expires_at": (now - timedelta(days=1)).isoformat(),
        },
    ]
    store.put_bytes("".join(json.dumps(r) + "\n" for r in records).encode(), "archive/manifests/r/identity.jsonl")
    report = storage_report(config, store, live, now=now)
    assert report["archived_bytes"] == {"checkpoint/passed/STANDARD_IA": 2 * 10**9, "gate_report/passed/STANDARD": 10**9}
    assert report["monthly_cost_usd"]["archive"] == pytest.approx(2 * 0.0125 + 1 * 0.023)
    assert report["monthly_cost_usd"]["live"] == pytest.approx(1600 / 1e9 * 0.08)
    assert [item["key"] for item in report["expires_next"]] == ["runs/r/identity/checkpoints/x"]
