"""Per-shopper personalization's pieces on their own: ids, the ledger, the face-weighted loss, the
forget's journal (resumed after a kill, kept while a scan still finds something), the consent's
lifecycle rule and the job's memory profile."""

from __future__ import annotations

import json

import pytest

from drape.layout import LiveLayout, UnsafePathError, live_root, safe_shopper_id
from drape.shoppers import ShopperError
from drape.shoppers.adapter import face_weights
from drape.shoppers.forget import ForgetIncomplete, forget
from drape.shoppers.ledger import Ledger, read_ledger, write_ledger
from drape.shoppers.places import LivePlace, ObjectStorePlace
from drape.storage.lifecycle import shopper_rule
from drape.storage.store import open_store


@pytest.mark.parametrize("bad", ["ab", "jane@example.com", "../other", "a/b", ".hidden", "x" * 65, "with space", 7])
def test_a_shopper_id_is_an_opaque_pseudonym(bad):
    with pytest.raises(UnsafePathError, match="shopper id"):
        safe_shopper_id(bad)
    assert safe_shopper_id("shopper_01-A") == "shopper_01-A"


def test_the_ledger_round_trips_and_a_corrupt_one_names_itself(config):
    paths = LiveLayout(live_root(config)).shopper("shopper-01")
    ledger = Ledger.new("shopper-01", consent_days=30)
    ledger.remember("outputs", "/elsewhere")
    ledger.remember("outputs", "/elsewhere")
    write_ledger(paths, ledger)
    again = read_ledger(paths)
    assert again == ledger and again.outputs == ["/elsewhere"] and not again.expired
    paths.ledger.write_text("{not json")
    with pytest.raises(ShopperError, match="shopper.json: not a shopper ledger"):
        read_ledger(paths)


def test_the_loss_weighs_the_face_box():
    import numpy as np

    photos = {"target": np.zeros((2, 8, 8, 3), np.uint8), "meta": [{"face_box": [2, 1, 4, 3]}, {"face_box": [0, 0, 8, 8]}]}
    weights = face_weights(photos, 4.0)
    assert weights.shape == (2, 1, 8, 8)
    assert weights[0, 0, 1:3, 2:4].eq(5).all() and weights[0].sum() == 64 + 4 * 4
    assert weights[1].eq(5).all()


class _Place:
    """A place holding `files` under a folder; erase deletes them unless `stubborn`."""

    def __init__(self, name, folder, stubborn=False, explode=False):
        self.name, self.folder, self.stubborn, self.explode, self.calls = name, folder, stubborn, explode, 0

    def erase(self, subject):
        self.calls += 1
        if self.explode:
            raise KeyboardInterrupt
        removed = 0
        for path in list(self.folder.glob("*")) if not self.stubborn else []:
            path.unlink()
            removed += 1
        return {"files": removed}

    def scan(self, subject):
        return [str(p) for p in self.folder.glob("*")]


def test_a_forget_killed_midway_goes_on_from_its_journal_and_audits_without_personal_data(config, tmp_path):
    layout, store = LiveLayout(live_root(config)), open_store(config)
    folders = []
    for name in ("one", "two"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "photo.png").write_bytes(b"face")
        folders.append(folder)
    first, second = _Place("one", folders[0]), _Place("two", folders[1], explode=True)
    with pytest.raises(KeyboardInterrupt):
        forget(layout, store, "shopper-01", [first, second], log=lambda line: None)
    journal = next((layout.root / "privacy" / "pending").glob("*.json"))
    assert "shopper-01" not in journal.name and json.loads(journal.read_text())["erased"] == {"one": {"files": 1}}
    second.explode = False
    audit = forget(layout, store, "shopper-01", [first, second], log=lambda line: None)
    assert first.calls == 1 and second.calls == 2  # the first place was not erased twice
    assert audit["attempts"] == 2 and audit["verified"] and audit["erased"] == {"one": {"files": 1}, "two": {"files": 1}}
    assert not journal.exists()
    stored = store.read_bytes(f"privacy/audit/{audit['request']}.json").decode()
    assert "shopper-01" not in stored and json.loads(stored) == audit


