"""Names that reach Slurm, Kubernetes and labels (drape/config/names.py): hostile values are refused
at config load and again where the script or object is written, and what is written parses back
as the system reads it."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from drape.config import ConfigError, KubernetesLauncherConfig, SlurmLauncherConfig, load_config, names
from scheduler.engines.kubernetes.kueue import KueueError, flavors_from_fleet, kueue_objects
from scheduler.engines.kubernetes.objects import build_job
from scheduler.engines.slurm.launcher import batch_script
from scheduler.policy import GpuState
from scheduler.queue.inventory import FleetFileError, load_fleet

REPO = Path(__file__).resolve().parents[2]

HOSTILE = ["h100 --uid=0", "gpu\n#SBATCH --uid=0", "drape/../kube-system", "a;b", "x/../y", "-rf", "a" * 300, "a\tb", None]


def _job(**fields) -> dict:
    return {
        "id": "stage-training-abc",
        "kind": "stage-training",
        "stage": "identity",
        "attempts": 1,
        "command": json.dumps([sys.executable, "-m", "drape.train"]),
        "env": "{}",
        "labels": json.dumps({"launch": "torchrun"}),
        "mem_gib": 40.0,
        **fields,
    }


def _gpus(node: str = "gpu-00", model: str = "H100-80GB") -> list[GpuState]:
    return [GpuState(f"{node}/gpu{i}", node, model, 80.0) for i in range(2)]


def _sbatch_options(script: str) -> list[list[str]]:
    """The #SBATCH lines as sbatch splits them: the words after the marker."""
    return [shlex.split(line)[1:] for line in script.splitlines() if line.startswith("#SBATCH")]


@pytest.mark.parametrize("value", HOSTILE)
def test_each_grammar_refuses_hostile_values_and_names_where_they_came_from(value):
    for check in (names.slurm_name, names.node_name, names.dns_label, names.dns_subdomain, names.label_value, names.label_key):
        with pytest.raises(names.NameRefused, match="queue.x: .* expected"):
            check(value, "queue.x:")


def test_each_grammar_keeps_the_names_its_system_takes():
    assert names.slurm_name("gpu_a.b+c-1") and names.node_name("Node-01.rack2") and names.dns_label("drape-2")
    assert names.dns_subdomain("gpu.nvidia.com") and names.label_value("") == "" and names.label_value("NVIDIA-H100-80GB-HBM3")
    assert names.label_key("nvidia.com/gpu.product") and names.label_key("kubernetes.io/hostname") and names.label_key("app")
    for check, value in ((names.dns_label, "UPPER"), (names.dns_subdomain, "a_b"), (names.label_value, "a" * 64)):
        with pytest.raises(names.NameRefused):
            check(value)
    for key in ("a/b/c", "/x", "Bad_Prefix/x", "x;y", "x" * 64):
        with pytest.raises(names.NameRefused, match="label key"):
            names.label_key(key)


@pytest.mark.parametrize(
    "override, field",
    [
        ({"queue": {"slurm": {"gres_types": {"H100-80GB": "h100 --uid=0"}}}}, "queue.slurm.gres_types.H100-80GB"),
        ({"queue": {"slurm": {"partition": "gpu\n#SBATCH --uid=0"}}}, "queue.slurm.partition"),
        ({"queue": {"slurm": {"account": "--uid=0"}}}, "queue.slurm.account"),
        ({"queue": {"kubernetes": {"namespace": "drape/../kube-system"}}}, "queue.kubernetes.namespace"),
        ({"queue": {"kubernetes": {"products": {"H100-80GB": "a/b;c"}}}}, "queue.kubernetes.products.H100-80GB"),
        ({"queue": {"kubernetes": {"product_label": "nvidia.com/gpu product"}}}, "queue.kubernetes.product_label"),
        ({"queue": {"kubernetes": {"node_sharing": {"n 1": "mps"}}}}, "queue.kubernetes.node_sharing"),
        ({"queue": {"kubernetes": {"volume_claims": {"/mnt": "Claim;x"}}}}, "queue.kubernetes.volume_claims./mnt"),
    ],
)
def test_a_config_with_a_name_another_system_would_misread_fails_at_load_naming_field_and_file(override, field):
    with pytest.raises(ConfigError) as refused:
        load_config(REPO / "configs" / "demo.yaml", override)
    assert f"demo.yaml: {field}" in str(refused.value) and "expected" in str(refused.value)


