"""Atomic JSON checkpoints of the advisor's state, and a loader that sets a corrupt file aside.

Write = temp file in the same directory, fsync, rename over the old one, fsync the directory: a crash (even
`kill -9`) leaves either the old or the new checkpoint, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

CHECKPOINT_FORMAT = "sglang-pool-advisor/checkpoint/v1"


def write_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"format": CHECKPOINT_FORMAT, "state": state}, separators=(",", ":"))
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
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


def read_checkpoint(path: str | Path, now: float | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(state, problem). A missing file is (None, None); a corrupt one is moved aside and reported."""
    target = Path(path)
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot read checkpoint {target}: {exc.strerror or exc}"
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT or not isinstance(data.get("state"), dict):
            raise ValueError("not an advisor checkpoint")
        return data["state"], None
    except ValueError as exc:
        aside = set_aside(target, now)
        return None, f"checkpoint {target} is corrupt ({str(exc).splitlines()[0][:80]}); moved to {aside.name}, starting cold"


def set_aside(path: Path, now: float | None = None) -> Path:
    stamp = int(now if now is not None else time.time())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    try:
        os.replace(path, aside)
    except OSError:
        pass
    return aside
