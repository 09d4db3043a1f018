"""LogFollower on hostile paths: a FIFO (opening it would block until a writer comes) or a device (never
ends) is an OSError naming the path, at once; lines read before a log was replaced by one are kept."""

from __future__ import annotations

import os

import pytest

from advisor.sources.follow import LogFollower


def test_fifo_is_refused_without_blocking(tmp_path) -> None:
    fifo = tmp_path / "server.log"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        LogFollower(str(fifo)).read_lines()


def test_device_is_refused() -> None:
    with pytest.raises(OSError, match="not a regular file"):
        LogFollower("/dev/zero").read_lines()


def test_rotation_to_a_fifo_keeps_the_lines_already_read(tmp_path) -> None:
    log = tmp_path / "server.log"
    log.write_text("one\n")
    follower = LogFollower(str(log))
    assert follower.read_lines() == ["one"]
    with open(log, "a") as handle:
        handle.write("two\n")
    log.rename(tmp_path / "server.log.1")
    os.mkfifo(log)
    assert follower.read_lines() == ["two"]  # the old file drained, the FIFO not opened
    with pytest.raises(OSError, match="not a regular file"):
        follower.read_lines()
