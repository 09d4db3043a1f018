"""A client of the Prometheus HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics): instant and range queries
with bearer or basic auth and a TLS CA. Failures are values (`QueryResult.error`, one line, credentials never
shown), like `advisor.sources.http.FetchResult`, so the daemon can count them and carry on.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from advisor.errors import InputError
from advisor.sources.http import redact_url

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")


def _one_line(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _connection_error(exc: requests.exceptions.ConnectionError) -> str:
    lowered = str(exc).lower()
    if "refused" in lowered:
        return "connection refused"
    if "name or service not known" in lowered or "getaddrinfo" in lowered or "nodename nor servname" in lowered:
        return "cannot resolve host"
    if "reset by peer" in lowered or "aborted" in lowered or "remotedisconnected" in lowered:
        return "connection closed by the server"
    return f"connection failed ({type(exc).__name__})"


def parse_duration(text: str, what: str = "duration") -> float:
    """Prometheus-style durations ('90s', '15m', '7d', '1h30m', or plain seconds) to seconds; InputError else."""
    raw = str(text).strip()
    try:
        value = float(raw)
    except ValueError:
        parts = _DURATION.findall(raw)
        value = sum(float(n) * _DURATION_UNITS[u] for n, u in parts) if "".join(n + u for n, u in parts) == raw else -1.0
    if not value > 0:
        raise InputError(f"{what} {text!r} is not a positive duration like 90s, 15m, 6h or 7d")
    return value


def selector_matchers(selector: str | None) -> str:
    """The matchers inside a series selector `{job="sglang", env="prod"}` ('' for none), checked for shape."""
    if selector is None:
        return ""
    text = selector.strip()
    if not text:
        return ""
    if not (text.startswith("{") and text.endswith("}")):
        raise InputError(f"selector {selector!r} must be label matchers in braces, like '{{job=\"sglang\"}}'")
    inner = text[1:-1].strip().rstrip(",").strip()
    if "{" in inner or "}" in inner or (inner and "=" not in inner and "~" not in inner):
        raise InputError(f"selector {selector!r} is not a list of label matchers")
    return inner


@dataclass(frozen=True)
class PromSeries:
    """One result series: its labels and its samples [(unix seconds, value)] (one sample for an instant query)."""

    labels: dict[str, str]
    samples: list[tuple[float, float]]


@dataclass(frozen=True)
class QueryResult:
    ok: bool
    series: list[PromSeries] = field(default_factory=list)
    error: str | None = None
    elapsed_seconds: float = 0.0
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class StoreAuth:
    """How to reach the store: a bearer token, or basic auth, and a CA bundle for TLS (None: the system's)."""

    bearer_token: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if self.bearer_token and (self.username or self.password):
            raise InputError("give a bearer token or basic auth for the Prometheus store, not both")
        if (self.password is not None) and not self.username:
            raise InputError("basic auth for the Prometheus store needs a username with the password")


class PrometheusClient:
    """Queries over one pooled session. Long queries go as POST form bodies (the API accepts both)."""

    def __init__(self, base_url: str, *, timeout_seconds: float = 30.0, auth: StoreAuth | None = None,
                 trust_env: bool = False) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InputError(f"Prometheus URL must be http(s)://…, got {redact_url(base_url)!r}")
        if not timeout_seconds > 0:
            raise InputError(f"timeout must be > 0, got {timeout_seconds}")
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = float(timeout_seconds)
        self.auth = auth or StoreAuth()
        self.queries_sent = 0
        self._session = requests.Session()
        self._session.trust_env = trust_env
        if self.auth.username:
            self._session.auth = (self.auth.username, self.auth.password or "")
        if self.auth.bearer_token:
            self._session.headers["Authorization"] = f"Bearer {self.auth.bearer_token}"
        if self.auth.ca_file:
            self._session.verify = self.auth.ca_file
        self._secrets = [s for s in (self.auth.bearer_token, self.auth.password) if s]

    def __repr__(self) -> str:
        return f"PrometheusClient({redact_url(self.base_url)!r}, timeout_seconds={self.timeout_seconds:g})"

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def query(self, expr: str, at: float | None = None) -> QueryResult:
        """An instant query (`/api/v1/query`), evaluated at `at` (unix seconds) or the store's now."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._post("query", params)

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
        """A range query (`/api/v1/query_range`): one sample per `step` seconds from start to end."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._post("query_range", params)

    def _scrub(self, message: str) -> str:
        for secret in self._secrets:
            message = message.replace(secret, "<redacted>")
        return message

    def _post(self, endpoint: str, params: dict[str, str]) -> QueryResult:
        url = f"{self.base_url}/api/v1/{endpoint}"
        shown = redact_url(url)
        started = time.monotonic()
        self.queries_sent += 1

        def failed(message: str) -> QueryResult:
            return QueryResult(False, error=self._scrub(f"POST {shown}: {message}"),
                               elapsed_seconds=time.monotonic() - started)

        try:
            response = self._session.post(url, data=params, timeout=self.timeout_seconds,
                                          headers={"Accept": "application/json"})
        except requests.exceptions.Timeout:
            return failed(f"timed out after {self.timeout_seconds:g}s")
        except requests.exceptions.SSLError:
            return failed("TLS error (is the CA file right?)")
        except requests.exceptions.ConnectionError as exc:
            return failed(_connection_error(exc))
        except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema):
            return failed("invalid URL")
        except requests.exceptions.RequestException as exc:
            return failed(f"request failed ({type(exc).__name__})")
        try:
            body = response.json()
        except ValueError:
            if response.status_code >= 400:
                return failed(f"HTTP {response.status_code} {response.reason or ''}: {_one_line(response.text, 120)}".rstrip(": "))
            return failed(f"response is not JSON: {_one_line(response.text, 80)!r}")
        finally:
            response.close()
        if not isinstance(body, dict):
            return failed("response is not a JSON object")
        if body.get("status") != "success":
            kind = body.get("errorType") or f"HTTP {response.status_code}"
            return failed(f"{kind}: {_one_line(str(body.get('error') or 'no error message'), 200)}")
        try:
            series = _series_of(body.get("data"))
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            return failed(f"malformed result ({type(exc).__name__}: {_one_line(str(exc), 80)})")
        warnings = tuple(str(w) for w in body.get("warnings") or ())
        return QueryResult(True, series, None, time.monotonic() - started, warnings)


def _series_of(data: Any) -> list[PromSeries]:
    """The API's `data` ({resultType, result}) as series; scalars become one label-less series."""
    kind = data["resultType"]
    result = data["result"]
    if kind == "vector":
        return [PromSeries(item["metric"], [(float(item["value"][0]), float(item["value"][1]))]) for item in result]
    if kind == "matrix":
        return [PromSeries(item["metric"], [(float(t), float(v)) for t, v in item["values"]]) for item in result]
    if kind == "scalar":
        return [PromSeries({}, [(float(result[0]), float(result[1]))])]
    raise ValueError(f"result type {kind!r} is not a vector, matrix or scalar")


__all__ = ["PromSeries", "PrometheusClient", "QueryResult", "StoreAuth", "parse_duration", "selector_matchers"]
