"""The one redaction every message, log line, report and error goes through before it leaves drape.

drape never keeps a secret in its config (every URL there is checked: `check_no_credentials`), so
config dumps (MLflow params, checkpoint manifests, job-config.json, summaries) hold none. What
can still reach a message is a secret of the environment (S3 keys, database and MLflow
passwords, the Slack webhook, the checkpoint signing key) or a URL someone typed with
credentials in it; `redact` removes both: the value of every variable in `SECRET_VARIABLES` (and
any named by `register_secret_variable`), the user-info of any URL, credential-looking query
parameters and Slack webhook paths.
"""

from __future__ import annotations

import logging
import os
import re
from urllib.parse import urlsplit

SECRET_VARIABLES = {
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "PGPASSWORD",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "DRAPE_SLACK_WEBHOOK_URL",
    "DRAPE_CHECKPOINT_KEY",
    "PREFECT_API_KEY",
    "PREFECT_API_AUTH_STRING",
}
REDACTED = "***"
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"]+@")
_QUERY_SECRET = re.compile(
    r"(?i)([?&](?:x-amz-[a-z-]+|token|access_token|password|passwd|secret|signature|sig|key|api_key)=)[^&\s'\"]+"
)
_SLACK = re.compile(r"(?i)(hooks\.slack\.com/(?:services|workflows|triggers)/)[^\s'\")]+")
_MIN_SECRET_LENGTH = 6  # shorter values would blank out ordinary words


def register_secret_variable(name: str) -> None:
    """Treat the value of environment variable `name` as a secret too (e.g. a configured webhook variable)."""
    SECRET_VARIABLES.add(name)


def _secret_values() -> list[str]:
    values = {os.environ.get(name, "") for name in SECRET_VARIABLES}
    return sorted((v for v in values if len(v) >= _MIN_SECRET_LENGTH), key=len, reverse=True)


def redact(text: object) -> str:
    """`text` with every known secret value, URL user-info, credential query parameter and Slack
    webhook path replaced by ``***``."""
    text = str(text)
    for value in _secret_values():
        text = text.replace(value, REDACTED)
    text = _USERINFO.sub(rf"\1{REDACTED}@", text)
    text = _QUERY_SECRET.sub(rf"\1{REDACTED}", text)
    return _SLACK.sub(rf"\1{REDACTED}", text)


def has_credentials(url: str) -> bool:
    """True when `url` carries a password (``user:password@``) or a credential query parameter (a
    user name alone is not a secret: ``postgresql://drape@db/queue`` with PGPASSWORD is the way)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return True  # unparseable: treat as unsafe, the caller's message does not echo it
    return bool(parts.password or _QUERY_SECRET.search(url))


def check_no_credentials(name: str, url: str | None, where_instead: str) -> None:
    """ValueError (naming the field, never echoing the URL) when a config URL carries credentials."""
    if url and has_credentials(url):
        raise ValueError(
            f"{name} must not carry credentials (a password in user:password@ or a token in the query); {where_instead}"
        )


_installed = False


def install_log_redaction() -> None:
    """Redact every log record this process creates, whichever logger and handler (drape's,
    Prefect's, botocore's): a record factory that renders the message once and redacts it.
    Idempotent; `drape` runs it on import."""
    global _installed
    if _installed:
        return
    make = logging.getLogRecordFactory()

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the logging module's to report
            return record
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return record

    logging.setLogRecordFactory(factory)
    _installed = True
