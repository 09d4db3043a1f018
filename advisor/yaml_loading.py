"""The one YAML loader for files a user hands the advisor (the daemon config, the exporter's web config): the
safe loader, without aliases. A 382-byte "billion laughs" (anchors referring to anchors) expands to a tree
whose printing takes gigabytes; refusing aliases keeps every loaded tree as large as its text, no larger."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent

from advisor.errors import InputError


class _NoAliases(yaml.SafeLoader):
    """yaml.SafeLoader that refuses an alias (`*name`) where it would reuse an anchored node."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            line = event.start_mark.line + 1 if event.start_mark is not None else 0
            raise _AliasRefused(line)
        return super().compose_node(parent, index)


class _AliasRefused(Exception):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


def load_yaml(raw: bytes, source: str, max_bytes: int) -> Any:
    """The document in `raw` (UTF-8, at most `max_bytes`), or an InputError naming `source` and the problem:
    too large, not UTF-8, an alias, nested too deeply, or not YAML (with its line)."""
    if len(raw) > max_bytes:
        raise InputError(f"{source} is larger than {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{source} is not UTF-8 (byte {exc.start})") from None
    try:
        return yaml.load(text, Loader=_NoAliases)  # noqa: S506 (a SafeLoader subclass)
    except _AliasRefused as exc:
        raise InputError(f"{source}: YAML aliases (*name) are not accepted (line {exc.line}); write the value out") from None
    except RecursionError:
        raise InputError(f"{source} is nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{source}: not valid YAML{where}") from None


__all__ = ["load_yaml"]
