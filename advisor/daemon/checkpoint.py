"""Atomic JSON checkpoints of the advisor's state, and a loader that sets a corrupt file aside.

Write = temp file in the same directory, fsync, rename over the old one, fsync the directory: a crash (even
`kill -9`) leaves either the old or the new checkpoint, never half of one. A temp file such a crash leaves
behind is removed at the next start; a checkpoint larger than the read limit is set aside unread.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

CHECKPOINT_FORMAT = "sglang-pool-advisor/checkpoint/v1"
MAX_CHECKPOINT_BYTES = 256 << 20  # a server's state is tens of KB (~30 KB through a store): ~8000 servers
STALE_TEMP_SECONDS = 60.0  # a temp file older than this belongs to no write in progress


def _temp_prefix(target: Path) -> str:
    return f".{target.name}."


def checkpoint_path_problem(path: str | Path) -> str | None:
    """Why `path` cannot be the checkpoint, or None: it exists and is not a regular file (a device, a FIFO, a
    directory: renaming over it would replace it), or its parent exists and is not a directory. Symlinks are
    followed for the check; the write then replaces the link, never what it points at."""
    target = Path(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except NotADirectoryError:
        return f"checkpoint {target}: a parent of it is not a directory"
    except OSError as exc:
        return f"checkpoint {target}: {exc.strerror or exc}"
    if mode is not None and not stat.S_ISREG(mode):
        return f"checkpoint {target} exists and is not a regular file; refusing to replace it"
    for parent in [target.parent, *target.parent.parents]:
        try:
            if not stat.S_ISDIR(os.stat(parent).st_mode):
                return f"checkpoint {target}: {parent} is not a directory"
            break  # the nearest existing parent is a directory: mkdir makes the rest
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"checkpoint {target}: {exc.strerror or exc}"
    return None


def write_checkpoint(path: str | Path, state: dict[str, Any], *, max_bytes: int = MAX_CHECKPOINT_BYTES) -> None:
    """Atomically replace the checkpoint at `path` (never anything that is not a regular file: OSError). A
    state larger than a restart would read (`max_bytes`) is not written (OSError): the previous checkpoint
    stays, rather than one the next start would set aside as oversized."""
    target = Path(path)
    problem = checkpoint_path_problem(target)
    if problem is not None:
        raise OSError(errno.EINVAL, problem)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"format": CHECKPOINT_FORMAT, "state": state}, separators=(",", ":"))
    if len(payload) > max_bytes:
        raise OSError(errno.EFBIG, f"checkpoint would be {len(payload)} bytes, more than the {max_bytes} a start "
                                   "reads; kept the previous one (shard a large store target over several advisors)")
    fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(target), suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(target.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def remove_stale_temp_files(target: Path, older_than: float = STALE_TEMP_SECONDS) -> list[Path]:
    """Delete the temp files an interrupted write left beside `target` (only ours: `.<name>.*.tmp`)."""
    removed: list[Path] = []
    cutoff = time.time() - older_than
    try:
        candidates = list(target.parent.glob(f"{_temp_prefix(target)}*.tmp"))
    except OSError:
        return removed
    for candidate in candidates:
        try:
            if candidate.is_file() and not candidate.is_symlink() and candidate.stat().st_mtime < cutoff:
                candidate.unlink()
                removed.append(candidate)
        except OSError:
            pass
    return removed


def read_checkpoint(
    path: str | Path, now: float | None = None, *, max_bytes: int = MAX_CHECKPOINT_BYTES
) -> tuple[dict[str, Any] | None, str | None]:
    """(state, problem). A missing file is (None, None); a corrupt or oversized one is moved aside and
    reported. Stale temp files of interrupted writes are removed first."""
    target = Path(path)
    problem = checkpoint_path_problem(target)
    if problem is not None:  # a FIFO would block the start, a device never end; nor may either be replaced
        return None, problem
    remove_stale_temp_files(target)
    try:
        with open(target, "rb", opener=_nonblocking) as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # swapped since the check
                return None, f"checkpoint {target} is not a regular file"
            raw = handle.read(max_bytes + 1)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot read checkpoint {target}: {exc.strerror or exc}"
    if len(raw) > max_bytes:
        aside = set_aside(target, now)
        return None, f"checkpoint {target} is larger than {max_bytes} bytes; moved to {aside.name}, starting cold"
    try:
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT or not isinstance(data.get("state"), dict):
            raise ValueError("not an advisor checkpoint")
        return data["state"], None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        reason = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
        aside = set_aside(target, now)
        return None, f"checkpoint {target} is corrupt ({reason}); moved to {aside.name}, starting cold"


def _nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))


def set_aside(path: Path, now: float | None = None) -> Path:
    stamp = int(now if now is not None else time.time())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    try:
        os.replace(path, aside)
    except OSError:
        pass
    return aside
