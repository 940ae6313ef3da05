"""The grammars of the names drape hands to other systems, in one place: Slurm, Kubernetes, labels.

A name that reaches an sbatch script (``#SBATCH --gres=gpu:<type>:N``), a Kubernetes object or a
label is read by that system's own parser, not by drape: a GPU type ``h100 --uid=0`` becomes a
second sbatch option, a namespace ``drape/../kube-system`` a path in an API URL, a newline a new
directive. Each name is checked twice against the same grammar here: when the config (or fleet
file, or CLI option) is loaded, so the mistake is named with its field and file, and again where
the script or object is written, since a name can also come from the queue database or the fleet
metrics. A refusal is a `NameRefused` (a ValueError) naming where the value came from, the value
and what was expected.

Grammars (each system's own documentation):
- Slurm partition, account, gres type: letters, digits and ``_ . + -``, starting with a letter,
  digit or ``_`` (no space, comma, ``=``, ``:`` or bracket, which sbatch and gres specs split on).
- Slurm/Kubernetes node: an RFC 1123 host name label, case kept: ``[A-Za-z0-9]``, then letters,
  digits, ``. _ -``, ending with a letter or digit, at most 63 characters (the kubelet's
  ``kubernetes.io/hostname`` label value limit).
- Slurm job name: letters, digits and ``_ . -``, at most 200 characters.
- Kubernetes DNS-1123 label (namespace, Service, LocalQueue): ``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, ≤ 63.
- Kubernetes DNS-1123 subdomain (object names, Secrets, claims): labels joined by dots, ≤ 253.
- Label key: ``[prefix/]name``, prefix a DNS subdomain, name ≤ 63 of ``[A-Za-z0-9]`` with
  ``- _ .`` inside; label value: empty or such a name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator

SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
NODE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
SLURM_JOB_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NODE_EXPECTED = "a host name: letters, digits and . _ -, starting and ending alphanumeric, ≤ 63"
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")


class NameRefused(ValueError):
    """A name another system would read otherwise than drape means it; the message names its source."""


def _refuse(where: str, value: object, expected: str) -> NameRefused:
    """`where` empty: a config field's check, whose error the loader completes with the field, file and value."""
    if isinstance(value, str) and any(ord(character) < 32 or ord(character) == 127 for character in value):
        expected = f"no control characters (newline, tab, escape): control characters are refused; {expected}"
    return NameRefused(f"{where} {value!r}: expected {expected}" if where else f"expected {expected}")


def _check(pattern: re.Pattern[str], value: object, where: str, expected: str, max_length: int = 0) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value) or (max_length and len(value) > max_length):
        raise _refuse(where, value, expected)
    return value


def slurm_name(value: object, where: str = "a Slurm name") -> str:
    """`value` as a Slurm partition, account or gres type; NameRefused otherwise."""
    return _check(SLURM_NAME, value, where, "a Slurm name: letters, digits and _ . + - (at most 128, no space, comma or =)")


def node_name(value: object, where: str = "a node name") -> str:
    """`value` as a node's name (Slurm's NodeName, Kubernetes' kubernetes.io/hostname); NameRefused otherwise."""
    return _check(NODE_NAME, value, where, NODE_EXPECTED)


def slurm_job_name(value: object, where: str = "a Slurm job name") -> str:
    return _check(SLURM_JOB_NAME, value, where, "a Slurm job name: letters, digits and _ . - (at most 200)")


def dns_label(value: object, where: str = "a Kubernetes name") -> str:
    """`value` as an RFC 1123 label (a namespace, a Service); NameRefused otherwise."""
    return _check(DNS_LABEL, value, where, "an RFC 1123 label: lower-case letters, digits and -, alphanumeric at both ends, ≤ 63")


def dns_subdomain(value: object, where: str = "a Kubernetes name") -> str:
    """`value` as an RFC 1123 subdomain (most object names); NameRefused otherwise."""
    expected = "an RFC 1123 subdomain: dot-separated lower-case labels of letters, digits and -, ≤ 253"
    return _check(DNS_SUBDOMAIN, value, where, expected, 253)


def label_key(value: object, where: str = "a label key") -> str:
    """`value` as a Kubernetes label key (``[prefix/]name``); NameRefused otherwise."""
    expected = "a label key: an optional DNS subdomain prefix and /, then ≤ 63 of letters, digits and - _ . (alphanumeric ends)"
    prefix, slash, name = value.rpartition("/") if isinstance(value, str) else ("", "", "")
    prefix_ok = not slash or (DNS_SUBDOMAIN.fullmatch(prefix) is not None and len(prefix) <= 253)
    if not prefix_ok or not LABEL_NAME.fullmatch(name):
        raise _refuse(where, value, expected)
    return name if not slash else f"{prefix}/{name}"


def label_value(value: object, where: str = "a label value") -> str:
    """`value` as a Kubernetes label value (empty, or ≤ 63 of letters, digits and - _ .); NameRefused otherwise."""
    if value == "":
        return ""
    return _check(LABEL_NAME, value, where, "a label value: empty, or ≤ 63 of letters, digits and - _ . (alphanumeric ends)")


