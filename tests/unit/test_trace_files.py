"""The scheduler's input files (scheduler/sim/traces.py): every fleet YAML goes through the bounded
loader (a billion-laughs file is refused on each entry point a user can point at one), and a fleet
or trace with absurd, non-finite or malformed values is refused naming the file and the field,
before a GPU is listed. About 10 s in all (the CLI's import is most of it)."""

from __future__ import annotations

import time

import pytest
import yaml
from typer.testing import CliRunner

from drape.cli import app
from scheduler.queue.inventory import MAX_FLEET_GPUS, FleetFileError, load_fleet
from scheduler.sim.traces import TraceError, load_trace
from tests.conftest import billion_laughs

TRACE = "job_id,submit_s,duration_s,peak_mem_gib,gpus,priority,kind\n"
GOOD_ROW = "j1,0,60,20,1,1,finetune\n"
GROUP = {"model": "H100-80GB", "memory_gib": 80, "nodes": 1, "gpus_per_node": 2}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "trace.csv").write_text(TRACE + GOOD_ROW)
    (tmp_path / "bomb.yaml").write_text(billion_laughs())
    return tmp_path


@pytest.mark.parametrize(
    "command",
    [
        ["queue", "simulate", "--trace", "{d}/trace.csv", "--fleet", "{d}/bomb.yaml"],
        ["queue", "kueue", "--fleet", "{d}/bomb.yaml"],
    ],
    ids=["queue simulate", "queue kueue"],
)
def test_a_billion_laughs_fleet_is_refused_quickly_on_every_command(files, command):
    started = time.monotonic()
    result = CliRunner().invoke(app, [part.format(d=files) for part in command])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"{files}/bomb.yaml: its YAML aliases expand to more than 100000 nodes" in text
    assert time.monotonic() - started < 10 and "Traceback" not in result.output


def test_a_billion_laughs_inventory_is_refused_for_the_static_fleet_and_slurm(files, tmp_path):
    """queue.inventory: read by the static fleet view and the Slurm rendering, both through load_fleet."""
    from types import SimpleNamespace

    from scheduler.dispatch.fleet import fleet_view
    from scheduler.jobs.slurm_script import _placement

    config = SimpleNamespace(queue=SimpleNamespace(fleet="static", inventory=str(files / "bomb.yaml")))
    for read in (lambda: fleet_view(config, store=None), lambda: _placement(config, 1, 1)):
        with pytest.raises(FleetFileError, match=rf"{files}/bomb\.yaml: its YAML aliases expand to more than"):
            read()
    big = tmp_path / "big.yaml"
    big.write_text("groups: []\n" + "#" * (2 << 20))
    with pytest.raises(FleetFileError, match=rf"big\.yaml: {big.stat().st_size} bytes, more than a config may hold"):
        load_fleet(big)


@pytest.mark.parametrize(
    ("fleet", "match"),
    [
        ({"groups": [{**GROUP, "nodes": 10**9}]}, r"groups\[0\]: nodes must be in \[0, 10000\]"),
        ({"groups": [{**GROUP, "nodes": 10_000, "gpus_per_node": 64}]}, f"more than {MAX_FLEET_GPUS} GPUs"),
        ({"groups": [{**GROUP, "memory_gib": float("inf")}]}, r"memory_gib must be a finite number .* got inf"),
        ({"groups": [{**GROUP, "memory_gib": float("nan")}]}, r"memory_gib must be a finite number .* got nan"),
        ({"groups": [{**GROUP, "memory_gib": 1e9}]}, r"memory_gib must be a finite number in \(0, 4096\]"),
        ({"groups": [{**GROUP, "gpus_per_node": 0}]}, r"gpus_per_node in \[1, 64\], got 1 and 0"),
        ({"groups": [{**GROUP, "nodes": 2.5}]}, "nodes and gpus_per_node must be whole numbers"),
        ({"groups": [{**GROUP, "nodes": True}]}, "nodes and gpus_per_node must be whole numbers"),
        ({"groups": [{**GROUP, "model": "H100\nfake"}]}, "without control characters"),
        ({"groups": [{**GROUP, "node_prefix": "gpu\x1b[2J"}]}, "without control characters"),
        ({"groups": {"model": "H100"}}, "expected a mapping with groups"),
        ([GROUP], "expected a mapping with groups"),
        ({"groups": ["H100"]}, r"groups\[0\]: expected model, memory_gib, nodes, gpus_per_node \(a str\)"),
        # a misspelt optional key: the nodes would be named by the prefix, not as the site listed them
        (
            {"groups": [{**GROUP, "node_name": ["gpu-a"]}]},
            r"groups\[0\]: unknown key\(s\) \['node_name'\]; a group has .*node_names",
        ),
    ],
)
def test_a_fleet_with_absurd_or_malformed_values_is_refused_naming_the_group(tmp_path, fleet, match):
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    started = time.monotonic()
    with pytest.raises(FleetFileError, match=match) as error:
        load_fleet(path)
    assert str(error.value).startswith(f"{path}: ") and time.monotonic() - started < 2  # nothing allocated first


