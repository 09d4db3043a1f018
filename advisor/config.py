"""The daemon's one validated config object: a YAML file, overridden by environment variables, then by flags.

Every field is checked here; a typo or a bad value is an InputError naming the field (the CLI turns it into
one line and exit code 2). Nothing reads a global: the object is passed to whoever needs it.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from advisor.errors import InputError
from advisor.recommend.engine import RecommenderSettings
from advisor.store_config import StoreTargetConfig, store_target_from_dict

ENV_PREFIX = "POOL_ADVISOR_"


@dataclass(frozen=True)
class TargetConfig:
    name: str
    url: str
    api_key: str | None = field(default=None, repr=False)
    log_paths: tuple[str, ...] = ()
    boot_log: str | None = None
    # Optional overrides when neither a boot log nor /server_info can give the byte constants.
    state_bytes_per_slot: float | None = None
    kv_bytes_per_token: float | None = None
    rest_gib: float | None = None


@dataclass(frozen=True)
class AdvisorConfig:
    targets: tuple[TargetConfig, ...]
    store_targets: tuple[StoreTargetConfig, ...] = ()  # `kind: prometheus` targets (advisor.store_config)
    interval_seconds: float = 15.0
    listen: str = "127.0.0.1:9415"
    checkpoint_path: str | None = None
    half_life_seconds: float = 3600.0
    state_bias: float = RecommenderSettings().state_bias  # one knob, one default: the recommender's
    timeout_seconds: float = 5.0
    server_info_every: int = 20  # cycles between /server_info refreshes (it runs on the scheduler's loop)
    stale_after_cycles: int = 3
    # Advisor time runs this many times faster than the wall clock (demo/bench against a sped-up emulator).
    time_scale: float = 1.0

    @property
    def listen_host(self) -> str:
        return self.listen.rsplit(":", 1)[0] or "127.0.0.1"

    @property
    def listen_port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


_TOP_FIELDS = {f.name: f for f in fields(AdvisorConfig)}
_TARGET_FIELDS = {f.name: f for f in fields(TargetConfig)}


def _unknown(name: str, known: Any, where: str) -> InputError:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return InputError(f"unknown field '{name}' in {where}{hint}")


def _number(value: Any, name: str, *, positive: bool = True, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"field '{name}' must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise InputError(f"field '{name}' must be a number, got {value!r}") from None
    if integer and number != int(number):
        raise InputError(f"field '{name}' must be a whole number, got {value!r}")
    if positive and not number > 0:
        raise InputError(f"field '{name}' must be > 0, got {value!r}")
    return number


def _target(raw: Any, index: int, env: Mapping[str, str]) -> TargetConfig:
    where = f"targets[{index}]"
    if isinstance(raw, str):
        raw = {"url": raw}
    if not isinstance(raw, dict):
        raise InputError(f"{where} must be a mapping with at least 'url'")
    for key in raw:
        if key not in _TARGET_FIELDS and key != "api_key_env":
            raise _unknown(str(key), list(_TARGET_FIELDS) + ["api_key_env"], where)
    url = raw.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InputError(f"field '{where}.url' must be an http(s) URL, got {url!r}")
    api_key = raw.get("api_key")
    if raw.get("api_key_env"):
        api_key = env.get(str(raw["api_key_env"])) or api_key
        if api_key is None:
            raise InputError(f"field '{where}.api_key_env': environment variable {raw['api_key_env']} is not set")
    logs = raw.get("log_paths", ())
    if isinstance(logs, str):
        logs = (logs,)
    if not isinstance(logs, (list, tuple)) or not all(isinstance(p, str) for p in logs):
        raise InputError(f"field '{where}.log_paths' must be a list of file paths")
    name = raw.get("name") or url.split("://", 1)[1].rstrip("/")
    numbers = {}
    for key in ("state_bytes_per_slot", "kv_bytes_per_token", "rest_gib"):
        if raw.get(key) is not None:
            numbers[key] = _number(raw[key], f"{where}.{key}")
    if ("state_bytes_per_slot" in numbers) != ("kv_bytes_per_token" in numbers):
        raise InputError(f"fields '{where}.state_bytes_per_slot' and '{where}.kv_bytes_per_token' go together")
    return TargetConfig(
        name=str(name), url=url.rstrip("/"), api_key=api_key, log_paths=tuple(logs),
        boot_log=raw.get("boot_log"), **numbers,
    )


def config_from_dict(data: dict[str, Any], env: Mapping[str, str] | None = None) -> AdvisorConfig:
    """Validate a config mapping; `env` (default: the process environment) resolves `api_key_env`."""
    if not isinstance(data, dict):
        raise InputError("advisor config must be a mapping")
    for key in data:
        if key not in _TOP_FIELDS:
            raise _unknown(str(key), _TOP_FIELDS, "advisor config")
    raw_targets = data.get("targets") or []
    if not isinstance(raw_targets, list):
        raise InputError("field 'targets' must be a list")
    environment = os.environ if env is None else env
    store_targets = tuple(store_target_from_dict(t, f"targets[{i}]", environment) for i, t in enumerate(raw_targets)
                          if isinstance(t, dict) and t.get("kind") == "prometheus")
    targets = tuple(_target(t, i, environment) for i, t in enumerate(raw_targets)
                    if not (isinstance(t, dict) and t.get("kind") == "prometheus"))
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise InputError(f"field 'targets': duplicate target name in {names}")
    values: dict[str, Any] = {"targets": targets, "store_targets": store_targets}
    for key in ("interval_seconds", "half_life_seconds", "timeout_seconds", "time_scale"):
        if key in data:
            values[key] = _number(data[key], key)
    if "state_bias" in data:
        values["state_bias"] = _number(data["state_bias"], "state_bias", positive=False)
        if values["state_bias"] < 0:
            raise InputError(f"field 'state_bias' must be >= 0, got {data['state_bias']!r}")
    for key in ("server_info_every", "stale_after_cycles"):
        if key in data:
            values[key] = int(_number(data[key], key, integer=True))
    if "listen" in data:
        values["listen"] = _listen(data["listen"])
    if data.get("checkpoint_path") is not None:
        values["checkpoint_path"] = str(data["checkpoint_path"])
    return AdvisorConfig(**values)


def _listen(value: Any) -> str:
    text = str(value)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"field 'listen' must be HOST:PORT, got {value!r}")
    return text if host else f"127.0.0.1:{port}"


def load_config(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read advisor config {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"advisor config {path} is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"advisor config {path} must be a mapping at the top level")
    return data


def build_config(path: str | Path | None, env: dict[str, str], overrides: dict[str, Any]) -> AdvisorConfig:
    """File, then POOL_ADVISOR_<FIELD> environment variables, then flags (non-None overrides)."""
    data = load_config(path)
    for key in _TOP_FIELDS:
        env_key = ENV_PREFIX + key.upper()
        if key != "targets" and env_key in env:
            data[key] = env[env_key]
    extra_urls = overrides.pop("target_urls", None) or []
    if env.get(ENV_PREFIX + "TARGET_URL"):
        extra_urls = [env[ENV_PREFIX + "TARGET_URL"], *extra_urls]
    for key, value in overrides.items():
        if value is not None:
            data[key] = value
    if extra_urls:
        data["targets"] = [*(data.get("targets") or []), *({"url": u} for u in extra_urls)]
    config = config_from_dict(data, env)
    if not config.targets and not config.store_targets:
        raise InputError("no targets: give --target URL or a config file with 'targets'")
    return config


__all__ = ["AdvisorConfig", "TargetConfig", "build_config", "config_from_dict", "load_config", "replace"]
