"""Why a job failed, in the trainer's own words: its error read from the tail of its log.

An engine sees how a job ended (an exit code, a signal, a Slurm state), which rarely says why:
a torchrun job whose rank raised FileNotFoundError ends as "exit code 1" or, once Slurm or
torchrun tears the other ranks down, "exit code 143 (killed by SIGTERM)". The queue's recorded
reason is instead the trainer's error, taken from the job's log (`trainer_error`):

- the last `LOG_TAIL_BYTES` of the log only (a log may be gigabytes), read once, never whole;
- a Python exception line (the line after a traceback's frames, with torchrun's ``[rankN]:``
  prefix taken off), or a line drape prints as an error (``drape: error: …``,
  ``python -m drape.train: …``);
- the launcher's own wrapper errors (torchrun's ChildFailedError, elastic's SignalException) and
  the errors a rank raises only because another rank died first (a collective whose peer closed
  the connection) are chosen only when nothing else is there: the first root cause wins;
- every line is redacted (`drape.secrets.redact`) and cut to `MAX_REASON_CHARS`: secrets in
  the environment never reach the queue's message.
The engine's own account (exit code, signal, state) follows it in the message, and the log's
tail after that, as before.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from drape.secrets import redact

LOG_TAIL_BYTES = 64 * 1024
MAX_REASON_CHARS = 400
_PREFIX = re.compile(r"^(?:\[(?:rank|default)\d+\]: ?|\d+: )")  # torchrun's per-rank prefix; srun --label's
_EXCEPTION = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Requested|Failure))(?::\s?(.*))?$")
_DRAPE = re.compile(r"^(?:drape: error: |python -m drape\.train: )(.+)$")
_WRAPPERS = ("ChildFailedError", "SignalException", "KeyboardInterrupt", "SystemExit")
_SECONDARY = re.compile(
    r"DistBackendError|DistNetworkError|Connection closed by peer|Connection reset by peer|Broken pipe|"
    r"NCCL communicator was aborted|process group .* (?:aborted|destroyed)|Socket Timeout|gloo.*(?:closed|reset)",
    re.IGNORECASE,
)


def read_tail(path: str | Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last `limit` bytes of `path` as text ('' when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(os.fstat(handle.fileno()).st_size - limit, 0))
            return handle.read(limit).decode(errors="replace")
    except OSError:
        return ""


def _candidates(text: str) -> list[tuple[str, str]]:
    """(kind, line) of every error line in `text`, in order; kind: drape, exception, wrapper or secondary."""
    found = []
    in_traceback = False
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw).rstrip()
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
            continue
        if (drape := _DRAPE.match(line.strip())) is not None:
            found.append(("drape", drape.group(0)))
            continue
        if not in_traceback or not line or line[0].isspace():
            continue  # a frame of the traceback, or ordinary output
        in_traceback = False
        match = _EXCEPTION.match(line)
        if match is None:
            continue
        name = match.group(1).rsplit(".", 1)[-1]
        kind = "wrapper" if name in _WRAPPERS else "secondary" if _SECONDARY.search(line) else "exception"
        found.append((kind, line))
    return found


def trainer_error(text: str) -> str | None:
    """The trainer's own error in a log's `text` (see the module docstring), redacted, or None."""
    found = _candidates(text)
    for kinds in (("drape", "exception"), ("secondary",), ("wrapper",)):
        chosen = [line for kind, line in found if kind in kinds]
        if chosen:
            line = redact(chosen[0])
            return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 1] + "…"
    return None


def failure_message(account: str, tail: str, *, tail_chars: int = 900) -> str:
    """A failed job's message: the trainer's error from `tail` first (when there is one), then the
    engine's `account` of how it ended, then the log's last `tail_chars` characters (redacted); short
    enough that the queue, which keeps a message's last 1500 characters, keeps its head."""
    reason = trainer_error(tail)
    head = f"{reason} ({account})" if reason else account
    shown = redact(tail[-tail_chars:]) if tail else ""
    return head + (f"; log tail:\n{shown}" if shown else "")