def test_a_fleet_that_is_not_yaml_is_named(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("groups: [unclosed\n")
    with pytest.raises(FleetFileError, match=rf"{path}: not YAML"):
        load_fleet(path)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ("j1,0,nan,20,1,1,finetune\n", "duration_s must be finite"),
        ("j1,inf,60,20,1,1,finetune\n", "submit_s must be finite"),
        ("j1,0,60,20,1,1,finetune,,alone,shareable,nan\n", "share must be finite"),
        ("j1,-5,60,20,1,1,finetune\n", r"submit_s must be in \[0"),
        ("j1,0,1e12,20,1,1,finetune\n", "at most that .ten years."),
        ("j1,0,60,20,100000,1,finetune\n", "gpus must be at most 1024"),
        ("j1,0,60,1e6,1,1,finetune\n", "peak_mem_gib at most 4096"),
        ('"j1\x1b[2J",0,60,20,1,1,finetune\n', "may not hold control characters"),
        ("j1,0,60\n", r"peak_mem_gib is missing \(a short row\)"),
        ("j1,0,60,20,1.5,1,finetune\n", "gpus must be an integer, got '1.5'"),
        ("j1,0,60,20,1,1e400,finetune\n", "priority must be an integer, got '1e400'"),
        ("j1,0,60,20,1,2000000,finetune\n", r"priority must be in \[-1000000, 1000000\], got 2000000"),
        ("j1,0,60,20,1," + "9" * 5000 + ",finetune\n", r"priority must be an integer, got '9{40}…'$"),
        (",0,60,20,1,1,finetune\n", "job_id is empty"),
    ],
    ids=[
        "nan duration",
        "inf submit",
        "nan share",
        "negative submit",
        "a century",
        "gpus",
        "memory",
        "escape",
        "short row",
        "half a GPU",
        "priority not an integer",
        "priority out of bounds",
        "a number no integer holds",
        "no job id",
    ],
)
def test_a_trace_row_with_absurd_or_missing_values_is_refused_naming_its_line(tmp_path, row, match):
    path = tmp_path / "trace.csv"
    header = TRACE if row.count(",") <= 6 else TRACE.rstrip("\n") + ",gpu_models,measured,sharing,share\n"
    path.write_text(header + GOOD_ROW.rstrip("\n") + "," * (header.count(",") - 6) + "\n" + row)
    with pytest.raises(TraceError, match=match) as error:
        load_trace(path)
    assert str(error.value).startswith(f"{path}:3: "), error.value


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (
            "j1,0,60,20,1,1,finetune\nj2,5,60,20,1,1,finetune\nj1,9,60,20,1,1,finetune\n",
            r":4: job_id 'j1' is already the job of line 2",
        ),
        ("", r"no jobs, only a header"),
        ("j1,0,60,20,1,1,finetune,H100,alone\n", r":2: 2 more field\(s\) than the header's 7"),
    ],
    ids=["a job id twice", "a header alone", "fields past the header"],
)
def test_a_trace_whose_rows_cannot_be_one_week_is_refused(tmp_path, rows, match):
    """Two jobs of one id would be one job to the policy (the replay's ledger is by id), a header
    alone would print a table of zeros, and fields past the header would be dropped unread."""
    path = tmp_path / "trace.csv"
    path.write_text(TRACE + rows)
    with pytest.raises(TraceError, match=match):
        load_trace(path)


def test_a_trace_saved_by_a_spreadsheet_reads_as_written(tmp_path):
    """A byte-order mark before the header and CRLF line ends (a spreadsheet's CSV export) read as
    the same trace, not as a missing job_id column."""
    plain, exported = tmp_path / "plain.csv", tmp_path / "exported.csv"
    plain.write_text(TRACE + GOOD_ROW + "j2,30,90,40,2,4,train\n")
    exported.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
    assert load_trace(exported) == load_trace(plain) and len(load_trace(plain)) == 2


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (TRACE + "j1," + "x" * 200_000 + ",60,20,1,1,finetune\n", "not a CSV trace .field larger than field limit"),
        (b"\xff\xfe\x00binary", "not a CSV trace .*codec can't decode"),
    ],
    ids=["huge field", "binary"],
)
def test_a_trace_that_is_not_csv_is_named_not_a_traceback(tmp_path, content, match):
    path = tmp_path / "trace.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(TraceError, match=match):
        load_trace(path)


def test_a_config_or_fleet_that_is_not_text_is_named_not_a_traceback(tmp_path):
    from drape.config import ConfigError, load_config

    path = tmp_path / "binary.yaml"
    path.write_bytes(b"groups: []\n\xff\xfe\x00")
    with pytest.raises(ConfigError, match=rf"{path}: not UTF-8 text \(invalid start byte at byte 11\)"):
        load_config(path)
    with pytest.raises(FleetFileError, match=rf"{path}: not UTF-8 text"):
        load_fleet(path)
