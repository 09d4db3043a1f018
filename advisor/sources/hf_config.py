"""Reads a Hugging Face `config.json` (a file or a model directory) into a plain dict for the state-shape
rules in `advisor.model.state_shapes`; the only file I/O on the model-config path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.errors import InputError


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """Reads a HF config.json (or a model directory holding one) into a dict."""
    config_path = Path(path)
    if config_path.is_dir():
        config_path = config_path / "config.json"
    try:
        text = config_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{config_path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{config_path}: cannot read: {exc}") from None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{config_path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(parsed, dict):
        raise InputError(f"{config_path}: expected a JSON object, got {type(parsed).__name__}")
    return parsed
