"""What each pod of a queue job gets on Kubernetes (scheduler/engines/kubernetes/objects.py, pods.py): the
exact torchrun command of every shape and pod, the credentials Secret by name only, CPU and memory
from the GPUs it holds, a sized /dev/shm in memory, the security context; every object validated
against the Kubernetes API schema; the kube config read through the bounded YAML loader first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import kubernetes_validate
import pytest
from kubernetes import client

from drape.config import KubernetesLauncherConfig
from scheduler.engines.kubernetes.objects import build_job, headless_service
from scheduler.policy import GpuState
from tests.conftest import billion_laughs

SENTINEL = "sentinel-secret-value-7f3a"
NAME = "drape-stage-training-abc123-a2"
PROGRAM = ["-m", "drape.train", "--job", "s3://drape-artifacts/runs/r1/geometry/job config.json"]
CONF = "join_timeout=1800,read_timeout=1800"
ONE_NODE = [GpuState(f"h100-00/gpu{i}", "h100-00", "H100-80GB", 80) for i in range(8)]
TWO_NODES = ONE_NODE + [GpuState(f"h100-01/gpu{i}", "h100-01", "H100-80GB", 80) for i in range(8)]


def _job(**extra) -> dict:
    return {
        "id": "stage-training-abc123",
        "kind": "stage-training",
        "stage": "geometry",
        "env": json.dumps({"DRAPE_RUN": "r1"}),
        "command": json.dumps(["/opt/venv/bin/python", *PROGRAM]),
        "labels": json.dumps({"launch": "torchrun", "mounts": json.dumps(["/mnt/drape"])}),
        "attempts": 2,
        "gpus": 8,
        "mem_gib": 78.0,
        **extra,
    }


def _plain(obj) -> dict:
    return obj if isinstance(obj, dict) else client.ApiClient().sanitize_for_serialization(obj)


def _validate_pod(pod: dict) -> None:
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": pod}, "1.33", strict=True)


def _check_pod(pod: dict, *, cpu: str, memory: str, shm: str, gpus: str = "8") -> dict:
    """The promises every pod keeps; returns its container."""
    (container,) = pod["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": "drape-s3"}}]  # the Secret by name, never its values
    assert container["resources"] == {
        "requests": {"nvidia.com/gpu": gpus, "cpu": cpu, "memory": memory},
        "limits": {"nvidia.com/gpu": gpus, "memory": memory},  # no CPU limit: a throttled rank stalls the others
    }
    (dshm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert dshm == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    plain = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert plain == {"DRAPE_JOB_ID": "stage-training-abc123", "DRAPE_RUN": "r1"}
    # the node it landed on, from the downward API: the next stage prefers the cache it warmed
    (node,) = [e for e in container["env"] if "value" not in e]
    assert node == {"name": "DRAPE_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    _validate_pod(pod)
    return container


@pytest.fixture
def secrets_in_the_environment(monkeypatch):
    """Every credential variable set in the dispatcher's environment: none may reach a spec."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN", "PGPASSWORD"):
        monkeypatch.setenv(name, SENTINEL)


def test_one_node_runs_torchrun_with_an_explicit_local_rendezvous(secrets_in_the_environment):
    job = build_job(_job(), ONE_NODE, KubernetesLauncherConfig())
    spec = _plain(job)
    kubernetes_validate.validate(spec, "1.33", strict=True)
    container = _check_pod(spec["spec"]["template"]["spec"], cpu="80", memory="1344Gi", shm="64Gi")
    assert container["command"] == [
        "torchrun",
        "--nnodes=1",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:29500",
        f"--rdzv-id={NAME}",
        f"--rdzv-conf=is_host=1,{CONF}",
        *PROGRAM,
    ]
    assert SENTINEL not in json.dumps(spec)
    plain = build_job(_job(labels="{}"), ONE_NODE, KubernetesLauncherConfig())  # not a torchrun job: as it is
    assert plain.spec.template.spec.containers[0].command == ["/opt/venv/bin/python", *PROGRAM]
    other = build_job(_job(command=json.dumps(["drape", "train"])), ONE_NODE, KubernetesLauncherConfig())
    assert other.spec.template.spec.containers[0].command[-3:] == ["--no-python", "drape", "train"]


def _run_pod_command(command: list[str], index: str | None, tmp_path) -> tuple[int, list[str] | None, str]:
    """The container's command run by /bin/sh as the pod would, with a `torchrun` on PATH that records
    the arguments it was given."""
    stub, seen = tmp_path / "bin" / "torchrun", tmp_path / "argv.json"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(seen)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    stub.chmod(0o755)
    seen.unlink(missing_ok=True)
    env = {"PATH": f"{stub.parent}:{os.environ['PATH']}", **({"JOB_COMPLETION_INDEX": index} if index is not None else {})}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    return done.returncode, json.loads(seen.read_text()) if seen.exists() else None, done.stderr