@pytest.mark.parametrize("field", ["partition", "account", "gres"])
@pytest.mark.parametrize("value", ["h100 --uid=0", "x\n#SBATCH --uid=0", "a,b", "x=y"])
def test_the_batch_script_refuses_a_name_that_got_past_the_config(tmp_path, field, value):
    """A settings object built without validation (a name from elsewhere) is still refused where written."""
    update = {"gres_types": {"H100-80GB": value}} if field == "gres" else {field: value}
    settings = SlurmLauncherConfig().model_copy(update=update)
    with pytest.raises(names.NameRefused, match="job stage-training-abc: sbatch"):
        batch_script(_job(), _gpus(), settings, tmp_path / "log")


@pytest.mark.parametrize(
    "job, gpus, log",
    [
        ({"id": "abc\nrm -rf /"}, None, "log"),
        ({}, _gpus("gpu-00 --uid=0"), "log"),
        ({}, _gpus("gpu-00,gpu-99"), "log"),
        ({}, None, "a log/x"),
        ({}, None, "x\n#SBATCH --uid=0"),
    ],
)
def test_hostile_job_ids_nodes_and_log_paths_never_reach_sbatch(tmp_path, job, gpus, log):
    with pytest.raises(names.NameRefused):
        batch_script(_job(**job), gpus or _gpus(), SlurmLauncherConfig(), tmp_path / log)


def test_a_rendered_script_parses_back_to_one_option_per_line_with_the_names_given(tmp_path):
    settings = SlurmLauncherConfig(gres_types={"H100-80GB": "h100"}, partition="gpu_a", account="team.vto")
    options = _sbatch_options(batch_script(_job(), _gpus(), settings, tmp_path / "log"))
    assert all(len(words) == 1 and words[0].startswith("--") for words in options)
    assert ["--gres=gpu:h100:2"] in options and ["--partition=gpu_a"] in options and ["--account=team.vto"] in options


def test_a_kubernetes_job_with_a_hostile_namespace_label_or_node_is_refused_where_built():
    good = KubernetesLauncherConfig()
    assert build_job(_job(), _gpus(), good)  # the names as given pass
    for settings, gpus in [
        (good.model_copy(update={"namespace": "drape/../kube-system"}), _gpus()),
        (good.model_copy(update={"node_label": "kubernetes.io/host name"}), _gpus()),
        (good, _gpus("gpu;00")),
    ]:
        with pytest.raises(names.NameRefused, match="expected"):
            build_job(_job(), gpus, settings)
    with pytest.raises(names.NameRefused, match="drape.ai/stage"):
        build_job(_job(stage="identity/../x"), _gpus(), good)


def test_kueue_objects_refuse_a_namespace_or_label_value_kubernetes_would():
    fleet = _gpus(model="H100;x/y")
    with pytest.raises(names.NameRefused, match="product label of GPU model 'H100;x/y'.*expected a label value"):
        flavors_from_fleet(fleet, "nvidia.com/gpu.product", {})
    flavors = flavors_from_fleet(_gpus(), "nvidia.com/gpu.product", {})
    with pytest.raises(KueueError, match="'drape/../kube-system': expected"):
        kueue_objects(flavors, namespace="drape/../kube-system")


