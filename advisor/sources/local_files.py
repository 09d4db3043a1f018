"""Reading a local file a user named (a boot log, a model config, a web config, an inspect input): only a
regular file, and only up to a size cap. A FIFO would block the open until a writer comes, a device such as
/dev/zero would never end; both, and anything over the cap, are a one-line InputError naming the path."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from advisor.errors import InputError


def read_local_bytes(path: str | Path, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file `path` (at most `max_bytes`); an InputError naming `what` and the path
    otherwise. The open never blocks (O_NONBLOCK), and the type is checked on the opened descriptor."""
    shown = str(path)
    try:
        fd = os.open(shown, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"cannot read {what} {shown}: no such file") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(f"cannot read {what} {shown}: it is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"cannot read {what} {shown}: not a regular file (a FIFO, socket or device)")
        if info.st_size > max_bytes:
            raise InputError(f"{what} {shown} is larger than {max_bytes} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:  # grew while we read it
                raise InputError(f"{what} {shown} is larger than {max_bytes} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_local_text(path: str | Path, what: str, max_bytes: int) -> str:
    """`read_local_bytes` decoded as UTF-8, undecodable bytes replaced (logs may hold anything)."""
    return read_local_bytes(path, what, max_bytes).decode("utf-8", errors="replace")


__all__ = ["read_local_bytes", "read_local_text"]
