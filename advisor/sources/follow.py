"""Follow a growing log file like `tail -F`, returning only complete new lines on each call.

Copes with a file that appears later, rotation (inode change: the old file is drained first), truncation
(size below our offset: start again at 0), a partial last line (held until its newline arrives) and
overlong lines (cut at `max_line_bytes`, the rest skipped). `state()`/`restore()` checkpoint the position.
A path that is not a regular file (a FIFO, a device) is an OSError: reading it would block or never end.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from typing import Any

_READ_CHUNK = 1 << 20


class LogFollower:
    """Reads new complete lines of `path`. Not thread-safe; one follower per file."""

    def __init__(
        self,
        path: str,
        *,
        start_at_end: bool = False,
        max_line_bytes: int = 1 << 20,
        max_bytes_per_call: int = 16 << 20,
        encoding: str = "utf-8",
    ) -> None:
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be >= 1, got {max_line_bytes}")
        self.path = path
        self.max_line_bytes = int(max_line_bytes)
        self.max_bytes_per_call = max(int(max_bytes_per_call), 1)
        self.encoding = encoding
        self._start_at_end = start_at_end  # applies only to a file present at the first look
        self._first_look = True
        self._file: io.FileIO | None = None
        self._inode: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._offset = 0  # bytes of the open file consumed as complete lines (or skipped)
        self._pending = b""  # a partial last line
        self._skipping = False  # inside an overlong line: drop bytes until its newline
        self._restored: dict[str, Any] | None = None
        # Counters for the daemon's own metrics.
        self.rotations = 0
        self.truncations = 0
        self.cut_lines = 0

    # -- checkpoint

    def state(self) -> dict[str, Any]:
        """Where we are: the inode and the offset of the first byte not yet returned as a line."""
        if self._inode is None:
            if self._restored is not None:
                return dict(self._restored)
            return {"path": self.path, "device": None, "inode": None, "offset": 0}
        pending = 0 if self._skipping else len(self._pending)
        return {
            "path": self.path,
            "device": self._inode[0],
            "inode": self._inode[1],
            "offset": self._offset - pending,
            "skipping": self._skipping,  # inside an overlong line already returned cut
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from `state()`: the same file at that offset; a different or shorter file from 0."""
        self.close()
        self._restored = dict(state)
        self._first_look = False

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._inode = None
        self._offset = 0
        self._pending = b""
        self._skipping = False

    # -- reading

    def read_lines(self) -> list[str]:
        """Complete lines appended since the last call (without their newline)."""
        lines: list[str] = []
        budget = self.max_bytes_per_call
        if self._file is None and not self._open():
            return lines
        budget -= self._drain(lines, budget)
        if budget <= 0:
            return lines
        # Rotation: the path now names another file (or none yet). Drain the old one, then switch.
        identity = self._path_identity()
        if identity is not None and identity != self._inode:
            if self._pending and not self._skipping:
                lines.append(self._decode(self._pending))  # the writer has moved on: its last line is whole
            self.close()
            self.rotations += 1
            try:
                opened = self._open()
            except OSError:  # the new file is not a regular file: keep what was read, raise on the next call
                return lines
            if opened:
                self._drain(lines, budget)
        return lines

    def _path_identity(self) -> tuple[int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_dev, info.st_ino)

    def _open(self) -> bool:
        try:
            mode = os.stat(self.path).st_mode
        except OSError:
            self._first_look = False
            return False
        if not stat.S_ISREG(mode):  # opening a FIFO blocks until a writer comes; a device never ends
            raise OSError(errno.EINVAL, f"not a regular file: {self.path}")
        try:
            handle = io.FileIO(self.path, "rb")
        except OSError:
            self._first_look = False
            return False
        info = os.fstat(handle.fileno())
        self._file = handle
        self._inode = (info.st_dev, info.st_ino)
        self._pending = b""
        self._skipping = False
        offset = 0
        restored, self._restored = self._restored, None
        if restored is not None:
            same_file = restored.get("inode") == info.st_ino and restored.get("device") in (None, info.st_dev)
            saved = restored.get("offset")
            if same_file and isinstance(saved, int) and 0 <= saved <= info.st_size:
                offset = saved
                self._skipping = bool(restored.get("skipping"))
        elif self._first_look and self._start_at_end:
            offset = info.st_size
        self._first_look = False
        handle.seek(offset)
        self._offset = offset
        return True

    def _drain(self, lines: list[str], budget: int) -> int:
        """Read the open file to its end (or the byte budget); returns the bytes read."""
        assert self._file is not None
        size = os.fstat(self._file.fileno()).st_size
        if size < self._offset:  # truncated in place (copytruncate, `> file`)
            self.truncations += 1
            self._file.seek(0)
            self._offset = 0
            self._pending = b""
            self._skipping = False
        total = 0
        while total < budget:
            chunk = self._file.read(min(_READ_CHUNK, budget - total))
            if not chunk:
                break
            total += len(chunk)
            self._offset += len(chunk)
            self._take(chunk, lines)
        return total

    def _take(self, chunk: bytes, lines: list[str]) -> None:
        if self._skipping:
            newline = chunk.find(b"\n")
            if newline < 0:
                return
            chunk = chunk[newline + 1 :]
            self._skipping = False
        data = self._pending + chunk if self._pending else chunk
        last = data.rfind(b"\n")
        if last < 0:
            self._pending = data
        else:
            self._pending = data[last + 1 :]
            block = data[:last]
            text = self._decode(block)
            if "\r" in text:
                text = text.replace("\r\n", "\n")
            new_lines = text.split("\n")
            if len(block) > self.max_line_bytes:
                new_lines = [self._cut(line) for line in new_lines]
            lines.extend(new_lines)
        if len(self._pending) > self.max_line_bytes:
            lines.append(self._decode(self._pending[: self.max_line_bytes]))
            self.cut_lines += 1
            self._pending = b""
            self._skipping = True

    def _cut(self, line: str) -> str:
        if len(line) <= self.max_line_bytes // 4:  # cannot exceed the byte limit
            return line
        encoded = line.encode(self.encoding, errors="replace")
        if len(encoded) <= self.max_line_bytes:
            return line
        self.cut_lines += 1
        return self._decode(encoded[: self.max_line_bytes])

    def _decode(self, raw: bytes) -> str:
        return raw.decode(self.encoding, errors="replace")
