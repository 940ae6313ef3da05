"""benchmarks/openb_week.py: reading Alibaba's openb pod and node lists without trusting them, and the week built from them."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from benchmarks import openb_week
from benchmarks.openb_week import OpenbError, build_fleet, build_week, read_nodes, read_pods, write_week
from scheduler.policy import GpuState
from scheduler.queue.inventory import load_fleet
from scheduler.sim import load_trace

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
PODS = (
    "openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0\n"
    "openb-pod-0001,6000,12288,1,460,V100M16|V100M32,LS,Running,427061,437061,427061\n"
    "openb-pod-0002,88000,327680,8,1000,,Burstable,Succeeded,9437497,9440000,9437497\n"
    "openb-pod-0003,4000,15258,0,0,,BE,Running,10,20,10\n"  # CPU-only
    "openb-pod-0004,11908,47104,1,1000,G2,BE,Pending,10001278,10001403,\n"  # never scheduled
    "openb-pod-0005,4000,8192,1,250,T4,BE,Failed,500,530,505\n"
    '"pod, with a comma",4000,8192,2,1000,nan,Guaranteed,Succeeded,600,4200,600\n'
)
NODES = (
    "sn,cpu_milli,memory_mib,gpu,model\n"
    "rack7.gpu-a,64000,262144,2,P100\n"
    "rack7.gpu-b,64000,262144,1,P100\n"
    "cpu-only-1,32000,262144,0,\n"
    "sg2-node-00,128000,786432,8,G2\n"
    "sg2-node-01,128000,786432,8,G2\n"
    "v100-x,96000,786432,4,V100M16\n"
    "t4.edge,64000,262144,4,T4\n"
)


def _write(tmp_path, pods: str = PODS, nodes: str = NODES):
    (tmp_path / "pods.csv").write_text(POD_HEADER + pods)
    (tmp_path / "nodes.csv").write_text(nodes)
    return tmp_path / "pods.csv", tmp_path / "nodes.csv"


def test_pods_that_ran_on_gpus_are_read_with_what_they_asked(tmp_path):
    pods_path, _ = _write(tmp_path)
    pods, skipped = read_pods(pods_path)
    assert skipped == {"CPU-only": 1, "never ran": 1}
    by_name = {p.name: p for p in pods}
    assert set(by_name) == {"openb-pod-0000", "openb-pod-0001", "openb-pod-0002", "openb-pod-0005", "pod, with a comma"}
    shared = by_name["openb-pod-0001"]
    assert (shared.gpus, shared.share, shared.models, shared.priority, shared.run_s) == (
        1,
        0.46,
        ("V100M16", "V100M32"),
        3,
        10000,
    )
    whole = by_name["openb-pod-0002"]
    assert (whole.gpus, whole.share, whole.priority, whole.run_s) == (8, 1.0, 2, 2503)
    assert by_name["openb-pod-0005"].priority == 1 and by_name["openb-pod-0005"].run_s == 25
    assert by_name["pod, with a comma"].models == () and by_name["pod, with a comma"].priority == 3  # "nan": any model


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("x,1,1,9,1000,,LS,Running,0,10,0\n", r"pods.csv:2: num_gpu must be a number in \[0, 8\], got '9'"),
        ("x,1,1,inf,1000,,LS,Running,0,10,0\n", r"pods.csv:2: num_gpu must be a number in \[0, 8\], got 'inf'"),
        ("x,1,1,1.5,1000,,LS,Running,0,10,0\n", r"pods.csv:2: num_gpu must be a whole number in \[0, 8\], got '1.5'"),
        ("x,1,1,1,1000,,LS,Running,0,nan,0\n", r"pods.csv:2: deletion_time must be a number"),
        ("x,1,1,1,0,,LS,Running,0,10,0\n", r"pods.csv:2: gpu_milli of a 1-GPU pod must be in \(0, 1000\]"),
        ("x,1,1,1,1500,,LS,Running,0,10,0\n", r"pods.csv:2: gpu_milli must be a number in \[0, 1000\]"),
        ("x,1,1,1,1000,,Premium,Running,0,10,0\n", r"pods.csv:2: qos must be one of Guaranteed, LS, Burstable, BE"),
        ("x\x1b[31m,1,1,1,1000,,LS,Running,0,10,0\n", r"pods.csv:2: name must be printable"),
    ],
)
def test_a_bad_pod_row_is_named_by_line_and_field(tmp_path, row, expected):
    pods_path, _ = _write(tmp_path, pods=row)
    with pytest.raises(OpenbError, match=expected):
        read_pods(pods_path)


def test_bad_files_are_refused_with_what_was_expected(tmp_path):
    with pytest.raises(OpenbError, match="file not found"):
        read_pods(tmp_path / "absent.csv")
    (tmp_path / "cols.csv").write_text("name,num_gpu\nx,1\n")
    with pytest.raises(OpenbError, match=r"missing columns \['gpu_milli'"):
        read_pods(tmp_path / "cols.csv")
    pods_path, _ = _write(tmp_path, pods="x,1,1,0,0,,BE,Running,0,10,0\n")
    with pytest.raises(OpenbError, match="no GPU pod that ran"):
        read_pods(pods_path)
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00name\n")
    with pytest.raises(OpenbError, match="not a CSV"):
        read_pods(tmp_path / "binary.csv")


def test_gpu_nodes_are_read_and_bad_names_refused(tmp_path):
    _, nodes_path = _write(tmp_path)
    nodes = read_nodes(nodes_path)
    assert [(n.name, n.model, n.gpus) for n in nodes][:2] == [("rack7.gpu-a", "P100", 2), ("rack7.gpu-b", "P100", 1)]
    assert "cpu-only-1" not in {n.name for n in nodes} and len(nodes) == 6
    header = "sn,cpu_milli,memory_mib,gpu,model\n"
    for rows, expected in (
        ("bad node;rm -rf,1,1,8,G2\n", r"nodes.csv:2: sn 'bad node;rm -rf': expected a host name"),
        ("a,1,1,8,G2\na,1,1,8,G2\n", r"nodes.csv:3: node a is listed twice"),
        ("a,1,1,8,\n", r"nodes.csv:2: model is empty for a node with 8 GPU"),
        ("a,1,1,-1,G2\n", r"nodes.csv:2: gpu must be a number in \[0, 64\]"),
    ):
        _write(tmp_path, nodes=header + rows)
        with pytest.raises(OpenbError, match=expected):
            read_nodes(nodes_path)


def test_the_fleet_keeps_every_model_and_its_nodes_gpu_counts(tmp_path):
    _, nodes_path = _write(tmp_path)
    nodes = read_nodes(nodes_path)
    gpus = build_fleet(nodes, 2, random.Random(1), openb_week.MEMORY_GIB, small=False)
    models = {g.model for g in gpus}
    assert models == {"P100", "G2", "V100M16", "T4"}  # one in two nodes, at least one of each model
    per_node = {g.node: sum(h.node == g.node for h in gpus) for g in gpus}
    assert all(per_node[n.name] == n.gpus for n in nodes if n.name in per_node)
    assert sum(1 for n in per_node if n.startswith("sg2-")) == 1  # 2 G2 nodes, one in 2
    assert {g.model: g.total_gib for g in gpus}["G2"] == 32.0
    small = build_fleet(nodes, 2, random.Random(1), openb_week.MEMORY_GIB, small=True)
    assert {g.total_gib for g in small} == {16.0} and [g.uuid for g in small] == [g.uuid for g in gpus]
    with pytest.raises(OpenbError, match=r"GPU model 'T4': memory unknown; pass --memory T4=GiB"):
        build_fleet(nodes, 2, random.Random(1), {"P100": 16.0, "G2": 32.0, "V100M16": 16.0}, small=False)


def test_the_week_offers_its_load_of_jobs_the_fleet_can_run(tmp_path, monkeypatch):
    pods_path, nodes_path = _write(tmp_path)
    pods, _ = read_pods(pods_path)
    gpus = [
        g for g in build_fleet(read_nodes(nodes_path), 1, random.Random(3), openb_week.MEMORY_GIB, False) if g.model != "V100M16"
    ]
    trace = build_week(pods, gpus, random.Random(3), 0.5, 4 * 86400)
    hours = sum(j.gpus * j.duration_s for j in trace) / 3600
    target = 0.5 * len(gpus) * 7 * 24
    assert target <= hours < target + 8 * 4 * 24  # stops at the first job past the load
    assert all(j.submit_s < 6 * 86400 and 60 <= j.duration_s <= 4 * 86400 for j in trace)
    assert not any(j.job_id.startswith("openb-pod-0001-") for j in trace)  # V100 only: not in this fleet
    assert {j.kind for j in trace} <= {"LS", "Burstable", "BE", "Guaranteed"}
    shares = {round(j.peak_mem_gib / j.share, 6) for j in trace}
    assert shares == {16.0}  # a job's memory is its share of the smallest GPU
    assert [j.submit_s for j in trace] == sorted(j.submit_s for j in trace)
    monkeypatch.setattr(openb_week, "MAX_WEEK_JOBS", 10)
    with pytest.raises(OpenbError, match="the week would hold more than 10 jobs on 23 GPUs; raise --scale"):
        build_week(pods, gpus, random.Random(3), 0.5, 4 * 86400)
    with pytest.raises(OpenbError, match="no pod may run on the fleet's GPU models"):
        build_week([p for p in pods if p.models == ("V100M16", "V100M32")], gpus, random.Random(3), 0.5, 86400)


def test_the_written_week_reads_back_for_drape_queue_simulate(tmp_path):
    pods_path, nodes_path = _write(tmp_path)
    pods, _ = read_pods(pods_path)
    gpus = build_fleet(read_nodes(nodes_path), 1, random.Random(2), openb_week.MEMORY_GIB, False)
    gpus += [GpuState("odd-0/gpu0", "odd-0", "G9: {x}, #1", 24.0)]  # a model name in YAML's syntax
    trace = build_week(pods, gpus, random.Random(2), 0.3, 86400)
    write_week(trace, gpus, tmp_path / "week")
    assert sorted(p.name for p in (tmp_path / "week").iterdir()) == ["fleet.yaml", "trace.csv"]  # no partial file left
    back = load_trace(tmp_path / "week" / "trace.csv")
    assert [(j.job_id, j.gpus, j.models, j.share, j.priority) for j in back] == [
        (j.job_id, j.gpus, j.models, j.share, j.priority) for j in trace
    ]
    fleet = load_fleet(tmp_path / "week" / "fleet.yaml")
    assert sorted((g.uuid, g.model, g.total_gib) for g in fleet) == sorted((g.uuid, g.model, g.total_gib) for g in gpus)


def test_a_small_week_replays_every_policy_and_is_judged(tmp_path, capsys):
    """~1 s. The whole script on the fixture: each policy's line, the verdict, the written week."""
    pods_path, nodes_path = _write(tmp_path)
    argv = ["--pods", str(pods_path), "--nodes", str(nodes_path), "--seeds", "1", "--scale", "1", "--load", "0.3"]
    argv += ["--fleets", "small", "--cap-days", "0.5", "--policies", "drape,fifo-backfill", "--write", str(tmp_path / "out")]
    assert openb_week.main(argv) == 0
    out = capsys.readouterr().out
    assert "| drape | " in out and "| fifo-backfill | " in out and "drape met the goals on" in out
    assert out.startswith("# openb: 5 GPU pods that ran (2 naming GPU models)") and "\nNone\n" not in out
    assert "of the shortest makespan" in out and (tmp_path / "out" / "small-seed1" / "trace.csv").is_file()
    bad_flags = (["--policies", "drape"], ["--policies", "drape,fifo-backfill,nope"], ["--scale", "0"], ["--memory", "G2=lots"])
    for bad in (*bad_flags, ["--replays", "0"], ["--replays", "26"]):
        with pytest.raises(SystemExit):
            openb_week.main(argv + bad)
    with pytest.raises(SystemExit, match="openb_week: .*file not found"):
        openb_week.main(["--pods", str(tmp_path / "absent.csv"), "--nodes", str(nodes_path)])


