"""Atomic checkpoints: round trip, corrupt file set aside, a kill -9 mid-write leaves the old one."""

import os
import subprocess
import sys
import textwrap

from advisor.daemon.checkpoint import read_checkpoint, write_checkpoint


def test_round_trip(tmp_path):
    path = tmp_path / "sub" / "state.json"
    write_checkpoint(path, {"targets": {"a": {"x": 1}}})
    state, problem = read_checkpoint(path)
    assert problem is None and state == {"targets": {"a": {"x": 1}}}
    assert read_checkpoint(tmp_path / "absent.json") == (None, None)


def test_corrupt_checkpoint_is_set_aside(tmp_path):
    path = tmp_path / "state.json"
    path.write_text('{"format": "sglang-pool-advisor/checkpoint/v1", "state": {"tar')
    state, problem = read_checkpoint(path, now=1234)
    assert state is None
    assert "corrupt" in problem and "state.json.corrupt-1234" in problem
    assert not path.exists() and (tmp_path / "state.json.corrupt-1234").exists()


def test_kill_during_writes_leaves_a_whole_checkpoint(tmp_path):
    path = tmp_path / "state.json"
    write_checkpoint(path, {"generation": 0, "blob": "x" * 1000})
    script = textwrap.dedent(
        f"""
        from advisor.daemon.checkpoint import write_checkpoint
        i = 0
        while True:
            i += 1
            write_checkpoint({str(path)!r}, {{"generation": i, "blob": "y" * 200000}})
            print(i, flush=True)  # generation i is on disk
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    completed = 0
    while completed < 20:  # kill while it keeps writing, after at least 20 whole generations
        completed = int(proc.stdout.readline())
    proc.kill()
    proc.wait(timeout=10)
    state, problem = read_checkpoint(path)
    assert problem is None
    # the newest whole generation (or the one after it, if its rename landed before the kill) — never older
    assert state["generation"] >= completed
    assert state["blob"] == "y" * 200000
    leftovers = [n for n in os.listdir(tmp_path) if n != "state.json"]
    # a temp file may be left behind by the kill, but the checkpoint itself is whole
    assert all(n.startswith(".state.json.") and n.endswith(".tmp") for n in leftovers)
