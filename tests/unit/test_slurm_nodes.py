"""The fleet as Slurm prints it (scheduler/engines/slurm/nodes.py) and the requests sized to it
(requests.py): real ``scontrol show node -o`` lines (Slurm 22.05's, from the test cluster of
tests/integration/slurm_cluster.py, and shapes sites print), parsed as untrusted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scheduler.engines.slurm.nodes import (
    SlurmParseError,
    fleet_gpus,
    is_usable_state,
    minutes,
    parse_gres,
    parse_node,
    parse_nodes,
    parse_partitions,
)
from scheduler.engines.slurm.requests import FitError, fit

A100 = (
    "NodeName=gpu-a100-r07n03 Arch=x86_64 CoresPerSocket=6  CPUAlloc=0 CPUEfctv=6 CPUTot=6 CPULoad=1.78 "
    "AvailableFeatures=a100,nvme ActiveFeatures=a100,nvme Gres=gpu:a100:2 NodeAddr=127.0.0.1 NodeHostName=localhost "
    "Port=57731 Version=22.05.8 OS=Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=6000 AllocMem=0 "
    "FreeMem=17308 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=a100  BootTime=2026-12-05T14:11:34 SlurmdStartTime=2026-12-05T17:17:17 CfgTRES=cpu=6,mem=6000M,billing=6 "
    "AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s"
)
DRAINED = (
    "NodeName=gpu-a100-r07n04 Arch=x86_64 CoresPerSocket=4  CPUAlloc=0 CPUEfctv=4 CPUTot=4 AvailableFeatures=a100 "
    "ActiveFeatures=a100 Gres=gpu:a100:2 NodeAddr=127.0.0.1 NodeHostName=localhost RealMemory=4000 AllocMem=0 "
    "State=IDLE+DRAIN ThreadsPerCore=1 Partitions=a100  Reason=fan failure Gres=gpu:a100:64 State=IDLE [root@2026-12-05T17:17:18]"
)
H100 = (  # a site's: socket-bound typed gres, MemSpecLimit, two partitions, not responding
    "NodeName=hgx-h100.rack12-n01 CoresPerSocket=48 CPUAlloc=96 CPUTot=192 AvailableFeatures=h100,ib,nvme "
    "Gres=gpu:h100:4(S:0-1),gpu:h100:4(S:2-3) NodeAddr=10.12.0.1 RealMemory=2063000 MemSpecLimit=16000 "
    "State=MIXED* Partitions=h100,preempt"
)
UNTYPED = "NodeName=cpu_0001 CPUTot=64 RealMemory=256000 Gres=(null) AvailableFeatures=(null) State=DOWN*+DRAIN Partitions=cpu"


def test_real_node_lines_parse_with_their_names_gres_cpus_memory_features_partitions_and_state():
    node = parse_node(A100)
    assert (node.name, node.cpus, node.memory_mib, node.gpus) == ("gpu-a100-r07n03", 6, 6000, (("a100", 2),))
    assert node.features == ("a100", "nvme") and node.partitions == ("a100",) and node.state == "IDLE" and node.is_usable
    site = parse_node(H100)
    assert site.name == "hgx-h100.rack12-n01" and site.gpus == (("h100", 4), ("h100", 4)) and site.num_gpus == 8
    assert site.cpus == 192 and site.memory_mib == 2063000 - 16000 and site.partitions == ("h100", "preempt")
    assert not site.is_usable  # MIXED*: not responding
    cpu = parse_node(UNTYPED)
    assert cpu.gpus == () and cpu.features == () and not cpu.is_usable


def test_a_free_text_reason_cannot_shadow_the_fields_before_it():
    node = parse_node(DRAINED)  # its Reason holds "Gres=gpu:a100:64 State=IDLE"
    assert node.gpus == (("a100", 2),) and node.state == "IDLE+DRAIN" and not node.is_usable


@pytest.mark.parametrize(
    ("state", "usable"),
    [
        ("IDLE", True),
        ("MIXED", True),
        ("ALLOCATED", True),
        ("ALLOCATED+COMPLETING", True),
        ("MIXED+PLANNED", True),
        ("IDLE+DRAIN", False),
        ("MIXED+DRAIN", False),
        ("DOWN*", False),
        ("DOWN", False),
        ("IDLE*", False),
        ("IDLE+NOT_RESPONDING", False),
        ("IDLE+POWERED_DOWN", False),
        ("IDLE~", False),
        ("MIXED+MAINT", False),
        ("ALLOCATED+REBOOT_REQUESTED", False),
        ("FUTURE", False),
        ("UNKNOWN", False),
    ],
)
def test_only_a_node_slurm_would_start_a_job_on_is_usable(state, usable):
    assert is_usable_state(state) is usable


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:h100:4(S:0-1)", (("h100", 4),)),
        ("gpu:2", (("gpu", 2),)),
        ("gpu:a100:2,mps:200", (("a100", 2),)),
        ("gpu:a100:1(S:0),gpu:l40s:3(S:1)", (("a100", 1), ("l40s", 3))),
        ("gpu:h100:no_consume:2", (("h100", 2),)),
        ("(null)", ()),
        ("", ()),
    ],
)
def test_gres_strings_give_typed_gpu_counts(gres, gpus):
    assert parse_gres(gres) == gpus


@pytest.mark.parametrize(
    ("used", "gpus"),
    [  # GresUsed as `scontrol show node -o -d` prints it (Slurm 22.05 here: the first two and the last)
        ("gpu:a100:1(IDX:0)", (("a100", 1),)),
        ("gpu:h100:0(IDX:N/A)", (("h100", 0),)),
        ("gpu:a100:1(IDX:0),gpu:l40s:0(IDX:N/A)", (("a100", 1), ("l40s", 0))),
        ("gpu:(null):3(IDX:0-2)", (("gpu", 3),)),
        ("gpu:h100:3(IDX:0,2-3),gpu:h100:0(IDX:N/A)", (("h100", 3), ("h100", 0))),
        ("gpu:1", (("gpu", 1),)),
    ],
)
def test_gres_used_strings_give_the_gpus_allocated_none_included(used, gpus):
    assert parse_gres(used, least=0) == gpus
    assert parse_node(A100 + f" GresUsed={used}").used == gpus


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (A100.replace("NodeName=gpu-a100-r07n03", "NodeName=gpu;rm"), r"NodeName='gpu;rm' is not a node name drape can place on"),
        (A100.replace("CPUEfctv=6", "CPUEfctv=-6"), r"gpu-a100-r07n03: CPUEfctv='-6' is not a whole number"),
        (A100.replace("RealMemory=6000", "RealMemory=1e99"), r"RealMemory='1e99' is not a whole number"),
        (A100.replace("RealMemory=6000", "RealMemory=999999999999"), r"RealMemory='999999999999' is not a whole number in"),
        (A100.replace("RealMemory=6000 ", ""), r"Slurm node gpu-a100-r07n03: no RealMemory"),
        (A100.replace("Gres=gpu:a100:2", "Gres=gpu:a100:1000"), r"gres 'gpu:a100:1000': expected gpu\[:<type>\]:<1..64>"),
        (A100.replace("Gres=gpu:a100:2", "Gres=gpu:a$(x):2"), r"gres 'gpu:a\$\(x\):2'"),
        (A100.replace("State=IDLE", "State=idle;reboot"), r"State='idle;reboot' is not a Slurm node state"),
        (A100.replace("Partitions=a100", "Partitions=a100,../x"), r"Partitions holds '../x', not a Slurm name"),
        ("NodeName=x " + "A=b " * 5000, r"a node line of 20011 characters"),
    ],
)
def test_untrusted_node_lines_are_refused_naming_the_node_and_the_field(line, match):
    with pytest.raises(SlurmParseError, match=match):
        parse_node(line)


def test_a_node_listed_twice_is_refused():
    with pytest.raises(SlurmParseError, match="a node listed twice"):
        parse_nodes(A100 + "\n\n" + A100)


def test_the_fleet_from_slurm_names_real_nodes_maps_gres_types_to_memory_and_sees_drained_gpus_full():
    nodes = parse_nodes("\n".join([A100, DRAINED, H100]))
    gpus = fleet_gpus(nodes, {"a100": 40, "h100": 80}, {"h100": "H100-80GB"})
    assert [(g.uuid, g.model, g.total_gib) for g in gpus[:2]] == [
        ("gpu-a100-r07n03/gpu0", "a100", 40.0),
        ("gpu-a100-r07n03/gpu1", "a100", 40.0),
    ]
    assert [g.uuid for g in gpus if g.node == "hgx-h100.rack12-n01"][-1] == "hgx-h100.rack12-n01/gpu7"
    assert {g.model for g in gpus if g.node.startswith("hgx")} == {"H100-80GB"}
    usable = {g.node for g in gpus if g.observed_used_gib is None}
    assert usable == {"gpu-a100-r07n03"}  # drained and not responding nodes' GPUs: seen full
    assert all(g.free_gib() == 0 and g.observed_util == 100.0 for g in gpus if g.node not in usable)


def test_a_gres_type_the_memory_map_lacks_is_an_error_naming_the_node_and_the_type():
    with pytest.raises(SlurmParseError, match=r"node hgx-h100.rack12-n01 offers gres gpu:h100:4, .* no entry for 'h100' "):
        fleet_gpus([parse_node(H100)], {"a100": 40}, {})


@pytest.mark.parametrize(
    ("limit", "expected"),
    [("30:00", 30), ("2:00:00", 120), ("1-00:00:00", 1440), ("1-12", 2160), ("45", 45), ("0:30", 1), ("infinite", None)],
)
def test_partition_time_limits_read_as_minutes(limit, expected):
    assert minutes(limit) == expected


def test_partitions_from_sinfo_and_a_bad_limit_refused():
    assert parse_partitions("a100|2:00:00\nh100|30:00\n") == {"a100": 120, "h100": 30}
    with pytest.raises(SlurmParseError, match="time limit '2h'"):
        parse_partitions("a100|2h")


def _settings(**values):
    base = {"partition": None, "cpus_per_gpu": 8, "mem_per_gpu_gib": None, "memory_fraction": 0.9, "time_limit_minutes": 240}
    return SimpleNamespace(**{**base, **values})


def test_requests_fit_the_smallest_placed_node_and_never_take_a_whole_node():
    small, big = parse_node(DRAINED.replace("+DRAIN", "")), parse_node(A100)  # 4 and 6 CPUs, 4000 and 6000 MiB, 2 GPUs
    fitted = fit(_settings(), 2, [big, small], {"a100": 120})
    assert fitted.cpus_per_task == 4  # 8 per GPU asked; the 4-CPU node has 4
    assert fitted.mem_per_gpu_mib == 1800  # 0.9 × 4000 MiB / 2 GPUs: the smaller node's share
    assert fitted.partition == "a100" and fitted.time_minutes == 120 and "cut to partition a100" in fitted.notes[-1]
    one = fit(_settings(cpus_per_gpu=1), 1, [big])
    assert one.cpus_per_task == 1 and one.mem_per_gpu_mib == 2700
    assert fit(_settings(cpus_per_gpu=64), 1, [big]).cpus_per_task == 3  # half the node's GPUs: half its CPUs


def test_a_request_no_node_can_give_is_refused_naming_the_node():
    a100, h100 = parse_node(A100), parse_node(H100)
    with pytest.raises(FitError, match=r"node gpu-a100-r07n03 has 2700 MiB of memory per GPU .* asks 4096 MiB"):
        fit(_settings(mem_per_gpu_gib=4), 1, [a100])
    with pytest.raises(FitError, match=r"no partition holds all of nodes gpu-a100-r07n03, hgx-h100.rack12-n01"):
        fit(_settings(), 1, [a100, h100])
    with pytest.raises(FitError, match=r"node hgx-h100.rack12-n01 is not in partition a100"):
        fit(_settings(partition="a100"), 1, [h100])


def test_without_nodes_the_configured_values_stand():
    fitted = fit(_settings(mem_per_gpu_gib=32, partition="gpu"), 4, [])
    assert (fitted.cpus_per_task, fitted.mem_per_gpu_mib, fitted.partition, fitted.time_minutes) == (32, 32768, "gpu", 240)


def test_the_static_inventory_takes_the_cluster_s_own_node_names(tmp_path):
    import yaml

    from scheduler.queue.inventory import FleetFileError, load_fleet

    group = {"model": "a100", "memory_gib": 40, "nodes": 2, "gpus_per_node": 2}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"groups": [{**group, "node_names": ["gpu-a100-r07n03", "gpu-a100-r07n04"]}]}))
    assert sorted({gpu.node for gpu in load_fleet(path)}) == ["gpu-a100-r07n03", "gpu-a100-r07n04"]
    for names, match in [
        (["gpu-a100-r07n03"], r"groups\[0\]: node_names must list 2 name\(s\)"),
        (["gpu-a100-r07n03", "x/../y"], r"node_names holds 'x/../y'"),
        (["n1", "n1"], "lists a node twice"),
    ]:
        path.write_text(yaml.safe_dump({"groups": [{**group, "node_names": names}]}))
        with pytest.raises(FleetFileError, match=match):
            load_fleet(path)
    path.write_text(yaml.safe_dump({"groups": [{**group, "node_names": ["a", "b"]}, {**group, "node_names": ["b", "c"]}]}))
    with pytest.raises(FleetFileError, match=r"groups\[1\]: node b is named by an earlier group too"):
        load_fleet(path)


def test_a_fleet_read_from_slurm_needs_the_gpu_memory_map(tmp_path):
    from drape.config.base import ConfigError
    from tests.conftest import tiny_config

    with pytest.raises(ConfigError, match=r"set queue.slurm.gpu_memory_gib"):
        tiny_config(tmp_path, fresh_mlflow=True, queue={"fleet": "slurm"})
    config = tiny_config(
        tmp_path, fresh_mlflow=True, queue={"fleet": "slurm", "slurm": {"gpu_memory_gib": {"a100": 40, "h100": 80}}}
    )
    assert config.queue.slurm.gpu_memory_gib == {"a100": 40.0, "h100": 80.0}
    with pytest.raises(ConfigError, match="gpu_memory_gib"):
        tiny_config(tmp_path, fresh_mlflow=True, queue={"fleet": "slurm", "slurm": {"gpu_memory_gib": {"a100": float("nan")}}})


def test_the_cost_report_states_where_job_times_came_from():
    from drape.cost.account import Attempt, Attempts, job_times

    attempt = Attempt("j", "identity", 4, "a100", 0.0, 3600.0)
    assert job_times([]) == {"source": "in-process", "why": "no queue job: the stages trained in the flow's own process"}
    assert job_times([attempt])["source"] == "queue"
    stated = Attempts([attempt], source="sacct -c (jobcomp)", why="Slurm's accounting")
    assert stated == [attempt] and job_times(stated) == {"source": "sacct -c (jobcomp)", "why": "Slurm's accounting"}


def test_the_sbatch_preview_of_a_slurm_fleet_off_the_cluster_says_so_and_exits_2(tmp_path, monkeypatch):
    import os

    import yaml
    from typer.testing import CliRunner

    from drape.cli import app
    from tests.conftest import tiny_config

    tools = tmp_path / "bin"  # a scontrol that cannot reach its slurmctld, as off the cluster
    tools.mkdir()
    (tools / "scontrol").write_text("#!/bin/sh\necho 'scontrol: error: Unable to contact slurm controller' >&2\nexit 1\n")
    (tools / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    queue = {"fleet": "slurm", "launcher": "slurm", "max_jobs_per_gpu": 1, "slurm": {"gpu_memory_gib": {"a100": 40}}}
    path = tmp_path / "drape.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, fresh_mlflow=True, queue=queue).model_dump(mode="json")))
    result = CliRunner().invoke(app, ["queue", "sbatch", "--config", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "could not be asked" in result.output and "Unable to contact slurm controller" in result.output


@pytest.mark.parametrize(
    ("name", "placeable"),
    [
        ("gpu-a100-r07n03", True),
        ("ip-10-0-1-23.ec2.internal", True),  # an EKS node
        ("Node_01.rack2", True),
        ("n" * 63, True),
        ("n" * 64, False),  # over the kubernetes.io/hostname label's 63
        ("gpu+1", False),
        ("node-", False),
        ("-node", False),
        ("gpu;rm", False),
    ],
)
def test_a_node_name_is_held_to_one_grammar_by_the_fleet_file_slurm_s_reading_and_the_launcher(tmp_path, name, placeable):
    """The fleet file, `scontrol show node` and the launcher's placement (drape/config/names.py) accept the
    same node names: a node the queue could plan on is never refused when its job is placed."""
    import yaml

    from drape.config import names
    from scheduler.queue.inventory import FleetFileError, load_fleet

    path = tmp_path / "fleet.yaml"
    path.write_text(
        yaml.safe_dump({"groups": [{"model": "a100", "memory_gib": 40, "nodes": 1, "gpus_per_node": 2, "node_names": [name]}]})
    )
    outcomes = []
    for read in (
        lambda: load_fleet(path),
        lambda: parse_node(A100.replace("NodeName=gpu-a100-r07n03", f"NodeName={name}")),
        lambda: names.node_name(name, "placed node"),
    ):
        try:
            read()
            outcomes.append(True)
        except (FleetFileError, SlurmParseError, names.NameRefused):
            outcomes.append(False)
    assert outcomes == [placeable] * 3


def _busy(nodes: str, ours: set[str] | None) -> list[str]:
    gpus = fleet_gpus(parse_nodes(nodes), {"a100": 40, "h100": 80, "l40s": 48}, {"h100": "H100-80GB"}, ours)
    return [g.uuid for g in gpus if g.observed_used_gib is not None]


def test_gpus_other_jobs_hold_are_seen_full_beyond_drape_s_own():
    """A shared partition: Slurm has 1 of gpu-a100-r07n03's 2 GPUs allocated and drape holds none
    there, so one is someone else's; on a node where drape's own job is the one allocated, none is."""
    shared = A100 + " GresUsed=gpu:a100:1(IDX:0)"
    assert _busy(shared, set()) == ["gpu-a100-r07n03/gpu1"]
    assert _busy(shared, {"gpu-a100-r07n03/gpu0"}) == []  # drape's own job: Slurm's index need not be drape's
    assert _busy(shared, {"gpu-a100-r07n03/gpu1"}) == []
    assert _busy(shared, None) == []  # not asked (the sbatch preview): Slurm's allocations are not looked at
    full = A100 + " GresUsed=gpu:a100:2(IDX:0-1)"
    assert _busy(full, {"gpu-a100-r07n03/gpu0"}) == ["gpu-a100-r07n03/gpu1"]
    assert _busy(full, set()) == ["gpu-a100-r07n03/gpu0", "gpu-a100-r07n03/gpu1"]
    # per type on a node of two kinds; a count past the node's (untrusted) is cut to it
    mixed = A100.replace("Gres=gpu:a100:2", "Gres=gpu:a100:2,gpu:l40s:2") + " GresUsed=gpu:a100:0(IDX:N/A),gpu:l40s:9(IDX:0-1)"
    assert _busy(mixed, set()) == ["gpu-a100-r07n03/gpu2", "gpu-a100-r07n03/gpu3"]
    # a drained node's GPUs are all seen full whatever it holds
    assert len(_busy(DRAINED + " GresUsed=gpu:a100:1(IDX:0)", set())) == 2


def test_a_gres_used_that_is_not_a_gpu_count_is_refused_naming_the_node():
    with pytest.raises(SlurmParseError, match=r"gpu-a100-r07n03: GresUsed: gres 'gpu:a100:x'"):
        parse_node(A100 + " GresUsed=gpu:a100:x(IDX:0)")
