"""LogFollower on real files: late creation, partial lines, rotation, truncation, overlong lines, checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

from advisor.sources.follow import LogFollower


def _append(path: Path, data: str | bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)


def test_file_that_appears_later(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    follower = LogFollower(str(path), start_at_end=True)
    assert follower.read_lines() == []
    _append(path, "one\ntwo\n")
    # start_at_end only skips what a file already held at the first look; a new file is read whole.
    assert follower.read_lines() == ["one", "two"]
    assert follower.read_lines() == []


def test_start_at_end_skips_existing_content(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    _append(path, "old 1\nold 2\n")
    follower = LogFollower(str(path), start_at_end=True)
    assert follower.read_lines() == []
    _append(path, "new\n")
    assert follower.read_lines() == ["new"]
    assert LogFollower(str(path)).read_lines() == ["old 1", "old 2", "new"]


def test_partial_last_line_is_held_until_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    _append(path, "complete\nhalf a li")
    follower = LogFollower(str(path))
    assert follower.read_lines() == ["complete"]
    assert follower.read_lines() == []
    _append(path, "ne\r\nnext\n")
    assert follower.read_lines() == ["half a line", "next"]


def test_rotation_drains_the_old_file_then_switches(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    _append(path, "a1\na2\n")
    follower = LogFollower(str(path))
    assert follower.read_lines() == ["a1", "a2"]
    _append(path, "a3\na4-without-newline")  # written before the rename, not yet read
    os.rename(path, tmp_path / "server.log.1")
    _append(path, "b1\nb2\n")
    assert follower.read_lines() == ["a3", "a4-without-newline", "b1", "b2"]
    assert follower.rotations == 1
    _append(path, "b3\n")
    assert follower.read_lines() == ["b3"]


def test_deleted_file_keeps_being_read_until_replaced(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    _append(path, "x1\n")
    follower = LogFollower(str(path))
    assert follower.read_lines() == ["x1"]
    with open(path, "ab") as writer:
        os.unlink(path)
        writer.write(b"x2\n")
        writer.flush()
        assert follower.read_lines() == ["x2"]
    _append(path, "y1\n")
    assert follower.read_lines() == ["y1"]


def test_truncation_restarts_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    _append(path, "line one is long\nline two is long\n")
    follower = LogFollower(str(path))
    assert len(follower.read_lines()) == 2
    with open(path, "wb") as handle:  # copytruncate / `> server.log`
        handle.write(b"fresh\n")
    assert follower.read_lines() == ["fresh"]
    assert follower.truncations == 1


def test_overlong_lines_are_cut(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    _append(path, "x" * 1000 + "\nok\n")
    follower = LogFollower(str(path), max_line_bytes=100)
    assert follower.read_lines() == ["x" * 100, "ok"]
    # An overlong line still being written: cut once, the rest skipped up to its newline.
    _append(path, "y" * 150)
    assert follower.read_lines() == ["y" * 100]
    _append(path, "y" * 500)
    assert follower.read_lines() == []
    _append(path, "yyy\nnext\n")
    assert follower.read_lines() == ["next"]
    assert follower.cut_lines == 2


def test_multibyte_cut_and_invalid_utf8_do_not_raise(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    _append(path, ("é" * 80 + "\n").encode() + b"bad \xff\xfe bytes\n")
    lines = LogFollower(str(path), max_line_bytes=101).read_lines()
    assert lines[0] == "é" * 50 + "\ufffd"  # 101 bytes end inside a 2-byte character
    assert lines[1] == "bad \ufffd\ufffd bytes"


def test_checkpoint_resumes_without_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    _append(path, "l1\nl2\npart")
    first = LogFollower(str(path))
    assert first.read_lines() == ["l1", "l2"]
    state = first.state()
    assert state["offset"] == len("l1\nl2\n") and state["inode"] == os.stat(path).st_ino
    _append(path, "ial\nl4\n")
    second = LogFollower(str(path), start_at_end=True)  # restore wins over start_at_end
    second.restore(state)
    assert second.state() == state
    assert second.read_lines() == ["partial", "l4"]


def test_checkpoint_of_a_rotated_or_truncated_file_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    _append(path, "old\n" * 10)
    follower = LogFollower(str(path))
    follower.read_lines()
    state = follower.state()
    os.rename(path, tmp_path / "server.log.1")
    _append(path, "new\n")
    rotated = LogFollower(str(path))
    rotated.restore(state)
    assert rotated.read_lines() == ["new"]
    # Same inode but shorter than the saved offset: truncated while we were away.
    truncated_state = rotated.state()
    truncated_state["offset"] = 10_000
    again = LogFollower(str(path))
    again.restore(truncated_state)
    assert again.read_lines() == ["new"]


def test_byte_budget_spreads_a_backlog_over_calls(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    expected = [f"line {index}" for index in range(2000)]
    _append(path, "".join(line + "\n" for line in expected))
    follower = LogFollower(str(path), max_bytes_per_call=1000)
    collected: list[str] = []
    calls = 0
    while calls < 10_000:
        batch = follower.read_lines()
        calls += 1
        if not batch and follower.state()["offset"] == path.stat().st_size:
            break
        collected.extend(batch)
    assert collected == expected
    assert calls > 10