def test_replays_move_each_submit_a_little_and_the_table_gives_medians_and_ranges(tmp_path, capsys):
    """~2 s. A replay after the first is the same week with each submit moved by up to `JITTER_S`;
    with --replays the table gives each policy's median and its range over them."""
    pods_path, nodes_path = _write(tmp_path)
    pods, _ = read_pods(pods_path)
    gpus = build_fleet(read_nodes(nodes_path), 1, random.Random(4), openb_week.MEMORY_GIB, True)
    trace = build_week(pods, gpus, random.Random(4), 0.3, 86400)
    moved = openb_week.jittered(trace, 4, 1)
    assert moved == openb_week.jittered(trace, 4, 1) != openb_week.jittered(trace, 4, 2)  # drawn by (seed, replay)
    before = {j.job_id: j for j in trace}
    assert sorted(before) == sorted(j.job_id for j in moved) and [j.submit_s for j in moved] == sorted(j.submit_s for j in moved)
    for job in moved:
        assert abs(job.submit_s - before[job.job_id].submit_s) <= openb_week.JITTER_S and job.submit_s >= 0
        assert job == replace(before[job.job_id], submit_s=job.submit_s)  # nothing else changed
    argv = ["--pods", str(pods_path), "--nodes", str(nodes_path), "--seeds", "4", "--scale", "1", "--load", "0.3"]
    argv += ["--fleets", "small", "--cap-days", "0.5", "--policies", "drape,fifo-backfill", "--replays", "3"]
    assert openb_week.main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| drape |", "| fifo-backfill |"))]
    assert len(rows) == 2
    for row in rows:
        share, starved = row.split(" | ")[2:4]
        low, high = (float(x) for x in share.split("[")[1].rstrip("]").split("-"))
        assert low <= float(share.split(" ")[0]) <= high and "[" in starved, row