def product_label(model: str, products: Mapping[str, str]) -> str:
    """The node label value of GPU `model`'s product: `products` (queue.kubernetes.products) where it
    lists the model, else the value NVIDIA's GPU feature discovery gives ``nvidia.com/gpu.product``
    (the product name with each space as '-': DCGM's "NVIDIA H100 80GB HBM3" is
    "NVIDIA-H100-80GB-HBM3"), checked as a label value."""
    value = products.get(model) or re.sub(r"\s+", "-", model.strip())
    return label_value(value, f"the product label of GPU model {model!r} (queue.kubernetes.products)")


def labels(mapping: Mapping[str, Any] | None, where: str) -> None:
    """Every key and value of a label map (also a nodeSelector's); NameRefused naming the first bad one."""
    for key, value in (mapping or {}).items():
        label_key(key, f"{where}: label key")
        label_value(value, f"{where}: label {key!r}")


_SBATCH_OPTIONS = {  # the options drape writes, each value's grammar
    "job-name": slurm_job_name,
    "comment": lambda value, where: slurm_job_name(value.removeprefix("drape:"), where),
    "nodelist": lambda value, where: [node_name(node, where) for node in value.split(",")],
    "gres": lambda value, where: _gres(value, where),
    "partition": slurm_name,
    "account": slurm_name,
    "output": lambda value, where: _path(value, where),
}
_SBATCH_FLAGS = re.compile(
    r"--(nodes|ntasks-per-node|cpus-per-task|time)=\d+|--(mem|mem-per-gpu)=\d+[MG]?|--signal=B:USR1@\d+|"
    r"--open-mode=append|--export=ALL|--requeue|--no-requeue"
)


def sbatch_directives(script: str, where: str) -> None:
    """Every ``#SBATCH`` line of a rendered batch script parsed back as sbatch reads it: one option
    per line, an option drape writes, its value in that option's grammar; NameRefused naming `where`
    and the line otherwise (a space or newline in a name would have made a second option)."""
    for line in script.splitlines():
        if not line.startswith("#SBATCH"):
            continue
        words = line.split()
        option, _, value = words[-1].removeprefix("--").partition("=")
        if len(words) != 2 or not words[1].startswith("--"):
            raise _refuse(f"{where}: sbatch directive", line, "exactly one --option per #SBATCH line")
        if option in _SBATCH_OPTIONS:
            _SBATCH_OPTIONS[option](value, f"{where}: sbatch --{option}")
        elif not _SBATCH_FLAGS.fullmatch(words[1]):
            raise _refuse(f"{where}: sbatch directive", line, "an option drape writes (scheduler/engines/slurm)")


def _gres(value: str, where: str) -> str:
    parts = value.split(":")
    if parts[0] != "gpu" or len(parts) not in (2, 3) or not parts[-1].isdigit():
        raise _refuse(where, value, "gpu[:<type>]:<count>")
    return slurm_name(parts[1], where) if len(parts) == 3 else value


def _path(value: str, where: str) -> str:
    if not value or any(character.isspace() or ord(character) < 32 or ord(character) == 127 for character in value):
        raise _refuse(where, value, "a path without spaces or control characters")
    return value


SELECTORS = ("nodeSelector", "node_selector", "nodeLabels", "matchLabels", "match_labels")


def kubernetes_object(body: Mapping[str, Any], where: str = "") -> None:
    """The names of a rendered object (a plain dict, as the API receives it): every metadata's name,
    namespace and labels (the object's and its pod templates'), every label selector and node
    affinity term inside; NameRefused naming the object and the field."""
    meta = body.get("metadata") or {}
    _walk(body, where or f"{body.get('kind', 'object')} {meta.get('name', '?')}")


def _walk(value: object, where: str) -> None:
    if isinstance(value, list):
        for item in value:
            _walk(item, where)
    if not isinstance(value, Mapping):
        return
    for key, item in value.items():
        if key == "metadata" and isinstance(item, Mapping):
            _metadata(item, where)
        elif key in SELECTORS:
            labels(item, f"{where}: {key}")
        elif key in ("matchExpressions", "match_expressions") and isinstance(item, list):
            for term in item:
                label_key(term.get("key"), f"{where}: {key}: key")
                for each in term.get("values") or ():
                    label_value(each, f"{where}: {key}: {term.get('key')} value")
        else:
            _walk(item, where)


def _metadata(meta: Mapping[str, Any], where: str) -> None:
    if meta.get("name") is not None:
        dns_subdomain(meta["name"], f"{where}: metadata.name")
    if meta.get("namespace") is not None:
        dns_label(meta["namespace"], f"{where}: metadata.namespace")
    labels(meta.get("labels"), f"{where}: metadata.labels")


def _validator(check):
    def validate(value: str) -> str:
        check(value, "")
        return value

    return AfterValidator(validate)


# Pydantic field types for configs: a bad value fails at load, with the field and the file (drape.config)
SlurmName = Annotated[str, _validator(slurm_name)]
NodeName = Annotated[str, _validator(node_name)]
DnsLabel = Annotated[str, _validator(dns_label)]
DnsSubdomain = Annotated[str, _validator(dns_subdomain)]
LabelKey = Annotated[str, _validator(label_key)]
LabelValue = Annotated[str, _validator(label_value)]
