"""The Prefect tasks' logic through `.fn()` (no orchestrator): one stage through the whole DAG
(`one_stage` in conftest), each task one core call."""

from __future__ import annotations

from pathlib import Path

from drape import STAGES, Mode
from tasks import stages as t


def test_the_tasks_run_a_stage_end_to_end(one_stage):
    context, staged, trained, report, artifacts, snap, archived, summary = one_stage
    assert context.mode is Mode.FULL and set(context.stage_run_ids) == set(STAGES)
    assert staged["stage"] == "identity" and staged["shards"] > 0
    assert trained.steps == 4 and Path(trained.checkpoint).name == "step-0000004"
    assert report.passed and [key for key, _ in artifacts] == ["gate-report-identity"]
    assert "# Gate `identity`: **PASS**" in artifacts[0][1] and "| identity |" in artifacts[0][1]
    assert snap["alias"] == "identity-baseline" and Path(snap["checkpoint"]).is_dir()
    assert summary["stages"][0]["stage"] == "identity" and summary["stages"][0]["verdict"] == "pass"
    assert summary["stages"][0]["archived_bytes"] == archived["archived_bytes"] > 0


def test_the_relay_keeps_progress_and_errors_only(capsys):
    relay = t._relay("texture")
    for line in ("train-texture: step 3/30 (10%)", "INFO noise", "Traceback (most recent call last):", "ValueError: bad"):
        relay(line)
    assert capsys.readouterr().out.splitlines() == [
        "train-texture: step 3/30 (10%)",
        "Traceback (most recent call last):",
        "ValueError: bad",
    ]
