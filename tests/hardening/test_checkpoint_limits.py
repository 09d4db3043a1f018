"""Checkpoint reading under hostile files: a size limit, deep nesting, stale temp files of crashed writes, and
a well-formed checkpoint whose content has the wrong shapes (the daemon starts cold, it does not crash)."""

from __future__ import annotations

import json
import os
import time

import pytest

from advisor.config import config_from_dict
from advisor.daemon.checkpoint import CHECKPOINT_FORMAT, read_checkpoint, write_checkpoint
from advisor.daemon.runner import Advisor


def test_oversized_checkpoint_is_set_aside_unread(tmp_path) -> None:
    path = tmp_path / "state.json"
    write_checkpoint(path, {"targets": {}, "blob": "x" * 5000})
    state, problem = read_checkpoint(path, now=77, max_bytes=1000)
    assert state is None and problem is not None and "larger than 1000 bytes" in problem
    assert not path.exists() and (tmp_path / "state.json.corrupt-77").exists()


def test_a_state_larger_than_a_start_reads_is_not_written_and_the_old_checkpoint_stays(tmp_path) -> None:
    path = tmp_path / "state.json"
    write_checkpoint(path, {"targets": {"a": 1}})
    with pytest.raises(OSError, match="more than the 4096 a start reads"):
        write_checkpoint(path, {"targets": {f"server-{i}": "x" * 100 for i in range(100)}}, max_bytes=4096)
    state, problem = read_checkpoint(path)
    assert problem is None and state == {"targets": {"a": 1}}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp file left


def test_deeply_nested_checkpoint_is_corrupt_not_a_crash(tmp_path) -> None:
    path = tmp_path / "state.json"
    nested = "[" * 100_000 + "]" * 100_000
    path.write_text(f'{{"format": "{CHECKPOINT_FORMAT}", "state": {nested}}}')
    state, problem = read_checkpoint(path, now=5)
    assert state is None and problem is not None and "corrupt" in problem


def test_binary_checkpoint_is_corrupt_not_a_crash(tmp_path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    state, problem = read_checkpoint(path, now=6)
    assert state is None and problem is not None and "corrupt" in problem


def test_stale_temp_files_of_crashed_writes_are_removed(tmp_path) -> None:
    path = tmp_path / "state.json"
    write_checkpoint(path, {"targets": {}})
    stale = tmp_path / ".state.json.abc123.tmp"
    fresh = tmp_path / ".state.json.def456.tmp"  # a write in progress (another process): left alone
    other = tmp_path / ".other.json.abc123.tmp"  # not ours
    for file in (stale, fresh, other):
        file.write_text("{")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    state, problem = read_checkpoint(path)
    assert problem is None and state == {"targets": {}}
    assert not stale.exists() and fresh.exists() and other.exists()


def test_checkpoint_with_wrong_shapes_starts_cold(tmp_path) -> None:
    path = tmp_path / "state.json"
    config = config_from_dict({"targets": [{"name": "a", "url": "http://127.0.0.1:9"}],
                               "checkpoint_path": str(path)}, {})
    for targets in ([], "x", {"a": []}, {"a": {"estimator": "nonsense"}}, {"a": {"estimator": {"x": [1, 2]}}}):
        path.write_text(json.dumps({"format": CHECKPOINT_FORMAT, "state": {"saved_at": "soon", "targets": targets}}))
        advisor = Advisor(config)
        try:
            advisor.load_checkpoint()  # must not raise
            assert advisor.pipelines[0].server_state.restored is False
        finally:
            advisor.close()


def test_checkpoint_path_that_is_a_fifo_does_not_block(tmp_path) -> None:
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    state, problem = read_checkpoint(fifo)
    assert state is None and problem is not None and "not a regular file" in problem