def test_an_indexed_job_runs_torchrun_on_every_node_and_pod_0_hosts_the_rendezvous(tmp_path, secrets_in_the_environment):
    settings = KubernetesLauncherConfig()
    job = build_job(_job(), TWO_NODES, settings)
    spec = _plain(job)
    kubernetes_validate.validate(spec, "1.33", strict=True)
    assert spec["spec"]["completionMode"] == "Indexed" and spec["spec"]["completions"] == spec["spec"]["parallelism"] == 2
    pod = spec["spec"]["template"]["spec"]
    assert pod["subdomain"] == NAME
    container = _check_pod(pod, cpu="80", memory="1344Gi", shm="64Gi")
    assert container["command"][:2] == ["/bin/sh", "-c"] and container["command"][2].startswith("exec torchrun ")
    for index, is_host in (("0", "1"), ("1", "0")):
        code, argv, _ = _run_pod_command(container["command"], index, tmp_path)
        assert code == 0 and argv == [
            "--nnodes=2",
            "--nproc-per-node=8",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={NAME}-0.{NAME}:29500",
            f"--rdzv-id={NAME}",
            f"--rdzv-conf=is_host={is_host},{CONF}",
            *PROGRAM,
        ]
    code, argv, said = _run_pod_command(container["command"], None, tmp_path)  # no index: no torchrun at all
    assert code != 0 and argv is None and "not a pod of an indexed Job" in said
    service = _plain(headless_service(NAME, settings.namespace, job.metadata.labels))
    kubernetes_validate.validate(service, "1.33", strict=True)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"] == [{"name": "rdzv", "port": 29500}]
    assert SENTINEL not in json.dumps(spec) + json.dumps(service)


def test_a_pytorchjob_master_hosts_the_rendezvous_and_workers_join_it(secrets_in_the_environment):
    settings = KubernetesLauncherConfig(training_operator=True)
    body = build_job(_job(), TWO_NODES, settings)
    assert body["kind"] == "PyTorchJob" and body["spec"]["nprocPerNode"] == "8"
    replicas = body["spec"]["pytorchReplicaSpecs"]
    assert {role: spec["replicas"] for role, spec in replicas.items()} == {"Master": 1, "Worker": 1}
    for role, is_host in (("Master", "1"), ("Worker", "0")):
        pod = replicas[role]["template"]["spec"]
        container = _check_pod(pod, cpu="80", memory="1344Gi", shm="64Gi")
        assert container["name"] == "pytorch" and container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500}]
        assert container["command"] == [
            "torchrun",
            "--nnodes=2",
            "--nproc-per-node=8",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={NAME}-master-0:29500",
            f"--rdzv-id={NAME}",
            f"--rdzv-conf=is_host={is_host},{CONF}",
            *PROGRAM,
        ]
    assert SENTINEL not in json.dumps(body)


def test_host_resources_follow_the_gpus_a_pod_holds():
    """Whole GPUs: the per-GPU share for each; a shared GPU: the part of its memory the job's profile
    holds (20 of 80 GiB: a quarter of 10 CPUs, 160 GiB and 8 GiB of /dev/shm, rounded up)."""
    shared = KubernetesLauncherConfig(sharing="time-slicing")  # its resource: nvidia.com/gpu.shared
    small = _job(gpus=1, mem_gib=20.0, labels=json.dumps({"share": "0.5"}))
    pod = _plain(build_job(small, ONE_NODE[:1], shared))["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {
        "requests": {"nvidia.com/gpu.shared": "1", "cpu": "3", "memory": "42Gi"},
        "limits": {"nvidia.com/gpu.shared": "1", "memory": "42Gi"},
    }
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["volumes"]
    _validate_pod(pod)
    whole = _plain(build_job(small, ONE_NODE[:1], KubernetesLauncherConfig()))["spec"]["template"]["spec"]
    assert whole["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1", "cpu": "10", "memory": "168Gi"}
    tuned = KubernetesLauncherConfig(cpu_per_gpu=4, host_memory_gib_per_gpu=32, shm_gib_per_gpu=2)
    _check_pod(_plain(build_job(_job(), ONE_NODE, tuned))["spec"]["template"]["spec"], cpu="32", memory="272Gi", shm="16Gi")