def test_a_scan_that_still_finds_data_keeps_the_journal(config, tmp_path):
    layout, store = LiveLayout(live_root(config)), open_store(config)
    folder = tmp_path / "stubborn"
    folder.mkdir()
    (folder / "photo.png").write_bytes(b"face")
    with pytest.raises(ForgetIncomplete, match="the scan still finds the shopper's data: stubborn: 1"):
        forget(layout, store, "shopper-02", [_Place("stubborn", folder, stubborn=True)], log=lambda line: None)
    journal = next((layout.root / "privacy" / "pending").glob("*.json"))
    assert json.loads(journal.read_text())["erased"] == {}  # the next run erases everywhere again


def test_the_real_places_find_the_shopper_by_name_digest_and_mention(config, tmp_path):
    from drape.shoppers.forget import Subject
    from drape.shoppers.photos import PhotoDigests

    store, live = open_store(config), live_root(config)
    store.put_bytes(b"a photo", "shoppers/shopper-03/photos/p.tar")
    store.put_bytes(b"a photo", "datasets/leaked.tar")  # the same bytes elsewhere: found by digest
    (live / "logs").mkdir(parents=True)
    (live / "logs" / "job.log").write_text("training for shopper-03\n")
    digests = PhotoDigests()
    digests.add(b"a photo")
    subject = Subject("shopper-03", "r", "t", digests=digests.to_dict())
    objects, files = ObjectStorePlace(store), LivePlace(live / "shoppers" / "shopper-03", [live], [live / "privacy"])
    assert len(objects.scan(subject)) == 2 and files.scan(subject) == [f"{live / 'logs' / 'job.log'} (names the shopper)"]
    assert objects.erase(subject) == {"objects": 1} and objects.scan(subject) == [f"{store.key_url('datasets/leaked.tar')}"]


def test_the_consent_rule_expires_shopper_data_and_its_old_versions():
    rule = shopper_rule("drape/shoppers/", 365)
    assert rule["Filter"] == {"Prefix": "drape/shoppers/"} and rule["Expiration"] == {"Days": 365}
    assert rule["NoncurrentVersionExpiration"]["NoncurrentDays"] >= 1


def test_a_personalization_job_is_profiled_as_an_adapter_on_a_frozen_base(config):
    from drape import JobKind
    from scheduler.jobs.profiles import estimate, lora_parameters

    adapter = lora_parameters(config, None)
    assert adapter > 0
    peak, seconds = estimate(config, JobKind.PERSONALIZATION, None)
    wider = config.model_copy(update={"shoppers": config.shoppers.model_copy(update={"rank": 64, "steps": 4000})})
    assert lora_parameters(wider, None) == 8 * adapter
    assert estimate(wider, JobKind.PERSONALIZATION, None)[1] == pytest.approx(20 * seconds)
    assert estimate(wider, JobKind.PERSONALIZATION, None)[0] > peak


def test_forget_expired_erases_the_shoppers_whose_consent_ran_out(config, tmp_path):
    from datetime import UTC, datetime, timedelta

    from typer.testing import CliRunner

    from drape.cli import app
    from drape.shoppers.personalize import upload

    layout, store = LiveLayout(live_root(config)), open_store(config)
    for shopper, days_ago in (("shopper-old", 400), ("shopper-new", 10)):
        paths = layout.shopper(shopper)
        (paths.photos).mkdir(parents=True)
        (paths.photos / "photos-00000.tar").write_bytes(shopper.encode() * 10)
        write_ledger(paths, Ledger.new(shopper, 365, now=datetime.now(UTC) - timedelta(days=days_ago)))
        upload(store, paths, "photos", "shopper.json")
    path = tmp_path / "config.json"
    path.write_text(config.model_dump_json(by_alias=True))
    result = CliRunner().invoke(app, ["shopper", "forget", "--expired", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert "forgotten and verified" in result.output and result.output.count("audit record") == 1
    assert not layout.shopper("shopper-old").root.exists() and not store.list("shoppers/shopper-old/")
    assert read_ledger(layout.shopper("shopper-new")) is not None and store.list("shoppers/shopper-new/")
    assert CliRunner().invoke(app, ["shopper", "forget", "--config", str(path)]).exit_code == 2
