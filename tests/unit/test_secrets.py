"""drape/secrets.py: secrets are redacted from text and from every log record, whatever logger writes it."""

from __future__ import annotations

import logging

from drape.secrets import redact
from tests.conftest import SENTINEL


def test_redact_removes_env_secrets_userinfo_tokens_and_webhooks(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SENTINEL)
    text = (
        f"key {SENTINEL}; postgresql://u:pw12345@db/q; https://x/y?X-Amz-Signature=abcdef&ok=1; "
        "https://hooks.slack.com/services/T000/B000/XXXXSECRET"
    )
    cleaned = redact(text)
    for secret in (SENTINEL, "pw12345", "abcdef", "XXXXSECRET"):
        assert secret not in cleaned
    assert "ok=1" in cleaned and "db/q" in cleaned


def test_log_records_are_redacted(monkeypatch):
    monkeypatch.setenv("PGPASSWORD", SENTINEL)
    record = logging.getLogger("botocore").makeRecord("botocore", logging.ERROR, __file__, 1, "no %s", (SENTINEL,), None)
    assert SENTINEL not in record.getMessage() and "no ***" == record.getMessage()  # any logger: drape's factory
