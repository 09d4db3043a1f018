"""A small HTTP client for SGLang's endpoints whose failures are values, not exceptions.

Every call returns a `FetchResult` with a one-line error (connection refused, timeout, HTTP 5xx, a body that
is not JSON, a body too large) so the daemon can count failures and carry on. The API key travels only in
the `Authorization: Bearer` header; it never appears in an error, a repr or a log line.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

DEFAULT_MAX_BODY_BYTES = 64 << 20


@dataclass(frozen=True)
class FetchResult:
    """One GET. `body` is the text (get_text) or the decoded JSON (get_json) when it could be read."""

    ok: bool
    status: int | None
    body: str | dict[str, Any] | list[Any] | None
    error: str | None
    elapsed_seconds: float
    url: str = ""  # with any user:password@ removed


def redact_url(url: str) -> str:
    """The URL without credentials in its authority part (`http://user:pw@host` -> `http://host`)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid url>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def _one_line(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _describe_connection_error(exc: requests.exceptions.ConnectionError) -> str:
    text = str(exc)
    lowered = text.lower()
    if "refused" in lowered:
        return "connection refused"
    if (
        "name or service not known" in lowered
        or "nodename nor servname" in lowered
        or "getaddrinfo" in lowered
    ):
        return "cannot resolve host"
    if "remotedisconnected" in lowered or "connection aborted" in lowered or "reset by peer" in lowered:
        return "connection closed by the server"
    if "ssl" in lowered:
        return "TLS error"
    return f"connection failed ({type(exc).__name__})"


class HttpClient:
    """GETs over one pooled `requests.Session`. Proxies and .netrc from the environment are ignored
    unless `trust_env=True` (a .netrc entry would otherwise replace our Authorization header)."""

    def __init__(
        self,
        timeout_seconds: float,
        api_key: str | None = None,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        trust_env: bool = False,
    ) -> None:
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds}")
        self.timeout_seconds = float(timeout_seconds)
        self.max_body_bytes = int(max_body_bytes)
        self._api_key = api_key or None
        self._session = requests.Session()
        self._session.trust_env = trust_env

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"HttpClient(timeout_seconds={self.timeout_seconds:g}, api_key={key})"

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def get_text(self, url: str) -> FetchResult:
        return self._get(url, want_json=False)

    def get_json(self, url: str) -> FetchResult:
        return self._get(url, want_json=True)

    def _scrub(self, message: str) -> str:
        if self._api_key and self._api_key in message:
            message = message.replace(self._api_key, "<redacted>")
        return message

    def _get(self, url: str, *, want_json: bool) -> FetchResult:
        shown = redact_url(url)
        started = time.monotonic()

        def failed(message: str, status: int | None = None, body: str | None = None) -> FetchResult:
            return FetchResult(
                ok=False,
                status=status,
                body=body,
                error=self._scrub(f"GET {shown}: {message}"),
                elapsed_seconds=time.monotonic() - started,
                url=shown,
            )

        headers = {"Accept": "application/json" if want_json else "text/plain, */*;q=0.5"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            response = self._session.get(url, headers=headers, timeout=self.timeout_seconds, stream=True)
        except requests.exceptions.Timeout:
            return failed(f"timed out after {self.timeout_seconds:g}s")
        except requests.exceptions.ConnectionError as exc:
            return failed(_describe_connection_error(exc))
        except (
            requests.exceptions.InvalidURL,
            requests.exceptions.MissingSchema,
            requests.exceptions.InvalidSchema,
        ):
            return failed("invalid URL")
        except requests.exceptions.RequestException as exc:
            return failed(f"request failed ({type(exc).__name__})")
        try:
            raw, problem = self._read_body(response, started)
        finally:
            response.close()
        if problem is not None:
            return failed(problem, status=response.status_code)
        text = raw.decode(response.encoding or "utf-8", errors="replace")
        status = response.status_code
        if status >= 400:
            reason = response.reason or ""
            snippet = _one_line(text, 120)
            detail = f"HTTP {status} {reason}".rstrip() + (f": {snippet}" if snippet else "")
            return failed(detail, status=status, body=text)
        if not want_json:
            return FetchResult(True, status, text, None, time.monotonic() - started, shown)
        try:
            decoded = json.loads(text)
        except ValueError:
            return failed(f"response is not JSON: {_one_line(text, 80)!r}", status=status, body=text)
        if not isinstance(decoded, (dict, list)):
            return failed(
                f"JSON response is a {type(decoded).__name__}, not an object", status=status, body=text
            )
        return FetchResult(True, status, decoded, None, time.monotonic() - started, shown)

    def _read_body(self, response: requests.Response, started: float) -> tuple[bytes, str | None]:
        """The body, or an error when it exceeds the size cap or the whole read the timeout."""
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.iter_content(chunk_size=1 << 16):
                size += len(chunk)
                if size > self.max_body_bytes:
                    return b"", f"body larger than {self.max_body_bytes} bytes"
                if time.monotonic() - started > self.timeout_seconds:
                    return b"", f"timed out after {self.timeout_seconds:g}s reading the body"
                chunks.append(chunk)
        except requests.exceptions.Timeout:
            return b"", f"timed out after {self.timeout_seconds:g}s reading the body"
        except requests.exceptions.RequestException as exc:
            return b"", f"body read failed ({type(exc).__name__})"
        return b"".join(chunks), None
