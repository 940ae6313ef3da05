"""tests/integration/nodes.py: a killed node leaves no process behind, even one that keeps forking."""

from __future__ import annotations

import subprocess
import time

from tests.integration.nodes import Nodes


def test_a_node_killed_while_it_forks_leaves_no_process_and_no_disk(tmp_path):
    """~1 s. The node's one process starts a new child every few milliseconds; a single pass over a
    snapshot of its processes misses the children forked after the snapshot, a kill must not."""
    nodes = Nodes(tmp_path, [tmp_path / "live"])
    try:
        nodes.add("rack7.gpu-a")
        nodes.add("rack7.gpu-b")
        (nodes.disk("rack7.gpu-a") / "0" / "cache.bin").write_bytes(b"x")
        forking = "while :; do sleep 60 & done"
        spawner = subprocess.Popen([*nodes.command("rack7.gpu-a"), "sh", "-c", forking], start_new_session=True)
        beside = subprocess.Popen([*nodes.command("rack7.gpu-b"), "sleep", "60"])
        deadline = time.monotonic() + 10
        while len(nodes.pids("rack7.gpu-a")) < 20:
            assert time.monotonic() < deadline, "the node's process did not fork"
            time.sleep(0.01)
        killed = nodes.kill("rack7.gpu-a")
        assert spawner.pid in killed and len(killed) >= 20
        assert nodes.pids("rack7.gpu-a") == []  # nothing forked after the first pass survived
        assert not (nodes.disk("rack7.gpu-a") / "0").exists()
        assert spawner.wait(timeout=10) == -9
        assert nodes.pids("rack7.gpu-b") == [beside.pid] and beside.poll() is None  # the other node is untouched
        beside.kill()
        beside.wait(timeout=10)
    finally:
        nodes.close()
