"""The Dockerfile keeps the promises the manifests rely on, checked without building it (no engine
here): every program a pod runs is installed, the working directory is the deployments', the user
is the securityContexts', the name `make image` tags is the one every manifest pulls, and the build
context keeps environments, history and caches out but nothing the build needs."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import re
import shlex
import tomllib
from pathlib import Path

import yaml

from drape.config import KubernetesLauncherConfig, load_config
from scheduler.engines.kubernetes.objects import build_job
from scheduler.policy import GpuState

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = json.loads((REPO / "deployments" / "gpu-k8s-job-template.json").read_text())
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VENV_PYTHON = "/opt/venv/bin/python"  # sys.executable in the image: the python of every queue job's command


def _instructions() -> list[tuple[str, str, str]]:
    """(stage, instruction, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in (REPO / "Dockerfile").read_text().splitlines() if not line.startswith("#"))
    )
    found, stage = [], ""
    for line in filter(None, (line.strip() for line in text.splitlines())):
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM":
            stage = arguments.split(" AS ")[-1].strip() if " AS " in arguments else arguments
        found.append((stage, instruction.upper(), " ".join(arguments.split())))
    return found


def _in(stage: str, instruction: str) -> list[str]:
    return [arguments for s, i, arguments in _instructions() if s == stage and i == instruction]


def _bases() -> dict[str, str]:
    """variant → its base image."""
    return {
        s.removeprefix("base-"): args.split(" AS ")[0] for s, i, args in _instructions() if i == "FROM" and s.startswith("base-")
    }


def _scripts(distribution: str) -> set[str]:
    entry_points = importlib.metadata.distribution(distribution).entry_points
    return {e.name for e in entry_points.select(group="console_scripts")}


def _pinned(requirement: str, name: str) -> str | None:
    found = re.fullmatch(rf"{re.escape(name)}\s*==\s*([\w.]+)", requirement.split(";")[0].strip())
    return found.group(1) if found else None


def _provided() -> set[str]:
    """The programs on the final image's PATH (/opt/venv/bin first) and the shell every base has:
    the console scripts of drape, of its dependencies and of what the Dockerfile installs besides."""
    env = " ".join(_in("image", "ENV"))
    assert re.search(r"PATH=/opt/venv/bin:\$PATH", env), "the image's PATH must start with the venv"
    installs = " ".join(_in("image", "RUN"))
    assert re.search(r"pip install [^&]*/opt/drape(\s|$)", installs), "the image must pip install the project at /opt/drape"
    programs = {"/bin/sh", "python", VENV_PYTHON} | _scripts("drape")
    for requirement in PYPROJECT["project"]["dependencies"]:
        name = re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0]
        programs |= _scripts(name)
    for variant in _bases():
        runs = " ".join(_in(f"base-{variant}", "RUN"))
        assert "-m venv /opt/venv" in runs, f"base-{variant} must create the venv at /opt/venv"
    return programs


