"""The daemon's one validated config object: a YAML file, overridden by environment variables, then by flags.

Every field is checked here, against the bounds and hints all inputs share (`advisor.validate`); a typo or a
bad value is an InputError naming the field (the CLI turns it into one line and exit code 2). Nothing reads a global: the object is passed to whoever needs it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from advisor.errors import InputError
from advisor.recommend.engine import RecommenderSettings
from advisor.scrub import redact_url
from advisor.store_config import StoreTargetConfig, store_target_from_dict
from advisor.validate import BOUNDS, check_fields, config_number, shown
from advisor.yaml_loading import load_yaml

ENV_PREFIX = "POOL_ADVISOR_"
MAX_CONFIG_BYTES = 256 << 10  # a config is a few KB; PyYAML takes ~1.4 s and ~18 MB for 256 KB


@dataclass(frozen=True)
class TargetConfig:
    name: str
    url: str = field(repr=False)  # may carry user:password@ (sent as Basic auth); shown only as `shown_url`
    api_key: str | None = field(default=None, repr=False)
    log_paths: tuple[str, ...] = ()
    boot_log: str | None = None
    # Optional overrides when neither a boot log nor /server_info can give the byte constants.
    state_bytes_per_slot: float | None = None
    kv_bytes_per_token: float | None = None
    rest_gib: float | None = None

    @property
    def shown_url(self) -> str:
        """The URL without any user:password@, for anything a person or a scraper sees."""
        return redact_url(self.url)
    # SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK as the server runs it (S drops by one); None: as /server_info shows,
    # else assumed off (SGLang only exposes it with SGLANG_EXPOSE_OWN_ENV_VARS=1).
    skip_decode_lock: bool | None = None


@dataclass(frozen=True)
class AdvisorConfig:
    targets: tuple[TargetConfig, ...]
    store_targets: tuple[StoreTargetConfig, ...] = ()  # `kind: prometheus` targets (advisor.store_config)
    interval_seconds: float = 15.0
    listen: str = "127.0.0.1:9415"
    checkpoint_path: str | None = None
    half_life_seconds: float = 3600.0
    state_bias: float = RecommenderSettings().state_bias  # one knob, one default: the recommender's
    # The what-if replay: how much recent traffic it replays, and how often (server seconds; 0 turns it off).
    replay_window_seconds: float = 1800.0
    replay_interval_seconds: float = 300.0
    replay_workers: int = 1  # processes a replay's candidate ratios are spread over (1: in the daemon's own)
    # The first replay waits for this much observed traffic (server seconds); until then the advisor says so.
    replay_min_window_seconds: float = 600.0
    # Seconds of what-if replay one cycle may spend across a store target's servers (oldest replay first; the
    # rest keep their last curve): None is a quarter of interval_seconds, 0 replays none of them.
    replay_budget_seconds: float | None = None
    timeout_seconds: float = 5.0
    server_info_every: int = 20  # cycles between /server_info refreshes (it runs on the scheduler's loop)
    stale_after_cycles: int = 3
    # Advisor time runs this many times faster than the wall clock (demo/bench against a sped-up emulator).
    time_scale: float = 1.0
    # Caps on what one target may make the advisor hold; exceeding one is a counted error for that source.
    max_body_bytes: int = 64 << 20  # one HTTP response body
    max_line_bytes: int = 1 << 20  # one /metrics line or one followed log line
    max_labels_per_series: int = 64  # labels on one /metrics sample
    max_series: int = 200_000  # samples of the families the advisor reads, per scrape

    @property
    def replay_budget(self) -> float:
        """The per-cycle replay budget of a store target, in seconds."""
        if self.replay_budget_seconds is not None:
            return self.replay_budget_seconds
        return 0.25 * self.interval_seconds

    @property
    def listen_host(self) -> str:
        return self.listen.rsplit(":", 1)[0] or "127.0.0.1"

    @property
    def listen_port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


_TOP_FIELDS = {f.name: f for f in fields(AdvisorConfig)}
_TARGET_FIELDS = {f.name: f for f in fields(TargetConfig)}


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"field '{name}' must be a non-empty string, got {shown(value)}")
    if "\0" in value:
        raise InputError(f"field '{name}' must not contain a NUL character")
    return value


# The numeric fields of each mapping, checked against their bounds in advisor.validate.BOUNDS.
_TOP_NUMBERS = ("interval_seconds", "timeout_seconds", "half_life_seconds", "time_scale", "state_bias",
                "replay_window_seconds", "replay_interval_seconds", "replay_workers", "replay_budget_seconds",
                "replay_min_window_seconds",
                "server_info_every", "stale_after_cycles",
                "max_body_bytes", "max_line_bytes", "max_labels_per_series", "max_series")
_TARGET_NUMBERS = ("state_bytes_per_slot", "kv_bytes_per_token", "rest_gib")


def _target(raw: Any, index: int, env: Mapping[str, str]) -> TargetConfig:
    where = f"targets[{index}]"
    if isinstance(raw, str):
        raw = {"url": raw}
    if not isinstance(raw, dict):
        raise InputError(f"{where} must be a mapping with at least 'url'")
    check_fields(raw, [*_TARGET_FIELDS, "api_key_env"], where)
    url = raw.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InputError(f"field '{where}.url' must be an http(s) URL, got {shown(redact_url(str(url)))}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError:
        raise InputError(f"field '{where}.url' is not a valid URL: {shown(redact_url(url))}") from None
    if not parts.hostname:
        raise InputError(f"field '{where}.url' has no host: {shown(redact_url(url))}")
    api_key = raw.get("api_key")
    if api_key is not None:
        api_key = _string(api_key, f"{where}.api_key")
    if raw.get("api_key_env") is not None:
        variable = _string(raw["api_key_env"], f"{where}.api_key_env")
        api_key = env.get(variable) or api_key
        if api_key is None:
            raise InputError(f"field '{where}.api_key_env': environment variable {variable} is not set")
    if api_key is not None and any(ch in api_key for ch in "\r\n\0"):
        raise InputError(f"field '{where}.api_key' must be one line")
    logs = raw.get("log_paths", ())
    if isinstance(logs, str):
        logs = (logs,)
    if logs is None:
        logs = ()
    if not isinstance(logs, (list, tuple)) or not all(isinstance(p, str) and p.strip() for p in logs):
        raise InputError(f"field '{where}.log_paths' must be a list of file paths")
    for path in logs:
        _string(path, f"{where}.log_paths")
    boot_log = raw.get("boot_log")
    if boot_log is not None:
        boot_log = _string(boot_log, f"{where}.boot_log")
    if raw.get("name") is not None:
        name = _string(raw["name"], f"{where}.name")
    else:
        # host[:port][/path] without any user:password@ (the name is shown everywhere: label, /status, logs)
        name = redact_url(url).split("://", 1)[1].rstrip("/")
    numbers = {}
    for key in _TARGET_NUMBERS:
        if raw.get(key) is not None:
            numbers[key] = config_number(raw[key], f"{where}.{key}", BOUNDS[key])
    if ("state_bytes_per_slot" in numbers) != ("kv_bytes_per_token" in numbers):
        raise InputError(f"fields '{where}.state_bytes_per_slot' and '{where}.kv_bytes_per_token' go together")
    skip_decode_lock = raw.get("skip_decode_lock")
    if skip_decode_lock is not None and not isinstance(skip_decode_lock, bool):
        raise InputError(f"field '{where}.skip_decode_lock' must be true or false, got {shown(skip_decode_lock)}")
    return TargetConfig(
        name=name, url=url.rstrip("/"), api_key=api_key, log_paths=tuple(logs),
        boot_log=boot_log, skip_decode_lock=skip_decode_lock, **numbers,
    )


def config_from_dict(data: dict[str, Any], env: Mapping[str, str] | None = None) -> AdvisorConfig:
    """Validate a config mapping; `env` (default: the process environment) resolves `api_key_env`."""
    if not isinstance(data, dict):
        raise InputError("advisor config must be a mapping")
    check_fields(data, _TOP_FIELDS, "advisor config")
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
    for key in _TOP_NUMBERS:
        if data.get(key) is not None:
            number = config_number(data[key], key, BOUNDS[key])
            values[key] = int(number) if BOUNDS[key].integer else number
    if data.get("listen") is not None:
        values["listen"] = _listen(data["listen"])
    if data.get("checkpoint_path") is not None:
        values["checkpoint_path"] = _string(data["checkpoint_path"], "checkpoint_path")
    return AdvisorConfig(**values)


def check_timing(config: AdvisorConfig) -> AdvisorConfig:
    """A request must end within its cycle: `timeout_seconds` < `interval_seconds`. Checked on the user's
    path (`build_config`: file, environment, flags); harnesses that build configs in code may run tighter."""
    if config.timeout_seconds >= config.interval_seconds:
        raise InputError(
            f"field 'timeout_seconds' ({config.timeout_seconds:g}) must be shorter than "
            f"'interval_seconds' ({config.interval_seconds:g}): a request must end within its cycle"
        )
    return config


def _listen(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"field 'listen' must be HOST:PORT, got {shown(value)}")
    text = str(value)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"field 'listen' must be HOST:PORT, got {shown(value)}")
    return text if host else f"127.0.0.1:{port}"


def load_config(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device never end
            raise InputError(f"advisor config {path} is not a regular file")
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read advisor config {path}: {exc.strerror or exc}") from None
    return parse_config_text(raw, str(path))


def parse_config_text(raw: bytes, source: str = "advisor config") -> dict[str, Any]:
    """The YAML mapping in `raw` (at most MAX_CONFIG_BYTES: PyYAML needs ~70x the text in memory)."""
    data = load_yaml(raw, f"advisor config {source}", MAX_CONFIG_BYTES)  # no aliases: no YAML bomb
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"advisor config {source} must be a mapping at the top level")
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
    config = check_timing(config_from_dict(data, env))
    if not config.targets and not config.store_targets:
        raise InputError("no targets: give --target URL or a config file with 'targets'")
    return config


__all__ = ["AdvisorConfig", "TargetConfig", "build_config", "check_timing", "config_from_dict", "load_config", "replace"]
