"""The production gate in the flow (issue 67): configs/rehearsal-gate.yaml's gate section (dlib identity
with the drift rule, PP-OCR text fidelity, the wide nuisance suite, identity's floor margin) over the
four stages of the staged-training flow (Prefect's test harness, MLflow on SQLite), calibrated in the
test by `drape gate calibrate --nuisance --write` on the dataset's own control set.

A model trained for seconds on a CPU draws no face a recognizer finds and no price it reads, so the
runs are made at the gate: each gate samples the real candidate (its outputs, latents and report are
written as always) and then judges outputs built from the control targets, as a good or a regressed
model would render them (`drape.data.synth.redraw`: the same scene with one thing changed):
- a good run: the targets as delivered (JPEG q90); all four stages pass;
- another person's face (the other packaged portrait): the first gate stops the run, and the alert
  names identity's rule ('another person');
- a changed price (each tag's last digit moved by one): the first gate stops the run, the alert names
  texture's OCR rule ('text misread').
The regressed runs go first: a stage that fails promotes nothing, so every gate here is a stage's
first and measures its floor on the control targets, which calibration measured already in this
process (`drape.gates.verdict.floor` remembers the scores by content).
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from drape import STAGES, pipeline
from drape.config import deep_merge
from drape.data.portraits import PORTRAITS
from drape.data.synth import garment_of, identity_of, redraw
from drape.gates import run as gate_run
from tests.conftest import _seed_mlflow, slack_stand_in

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def jpeg_q90(images: np.ndarray) -> np.ndarray:
    def once(image):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=90)
        return np.asarray(Image.open(buffer).convert("RGB"))

    return np.stack([once(image) for image in images])


def another_face(config, control) -> np.ndarray:
    """Each target with the other packaged portrait's face: the same scene, another person."""
    images = []
    for meta in control["meta"]:
        identity = identity_of(meta)
        other = PORTRAITS[(PORTRAITS.index(identity.portrait) + 1) % len(PORTRAITS)]
        images.append(np.asarray(redraw(config.seed, meta, identity=replace(identity, portrait=other)).target))
    return jpeg_q90(np.stack(images))


def changed_price(config, control) -> np.ndarray:
    """Each target with its price tag's last digit one less ('$49' → '$48', '$40' → '$49'): the same
    scene, another price."""
    images = []
    for meta in control["meta"]:
        garment = garment_of(meta)
        price = garment.logo[:-1] + str((int(garment.logo[-1]) + 9) % 10)
        images.append(np.asarray(redraw(config.seed, meta, garment=replace(garment, logo=price)).target))
    return jpeg_q90(np.stack(images))


def good(config, control) -> np.ndarray:
    return jpeg_q90(control["target"])


def judged_as(monkeypatch, render) -> None:
    """Each gate samples its candidate as always, then judges `render(config, control)` in place of
    its outputs (the PNGs in the gate's outputs folder are those images too)."""
    real = gate_run.generate_outputs

    def generate(config, checkpoint, control, gate_dir):
        real(config, checkpoint, control, gate_dir)
        outputs = render(config, control)
        for key, image in zip(control["keys"], outputs):
            Image.fromarray(image).save(Path(gate_dir) / "outputs" / f"{key}.png")
        return outputs

    monkeypatch.setattr(gate_run, "generate_outputs", generate)


@pytest.fixture(scope="module")
def slack():
    """Slack's stand-in for the whole module (`slack_webhook` is per test): (URL, payloads)."""
    with slack_stand_in() as served:
        yield served


@pytest.fixture(scope="module")
def runs(tmp_path_factory, prefect_harness, slack):
    from drape.cli import app
    from flows.staged_training import staged_training

    root = tmp_path_factory.mktemp("production-gate")
    data = yaml.safe_load((REPO / "configs" / "rehearsal-gate.yaml").read_text())
    data = deep_merge(data, {"paths": {"root": str(root / "drape")}})
    base = root / "rehearsal-gate.yaml"
    base.write_text(yaml.safe_dump(data))
    cli = CliRunner()
    made = cli.invoke(app, ["data", "synth", "--config", str(base)])
    assert made.exit_code == 0, made.output
    calibrated = root / "calibrated.yaml"
    control = root / "drape" / "objects" / "datasets" / data["data"]["name"] / "v1"
    args = ["gate", "calibrate", "--config", str(base), "--control", str(control), "--nuisance", "--redraws", "100"]
    calibration = cli.invoke(app, [*args, "--stage", "identity", "--write", str(calibrated)])
    assert calibration.exit_code == 0, calibration.output
    from drape.config import load_config

    config = load_config(calibrated)
    if config.tracking_uri.startswith("sqlite:///"):
        _seed_mlflow(Path(config.tracking_uri.removeprefix("sqlite:///")))
    url, received = slack
    patch = pytest.MonkeyPatch()
    patch.setenv(config.alerts.slack_webhook_env, f"{url}/ok/services/T0/B0/secret")
    results: dict[str, dict] = {"calibration": {"output": calibration.output, "config": yaml.safe_load(calibrated.read_text())}}
    try:
        for name, render in (("another face", another_face), ("changed price", changed_price)):
            judged_as(patch, render)
            before = len(received)
            with pytest.raises(pipeline.GateFailed) as failed:
                staged_training(config_path=str(calibrated), run_name=name.replace(" ", "-"))
            results[name] = {"message": str(failed.value), "alerts": received[before:]}
        judged_as(patch, good)
        results["good"] = {"summary": staged_training(config_path=str(calibrated), run_name="good")}
    finally:
        patch.undo()
    results["config"] = config
    print(json.dumps({k: v for k, v in results.items() if k != "config"}, indent=1, default=str))  # the values, for the report
    return results


def _alert_text(alert: dict) -> str:
    """The message's text (the failure lines, rules named) and its blocks' (each check's value)."""
    return "\n".join([alert.get("text", "")] + [block["text"]["text"] for block in alert["blocks"] if "text" in block])


def test_calibration_sets_the_per_sample_rules_for_this_resolution(runs):
    calibrated = runs["calibration"]["config"]["gates"]
    assert set(calibrated["identity"]) == {"max_drift"}  # min_similarity stays 'nuisance': measured at each gate
    assert {"min_text_lower", "max_misread_share", "min_fidelity"} <= set(calibrated["texture"])
    assert "min_score" in calibrated["coherence"]
    output = runs["calibration"]["output"]
    assert "gates.identity.max_drift:" in output and "margin 0.02" in output and "(256x192 px)" in output


def test_a_good_run_passes_all_four_production_gates(runs):
    summary = runs["good"]["summary"]
    assert [row["stage"] for row in summary["stages"]] == list(STAGES)
    assert all(row["verdict"] == "pass" for row in summary["stages"]), [(r["stage"], r["checks"]) for r in summary["stages"]]


def test_another_persons_face_stops_the_first_gate_named_in_the_alert(runs):
    result = runs["another face"]
    assert "gate failed at stage identity" in result["message"]
    assert "identity: another person in 6 of 6 outputs" in result["message"]
    assert len(result["alerts"]) == 1
    alert = _alert_text(result["alerts"][0])
    assert "the rule that fired: another person" in alert and "*identity*" in alert and "text misread" not in alert


def test_a_changed_price_stops_the_first_gate_named_in_the_alert(runs):
    result = runs["changed price"]
    assert "gate failed at stage identity" in result["message"]
    assert "texture: text misread" in result["message"] and "another person" not in result["message"]
    assert len(result["alerts"]) == 1
    alert = _alert_text(result["alerts"][0])
    assert "the rule that fired: text misread" in alert and "another person" not in alert