def _manifest_programs() -> dict[str, str]:
    """program → where a pod runs it: the queue's three pod shapes, infra/k8s's containers of the
    drape image, and the flow pods of the gpu-k8s pool (Prefect's worker fills `{{ command }}`)."""
    from prefect.workers.base import BaseJobConfiguration

    job = {
        "id": "stage-training-abc",
        "kind": "stage-training",
        "command": json.dumps([VENV_PYTHON, "-m", "drape.train", "--job", "s3://b/j.json"]),
        "labels": json.dumps({"launch": "torchrun"}),
    }
    one = [GpuState(f"n0/gpu{i}", "n0", "H100-80GB", 80) for i in range(8)]
    two = one + [GpuState(f"n1/gpu{i}", "n1", "H100-80GB", 80) for i in range(8)]
    settings = KubernetesLauncherConfig()
    found: dict[str, str] = {}
    commands = [
        ("queue Job", build_job(job, one, settings).spec.template.spec.containers[0].command),
        ("queue Job (one rank)", build_job({**job, "labels": "{}"}, one, settings).spec.template.spec.containers[0].command),
        ("queue indexed Job", build_job(job, two, settings).spec.template.spec.containers[0].command),
    ]
    operated = build_job(job, two, settings.model_copy(update={"training_operator": True}))
    commands += [
        (f"PyTorchJob {role}", spec["template"]["spec"]["containers"][0]["command"])
        for role, spec in operated["spec"]["pytorchReplicaSpecs"].items()
    ]
    for where, command in commands:
        found[command[0]] = where
        if command[:2] == ["/bin/sh", "-c"]:  # the program the shell execs
            words = shlex.split(command[2])
            found[words[words.index("exec") + 1]] = where
    for path in sorted((REPO / "infra" / "k8s" / "base").glob("*.yaml")):
        for doc in filter(None, yaml.safe_load_all(path.read_text())):
            for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                if container["image"] == "drape":
                    found[container["command"][0]] = f"{path.name}: {container['name']}"
    flow_pod = TEMPLATE["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    assert flow_pod["args"] == "{{ command }}"
    found[BaseJobConfiguration._base_flow_run_command().split()[0]] = "gpu-k8s flow pod"
    return found


def test_the_image_provides_every_program_the_manifests_run():
    programs = _manifest_programs()
    assert {"torchrun", "/bin/sh", VENV_PYTHON, "drape", "prefect", "mlflow"} <= set(programs)
    missing = {program: where for program, where in programs.items() if program not in _provided()}
    assert not missing, f"programs the pods run that the image does not install: {missing}"
    assert "torchrun" in _scripts("torch")  # from torch, which each base installs pinned as pyproject pins it
    (torch_pin,) = filter(None, (_pinned(r, "torch") for r in PYPROJECT["project"]["dependencies"]))
    for variant in _bases():
        assert f"torch=={torch_pin}" in " ".join(_in(f"base-{variant}", "RUN")), f"base-{variant}: torch=={torch_pin}"
    installs = " ".join(_in("image", "RUN"))
    assert "prefect-kubernetes" in installs  # `prefect worker start --type kubernetes`
    assert "psycopg2-binary" in installs  # the postgresql:// URIs of MLflow's store and of configs/h100.yaml's queue
    assert load_config(REPO / "configs" / "h100.yaml").queue.url.startswith("postgresql://")


def test_the_variants_and_their_bases():
    assert ("", "ARG", "VARIANT=gpu") in _instructions()
    bases = _bases()
    assert set(bases) == {"gpu", "cpu", "debian"}
    assert bases["gpu"].startswith("nvidia/cuda:") and "cudnn-runtime" in bases["gpu"]
    assert bases["cpu"].startswith("python:3.11-slim")
    # `make image-test` (infra/image/build.sh): a debootstrapped Debian 12, its own Python 3.11, torch's CPU wheel
    assert bases["debian"] == "${DEBIAN_BASE}" and ("", "ARG", "DEBIAN_BASE=localhost/drape-base:bookworm") in _instructions()
    assert "python3-venv" in " ".join(_in("base-debian", "RUN")) and "/whl/cpu" in " ".join(_in("base-debian", "ARG"))
    assert any(i == "FROM" and args == "base-${VARIANT} AS image" for _, i, args in _instructions())
    assert "/whl/cpu" in " ".join(_in("base-cpu", "ARG"))  # never the multi-GB CUDA build on CPU
    assert "python3.11" in " ".join(_in("base-gpu", "RUN"))
    assert PYPROJECT["project"]["requires-python"] == ">=3.11,<3.12"


def test_workdir_is_the_deployments_and_the_configs_the_pods_read_are_in_it():
    prefect = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    (step,) = prefect["definitions"]["in_image"]
    directory = step["prefect.deployments.steps.set_working_directory"]["directory"]
    assert _in("image", "WORKDIR") == [directory] == ["/opt/drape"]
    assert f". {directory}" in _in("image", "COPY")
    dispatcher = yaml.safe_load((REPO / "infra" / "k8s" / "base" / "dispatcher.yaml").read_text().split("\n---")[0])
    command = dispatcher["spec"]["template"]["spec"]["containers"][0]["command"]
    config = Path(command[command.index("--config") + 1])
    assert config.is_relative_to(directory) and (REPO / config.relative_to(directory)).is_file(), config
    assert not _ignored(str(config.relative_to(directory)))
    deployed = [d["parameters"]["config_path"] for d in prefect["deployments"] if d.get("pull") is not None]
    assert deployed and all((REPO / path).is_file() and not _ignored(path) for path in deployed)


def test_the_user_is_the_one_every_security_context_names():
    (user,) = _in("image", "USER")
    uid, _, gid = user.partition(":")
    assert uid == gid == str(KubernetesLauncherConfig().run_as_user)  # numeric: the kubelet checks runAsNonRoot
    assert f"--uid {uid} --gid {gid}" in " ".join(_in("image", "RUN"))
    pods = [TEMPLATE["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]]
    for path in sorted((REPO / "infra" / "k8s" / "base").glob("*.yaml")):
        for doc in filter(None, yaml.safe_load_all(path.read_text())):
            pod = doc.get("spec", {}).get("template", {}).get("spec", {})
            if any(c["image"] == "drape" for c in pod.get("containers", [])):
                pods.append(pod)
    assert len(pods) >= 4
    for pod in pods:
        assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsGroup"] == int(uid)


def _make_variable(name: str) -> str:
    (value,) = re.findall(rf"^{name} \?= (\S+)$", (REPO / "Makefile").read_text(), flags=re.MULTILINE)
    return value


def _recipe(target: str) -> str:
    (recipe,) = re.findall(rf"^{target}:\n\t(.+)$", (REPO / "Makefile").read_text(), flags=re.MULTILINE)
    return recipe


def test_every_manifest_pulls_the_image_make_image_tags():
    image = _make_variable("IMAGE")
    assert _recipe("image") == "docker build --build-arg VARIANT=gpu -t $(IMAGE) ."
    assert _recipe("image-cpu") == "docker build --build-arg VARIANT=cpu -t $(IMAGE)-cpu ."
    assert re.search(r"^\.PHONY:.* image image-cpu", (REPO / "Makefile").read_text(), flags=re.MULTILINE)
    assert image.rsplit(":", 1)[1] == PYPROJECT["project"]["version"]  # the image is the release
    container = TEMPLATE["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == image
    assert KubernetesLauncherConfig().image == image
    assert load_config(REPO / "configs" / "h100.yaml").queue.kubernetes.image == image
    base = yaml.safe_load((REPO / "infra" / "k8s" / "base" / "kustomization.yaml").read_text())
    (named,) = [i for i in base["images"] if i["name"] == "drape"]
    assert f"{named['newName']}:{named['newTag']}" == image
    production = yaml.safe_load((REPO / "infra" / "k8s" / "overlays" / "production" / "kustomization.yaml").read_text())
    assert [f"{i['name']}:{i['newTag']}" for i in production["images"]] == [image]


def _ignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` (relative to the context) out: its patterns at the root, or
    under any folder with ``**/``, each matching the path or a folder above it."""
    patterns = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatch(part, pattern[3:]) for part in parts):
                return True
        elif any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            return True
    return False


def test_the_build_context_keeps_environments_history_and_caches_out_and_nothing_the_build_needs():
    for kept_out in (".venv", ".drape", ".git", "drape/__pycache__/x.pyc", ".pytest_cache", ".ruff_cache", ".mypy_cache"):
        assert _ignored(kept_out), kept_out
    needed = ["pyproject.toml", PYPROJECT["project"]["readme"], "deployments/prefect.yaml", "configs/h100.yaml"]
    needed += [f"{package.rstrip('*')}/__init__.py" for package in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]]
    for path in needed:
        assert (REPO / path).is_file() and not _ignored(path), path
