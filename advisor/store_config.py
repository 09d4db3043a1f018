"""The config of a `kind: prometheus` target: one Prometheus-API store (Prometheus, Thanos, Mimir,
VictoriaMetrics) standing for every SGLang server its selector matches. Validated like the rest of the
daemon config (`advisor.config`), with the same bounds and hints (`advisor.validate`): a typo or a bad value
is an InputError naming the field.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from advisor.errors import InputError
from advisor.sources.fleet_queries import DEFAULT_SERVER_LABELS
from advisor.sources.http import redact_url
from advisor.sources.prometheus_store import (
    MAX_SERVERS_PER_STORE as DEFAULT_MAX_SERVERS_PER_STORE,
)
from advisor.sources.prometheus_store import StoreAuth, parse_duration, selector_matchers
from advisor.validate import BOUNDS, check_fields, config_number, shown

DEFAULT_HISTORY_SECONDS = 6 * 3600.0  # six half-lives of the default estimator: older history weighs < 2%
DEFAULT_SERVER_INFO_URL = "http://{instance}"


@dataclass(frozen=True)
class StoreShard:
    """This advisor's share of the store's servers: those whose server labels hash to `index` of `total`
    (`advisor.sources.fleet_queries.shard_of`, Prometheus' `hashmod`)."""

    index: int
    total: int


@dataclass(frozen=True)
class StoreTargetConfig:
    url: str
    name: str = ""
    selector: str = ""
    server_labels: tuple[str, ...] = DEFAULT_SERVER_LABELS
    history_seconds: float = DEFAULT_HISTORY_SECONDS
    step_seconds: float | None = None
    # Where a server's /server_info lives, from its labels; "" reads the byte constants from the pool gauges.
    server_info_url: str = DEFAULT_SERVER_INFO_URL
    server_api_key: str | None = field(default=None, repr=False)
    # No gauge carries --mamba-full-memory-ratio: the gauge-only path assumes this one (SGLang's fallback).
    assumed_ratio: float = 0.9
    auth: StoreAuth = field(default_factory=StoreAuth)
    timeout_seconds: float = 30.0
    forget_after_seconds: float = 600.0
    shard: StoreShard | None = None  # None: every server the selector matches
    # Servers this target may hold (each gets its own state); the store client's answer caps scale with it.
    max_servers_per_store: int = DEFAULT_MAX_SERVERS_PER_STORE

    @property
    def matchers(self) -> str:
        return selector_matchers(self.selector)

    def server_info_base(self, labels: Mapping[str, str]) -> str:
        """The server's base URL from the template, or '' when /server_info is not to be asked."""
        if not self.server_info_url:
            return ""
        return self.server_info_url.format_map({k: labels.get(k, "") for k in self.server_labels}).rstrip("/")


_KEYS = {f.name for f in fields(StoreTargetConfig)} - {"auth"} | {
    "kind", "history", "step", "bearer_token", "bearer_token_env", "username", "password", "password_env",
    "ca_file", "server_api_key_env",
}


def _secret(raw: Mapping[str, Any], key: str, env: Mapping[str, str], where: str) -> str | None:
    value = raw.get(key)
    env_name = raw.get(f"{key}_env")
    if env_name:
        value = env.get(str(env_name)) or value
        if value is None:
            raise InputError(f"field '{where}.{key}_env': environment variable {env_name} is not set")
    return None if value is None else str(value)


def _shard(raw: Any, where: str) -> StoreShard | None:
    """`shard: {index: i, total: n}`, 0 <= i < n, validated; None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InputError(f"field '{where}.shard' must be a mapping like {{index: 0, total: 2}}, got {shown(raw)}")
    check_fields(dict(raw), ("index", "total"), f"{where}.shard")
    for key in ("index", "total"):
        if key not in raw:
            raise InputError(f"field '{where}.shard.{key}' is missing (shard: {{index: 0, total: 2}})")
    total = int(config_number(raw["total"], f"{where}.shard.total", BOUNDS["shard_total"]))
    index = int(config_number(raw["index"], f"{where}.shard.index", BOUNDS["shard_index"]))
    if index >= total:
        raise InputError(f"field '{where}.shard.index' must be < shard.total ({total}), got {index}")
    return StoreShard(index=index, total=total)


def store_target_from_dict(raw: Mapping[str, Any], where: str, env: Mapping[str, str]) -> StoreTargetConfig:
    """A `kind: prometheus` target mapping, validated."""
    check_fields(dict(raw), _KEYS, where)
    url = raw.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InputError(f"field '{where}.url' must be the store's http(s) URL, got {redact_url(str(url))!r}")
    values: dict[str, Any] = {"url": url.rstrip("/")}
    # the name is shown everywhere (label, /status, logs): never with the URL's user:password@
    values["name"] = str(raw.get("name") or redact_url(url).split("://", 1)[1].rstrip("/"))
    selector = raw.get("selector") or ""
    try:
        selector_matchers(str(selector))
    except InputError as exc:
        raise InputError(f"field '{where}.selector': {exc}") from None
    values["selector"] = str(selector)
    labels = raw.get("server_labels", DEFAULT_SERVER_LABELS)
    if isinstance(labels, str):
        labels = (labels,)
    if not labels or not all(isinstance(x, str) and x.isidentifier() for x in labels):
        raise InputError(f"field '{where}.server_labels' must be a list of label names, got {labels!r}")
    values["server_labels"] = tuple(labels)
    for key, target in (("history", "history_seconds"), ("step", "step_seconds"),
                        ("forget_after_seconds", "forget_after_seconds"), ("timeout_seconds", "timeout_seconds")):
        if raw.get(key) is not None:
            values[target] = parse_duration(str(raw[key]), f"field '{where}.{key}'")
    if "timeout_seconds" in values:
        config_number(values["timeout_seconds"], f"{where}.timeout_seconds", BOUNDS["timeout_seconds"])
    template = raw.get("server_info_url", DEFAULT_SERVER_INFO_URL)
    template = "" if template is None else str(template)
    if template:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name}
        unknown = names - set(values["server_labels"])
        if unknown or not template.startswith(("http://", "https://")):
            raise InputError(
                f"field '{where}.server_info_url' must be an http(s) URL whose {{placeholders}} are among "
                f"server_labels {list(values['server_labels'])}, got {template!r}"
            )
    values["server_info_url"] = template
    values["server_api_key"] = _secret(raw, "server_api_key", env, where)
    if raw.get("assumed_ratio") is not None:
        values["assumed_ratio"] = config_number(raw["assumed_ratio"], f"{where}.assumed_ratio", BOUNDS["assumed_ratio"])
    values["shard"] = _shard(raw.get("shard"), where)
    if raw.get("max_servers_per_store") is not None:
        values["max_servers_per_store"] = int(config_number(raw["max_servers_per_store"], f"{where}.max_servers_per_store",
                                                            BOUNDS["max_servers_per_store"]))
    ca_file = raw.get("ca_file")
    values["auth"] = StoreAuth(
        bearer_token=_secret(raw, "bearer_token", env, where),
        username=None if raw.get("username") is None else str(raw["username"]),
        password=_secret(raw, "password", env, where),
        ca_file=None if ca_file is None else str(ca_file),
    )
    return StoreTargetConfig(**values)


__all__ = ["DEFAULT_HISTORY_SECONDS", "StoreShard", "StoreTargetConfig", "store_target_from_dict"]