def test_the_defaults_fit_an_8_gpu_node_and_the_fields_are_bounded():
    """8×H100 nodes: Azure ND H100 v5 has 96 vCPUs and 1.9 TiB, AWS p5 192 and 2 TiB, GCP a3 208 and
    1.87 TB; the pod of a whole node's job must fit each (less what the node's daemons hold)."""
    settings = KubernetesLauncherConfig()
    assert 8 * settings.cpu_per_gpu <= 88
    assert 8 * (settings.host_memory_gib_per_gpu + settings.shm_gib_per_gpu) <= 1600
    for field, value in (("cpu_per_gpu", 0), ("host_memory_gib_per_gpu", 4096), ("shm_gib_per_gpu", -1)):
        with pytest.raises(ValueError, match=field):
            KubernetesLauncherConfig(**{field: value})
    with pytest.raises(ValueError, match="credentials_secret"):
        KubernetesLauncherConfig(credentials_secret="Drape_S3")
    bare = build_job(_job(), ONE_NODE, KubernetesLauncherConfig(credentials_secret=None))
    assert bare.spec.template.spec.containers[0].env_from is None  # credentials another way (a cloud identity)


class _Api:
    """The batch and core calls a multi-node launch makes, recorded; `service_status`: what creating the Service answers."""

    def __init__(self, service_status: int | None = None):
        self.calls: list[tuple[str, str]] = []
        self.service_status, self.service = service_status, None

    def create_namespaced_job(self, namespace, body, _request_timeout=None):
        self.calls.append(("create job", body.metadata.name))
        return client.V1Job(metadata=client.V1ObjectMeta(name=body.metadata.name, uid="uid-1234"))

    def create_namespaced_service(self, namespace, body, _request_timeout=None):
        from kubernetes.client.exceptions import ApiException

        self.calls.append(("create service", body.metadata.name))
        if self.service_status:
            raise ApiException(status=self.service_status)
        self.service = _plain(body)

    def delete_namespaced_job(self, name, namespace, propagation_policy=None, _request_timeout=None):
        self.calls.append(("delete job", name))

    def list_node(self, label_selector=None, _request_timeout=None):
        return client.V1NodeList(items=[])  # nodes without GPU Feature Discovery's labels: not checked


def test_an_indexed_jobs_service_is_owned_by_its_job_and_never_left_without_one(secrets_in_the_environment):
    """The headless Service is created after its Job, owned by it (collected with it: cancelled, or
    its TTL after it ended); a Service that cannot be created takes the Job back (its pods could
    never find each other), and the launch fails with the API's error."""
    from kubernetes.client.exceptions import ApiException

    from scheduler.engines.kubernetes.launcher import KubernetesLauncher

    launcher, api = KubernetesLauncher(KubernetesLauncherConfig()), _Api()
    launcher._clients = {"batch": api, "core": api, "custom": None}
    assert launcher.launch(_job(), TWO_NODES) == f"job:{NAME}"
    assert api.calls == [("create job", NAME), ("create service", NAME)]
    owner = api.service["metadata"]["ownerReferences"]
    assert owner == [{"apiVersion": "batch/v1", "kind": "Job", "name": NAME, "uid": "uid-1234"}]
    kubernetes_validate.validate(api.service, "1.33", strict=True)

    failing = _Api(service_status=500)
    launcher._clients = {"batch": failing, "core": failing, "custom": None}
    with pytest.raises(ApiException):
        launcher.launch(_job(), TWO_NODES)
    assert failing.calls == [("create job", NAME), ("create service", NAME), ("delete job", NAME)]
    exists = _Api(service_status=409)  # made before a dispatcher restart: it is this attempt's
    launcher._clients = {"batch": exists, "core": exists, "custom": None}
    assert launcher.launch(_job(), TWO_NODES) == f"job:{NAME}" and ("delete job", NAME) not in exists.calls


def test_a_billion_laughs_kube_config_is_refused_before_the_client_reads_it(tmp_path, monkeypatch):
    """The Kubernetes launcher reads `KUBECONFIG` (each of its files) through the bounded loader
    first: a bomb, a huge file, a file that is not YAML are each refused naming the file; a real
    kube config passes to the client."""
    from scheduler.engines.kubernetes.launcher import checked_kubeconfig

    (tmp_path / "bomb.yaml").write_text(billion_laughs())
    (tmp_path / "huge.yaml").write_text("a: " + "x" * (17 << 20))
    (tmp_path / "broken.yaml").write_text("clusters: [unclosed\n")
    (tmp_path / "good.yaml").write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    expected = {
        "bomb.yaml": "aliases expand to more than",
        "huge.yaml": "bytes",
        "broken.yaml": "not YAML",
    }
    for name, words in expected.items():
        monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'good.yaml'}:{tmp_path / name}")
        started = time.monotonic()
        with pytest.raises(ValueError, match=f"kube config .*{name}") as caught:
            checked_kubeconfig()
        assert words in str(caught.value) and time.monotonic() - started < 5, str(caught.value)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "good.yaml"))
    checked_kubeconfig()