def test_drape_queue_kueue_refuses_hostile_names_with_exit_2_and_no_traceback(tmp_path):
    from drape.cli import app

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"groups": [{"model": "H100-80GB", "memory_gib": 80, "nodes": 1, "gpus_per_node": 8}]}))
    for options in (["--local-queue", "q;x"], ["--cluster-queue", "a/b"]):
        result = CliRunner().invoke(app, ["queue", "kueue", "--fleet", str(fleet), *options])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    fleet.write_text(yaml.safe_dump({"groups": [{"model": "H100 80GB/x", "memory_gib": 80, "nodes": 1, "gpus_per_node": 8}]}))
    result = CliRunner().invoke(app, ["queue", "kueue", "--fleet", str(fleet)])
    assert result.exit_code == 2 and "node_prefix" in result.output, result.output


def test_a_fleet_file_whose_node_names_slurm_or_kubernetes_would_misread_is_refused(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    for prefix in ("gpu --uid=0", "gpu,other", "a/../b"):
        group = {"model": "H100", "memory_gib": 80, "nodes": 1, "gpus_per_node": 1, "node_prefix": prefix}
        fleet.write_text(yaml.safe_dump({"groups": [group]}))
        with pytest.raises(FleetFileError, match="groups\\[0\\]: node_prefix"):
            load_fleet(fleet)
    # a model no node name could be made from needs node_names, which are then what is checked
    group = {"model": "A100 (80GB): SXM4", "memory_gib": 80, "nodes": 2, "gpus_per_node": 1}
    fleet.write_text(yaml.safe_dump({"groups": [group]}))
    with pytest.raises(FleetFileError, match="groups\\[0\\]: node_prefix 'a100-\\(80gb\\):-sxm4' makes node"):
        load_fleet(fleet)
    fleet.write_text(yaml.safe_dump({"groups": [{**group, "node_names": ["r7n3", "r7n4"]}]}))
    assert [(g.node, g.model) for g in load_fleet(fleet)] == [("r7n3", "A100 (80GB): SXM4"), ("r7n4", "A100 (80GB): SXM4")]
    fleet.write_text(yaml.safe_dump({"groups": [{**group, "node_names": ["r7n3", "r7 n4"]}]}))
    with pytest.raises(FleetFileError, match="node_names holds 'r7 n4'"):
        load_fleet(fleet)


def test_a_config_field_check_says_what_was_expected():
    with pytest.raises(ValidationError, match="expected a Slurm name"):
        SlurmLauncherConfig(partition="gpu; rm -rf /")


@pytest.mark.parametrize("mib", [1, 1800, 2048, 81920, 1_048_575])
def test_every_memory_request_the_slurm_engine_writes_parses_back(mib):
    """--mem and --mem-per-gpu as the engine sizes them (MiB, or GiB when whole) pass the parse-back
    check that every rendered script meets (a size in M was refused: every fitted job failed)."""
    from scheduler.engines.slurm.launcher import _size

    names.sbatch_directives(f"#SBATCH --mem-per-gpu={_size(mib)}\n#SBATCH --mem={_size(mib)}", "job t")
    with pytest.raises(names.NameRefused):
        names.sbatch_directives(f"#SBATCH --mem-per-gpu={_size(mib)}T", "job t")


def test_a_gpu_model_dcgm_names_with_spaces_selects_the_product_label_gpu_feature_discovery_sets():
    """DCGM's modelName has spaces; NVIDIA's GPU feature discovery labels the node with them as '-':
    the node selector must use that value (the raw name was refused, and no job landed on a DCGM fleet)."""
    assert names.product_label("NVIDIA H100 80GB HBM3", {}) == "NVIDIA-H100-80GB-HBM3"
    assert names.product_label("H100-80GB", {"H100-80GB": "NVIDIA-H100-80GB-HBM3"}) == "NVIDIA-H100-80GB-HBM3"
    with pytest.raises(names.NameRefused, match="queue.kubernetes.products"):
        names.product_label("H100;rm -rf /", {})
