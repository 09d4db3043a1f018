"""Reads a Hugging Face `config.json` (a file or a model directory) into a plain dict for the state-shape
rules in `advisor.model.state_shapes`; the only file I/O on the model-config path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.errors import InputError
from advisor.sources.local_files import read_local_bytes

MAX_MODEL_CONFIG_BYTES = 16 << 20  # a config.json is a few KB


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """Reads a HF config.json (or a model directory holding one) into a dict."""
    config_path = Path(path)
    if config_path.is_dir():
        config_path = config_path / "config.json"
    raw = read_local_bytes(config_path, "model config", MAX_MODEL_CONFIG_BYTES)  # never a FIFO or device
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{config_path}: cannot read: not UTF-8 (byte {exc.start})") from None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{config_path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise InputError(f"{config_path}: JSON nested too deeply") from None
    if not isinstance(parsed, dict):
        raise InputError(f"{config_path}: expected a JSON object, got {type(parsed).__name__}")
    return parsed
