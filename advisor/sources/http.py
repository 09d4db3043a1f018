"""A small HTTP client for SGLang's endpoints whose failures are values, not exceptions.

Every call returns a `FetchResult` with a one-line error (connection refused, timeout, HTTP 5xx, a body that
is not JSON, a body too large) so the daemon can count failures and carry on. Each GET has one total deadline
(connect + headers + body) that holds even against a server trickling one byte at a time: every socket read
gets only the time left. Secrets (the API key, a password in the URL) never appear in an error, a repr or a
log line: messages are scrubbed before they are cut to one line.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, unquote, urlencode, urlsplit

from advisor.scrub import redact_secrets, redact_url, scrub_text

DEFAULT_MAX_BODY_BYTES = 64 << 20
_READ_CHUNK = 1 << 16


class DeadlineExceeded(TimeoutError):
    """The request's total deadline passed (raised by the socket reader, caught in `_get`)."""


@dataclass(frozen=True)
class FetchResult:
    """One GET. `body` is the text (get_text) or the decoded JSON (get_json) when it could be read."""

    ok: bool
    status: int | None
    body: str | dict[str, Any] | list[Any] | None
    error: str | None
    elapsed_seconds: float
    url: str = ""  # with any user:password@ removed
    # Something read but not as declared (a charset that cannot decode: read as UTF-8 with replacement).
    warning: str | None = None


@dataclass
class Received:
    """One request's answer as received, not yet decoded (`HttpClient.finish` decodes it): the status line,
    content type and raw body, a problem found while reading it (too large), or the failure to report."""

    url: str  # with any user:password@ removed
    method: str
    want_json: bool
    started: float
    status: int | None = None
    reason: str = ""
    content_type: str = ""
    raw: bytes = b""
    problem: str | None = None
    failure: FetchResult | None = None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


class _DeadlineReader(io.RawIOBase):
    """A socket's read side where every read waits at most until the owning connection's deadline."""

    def __init__(self, owner: _DeadlineSocket, sock: socket.socket, connection: _DeadlineConnection) -> None:
        self._owner = owner
        self._sock = sock
        self._connection = connection

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self._owner.release_reader()
        super().close()

    def readinto(self, buffer: Any) -> int:
        remaining = self._connection.deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded("deadline passed")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)


class _DeadlineSocket:
    """Wraps a connected socket for http.client: sends and reads are bounded by the connection's deadline."""

    def __init__(self, sock: socket.socket, connection: _DeadlineConnection) -> None:
        self._sock = sock
        self._connection = connection
        self._readers = 0  # like socket.makefile: the socket really closes once its readers are closed too
        self._closing = False

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        self._readers += 1
        return io.BufferedReader(_DeadlineReader(self, self._sock, self._connection))

    def release_reader(self) -> None:
        self._readers -= 1
        if self._closing and self._readers <= 0:
            self._sock.close()

    def sendall(self, data: bytes) -> None:
        remaining = self._connection.deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded("deadline passed")
        self._sock.settimeout(remaining)
        self._sock.sendall(data)

    def close(self) -> None:
        self._closing = True
        if self._readers <= 0:
            self._sock.close()

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def fileno(self) -> int:
        return self._sock.fileno()


class _DeadlineConnection(http.client.HTTPConnection):
    """http.client's connection whose socket honours `self.deadline` (time.monotonic()) in every step."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        super().__init__(host, port)
        self.deadline = 0.0
        self._tls = tls

    def connect(self) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded("deadline passed")
        sock = socket.create_connection((self.host, self.port), timeout=remaining)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock.settimeout(max(self.deadline - time.monotonic(), 0.001))
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = _DeadlineSocket(sock, self)  # type: ignore[assignment]


def _describe_os_error(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return "cannot resolve host"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
        return "connection closed by the server"
    if isinstance(exc, ssl.SSLError):
        return "TLS error"
    return f"connection failed ({type(exc).__name__})"


class _Target:
    """A URL split into what a connection needs; credentials stay here and in the Authorization header."""

    def __init__(self, url: str) -> None:
        parts: SplitResult = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("invalid URL")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)  # .port raises ValueError when out of range
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.username = unquote(parts.username) if parts.username is not None else None
        self.password = unquote(parts.password) if parts.password is not None else None

    @property
    def key(self) -> tuple[bool, str, int]:
        return (self.tls, self.host, self.port)


class HttpClient:
    """GETs over one kept-alive connection per host. Proxies and .netrc are never consulted. Thread-safe
    (calls are serialised). `close()` may be called from another thread to abandon a call in progress."""

    def __init__(
        self,
        timeout_seconds: float,
        api_key: str | None = None,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        trust_env: bool = False,
        tls_context: ssl.SSLContext | None = None,
        basic_auth: tuple[str, str] | None = None,
    ) -> None:
        if not timeout_seconds > 0 or timeout_seconds == float("inf"):
            raise ValueError(f"timeout_seconds must be > 0 and finite, got {timeout_seconds}")
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.timeout_seconds = float(timeout_seconds)
        self.max_body_bytes = int(max_body_bytes)
        self._api_key = api_key or None
        self._trust_env = trust_env  # kept for callers; the environment is never read
        self._tls_context = tls_context
        self._connections: dict[tuple[bool, str, int], _DeadlineConnection] = {}
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        self._warnings: list[str] = []  # bodies read other than declared, until `take_warnings`
        if self._api_key:
            self._secrets.add(self._api_key)
        self._basic_token: str | None = None
        if basic_auth is not None:
            user, password = basic_auth
            self._basic_token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            self._secrets.update(s for s in (password, self._basic_token) if s)

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"HttpClient(timeout_seconds={self.timeout_seconds:g}, api_key={key})"

    def close(self) -> None:
        for connection in list(self._connections.values()):
            try:
                if connection.sock is not None:
                    connection.sock.shutdown(socket.SHUT_RDWR)  # wakes a read in progress in another thread
            except OSError:
                pass
            try:
                connection.close()
            except OSError:
                pass
        self._connections.clear()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def get_text(self, url: str) -> FetchResult:
        return self._get(url, want_json=False)

    def get_json(self, url: str) -> FetchResult:
        return self._get(url, want_json=True)

    def post_form_json(self, url: str, form: dict[str, str], *,
                       check_raw: Callable[[bytes], str | None] | None = None) -> FetchResult:
        """POST `form` (application/x-www-form-urlencoded) and read a JSON answer, under the same deadline and
        body cap as a GET. An answer of 400 or more is a failure whose `body` is its text. `check_raw` may
        refuse a successful body before it is decoded (decoding holds the interpreter for its whole length)."""
        payload = urlencode(form).encode("utf-8")
        return self._get(url, want_json=True, method="POST", payload=payload, check_raw=check_raw)

    def scrub(self, message: str) -> str:
        """`message` with every secret this client knows (and anything credential-shaped) replaced; no cut."""
        return redact_secrets(message, self._secrets)

    _scrub = scrub

    def snippet(self, text: str, limit: int) -> str:
        """At most `limit` characters of `text` on one line, secrets scrubbed BEFORE the cut (a cut secret
        would no longer match and half of it would leak): `advisor.scrub.scrub_text` with this client's secrets."""
        return scrub_text(text, limit, self._secrets)

    def take_warnings(self) -> list[str]:
        """The warnings of the GETs since the last call (a charset read as UTF-8), for the caller to count."""
        warnings, self._warnings = self._warnings, []
        return warnings

    def _tls(self) -> ssl.SSLContext:
        if self._tls_context is None:
            self._tls_context = ssl.create_default_context()
        return self._tls_context

    def _connection(self, target: _Target) -> tuple[_DeadlineConnection, bool]:
        existing = self._connections.get(target.key)
        if existing is not None and existing.sock is not None:
            return existing, True
        connection = _DeadlineConnection(target.host, target.port, self._tls() if target.tls else None)
        self._connections[target.key] = connection
        return connection, False

    def _drop(self, target: _Target) -> None:
        connection = self._connections.pop(target.key, None)
        if connection is not None:
            connection.close()

    def _headers(self, target: _Target, want_json: bool) -> dict[str, str]:
        headers = {
            "Accept": "application/json" if want_json else "text/plain, */*;q=0.5",
            "Accept-Encoding": "identity",
            "User-Agent": "sglang-pool-advisor",
        }
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        elif self._basic_token is not None:
            headers["Authorization"] = f"Basic {self._basic_token}"
        elif target.username is not None:
            pair = f"{target.username}:{target.password or ''}".encode()
            token = base64.b64encode(pair).decode("ascii")
            self._secrets.add(token)
            headers["Authorization"] = f"Basic {token}"
        return headers

    def _get(self, url: str, *, want_json: bool, method: str = "GET", payload: bytes | None = None,
             check_raw: Callable[[bytes], str | None] | None = None) -> FetchResult:
        return self.finish(self._receive(url, want_json=want_json, method=method, payload=payload), check_raw)

    def receive_form_json(self, url: str, form: dict[str, str]) -> Received:
        """`post_form_json`'s request and raw answer only (no decoding: another thread may wait on the
        socket while the caller decodes an earlier answer); `finish` decodes it."""
        return self._receive(url, want_json=True, method="POST", payload=urlencode(form).encode("utf-8"))

    def _receive(self, url: str, *, want_json: bool, method: str = "GET", payload: bytes | None = None) -> Received:
        received = Received(url=redact_url(url), method=method, want_json=want_json, started=time.monotonic())
        try:
            target = _Target(url)
        except ValueError:
            received.failure = self._failed(received, "invalid URL")
            return received
        if target.password:
            self._secrets.add(target.password)
        with self._lock:
            try:
                (received.status, received.reason, received.content_type, received.raw,
                 received.problem) = self._exchange(target, want_json, received.started, method, payload)
            except TimeoutError:  # DeadlineExceeded, or a socket timeout within the remaining time
                self._drop(target)
                received.failure = self._failed(received, f"timed out after {self.timeout_seconds:g}s")
            except http.client.HTTPException as exc:
                self._drop(target)
                if isinstance(exc, http.client.RemoteDisconnected):
                    received.failure = self._failed(received, "connection closed by the server")
                else:
                    received.failure = self._failed(received, f"malformed HTTP response ({type(exc).__name__})")
            except OSError as exc:
                self._drop(target)
                received.failure = self._failed(received, _describe_os_error(exc))
            except (ValueError, UnicodeError) as exc:  # a header value http.client refuses, a bad host
                self._drop(target)
                received.failure = self._failed(received, f"request failed ({type(exc).__name__})")
        return received

    def _failed(self, received: Received, message: str, status: int | None = None,
                body: str | None = None) -> FetchResult:
        return FetchResult(
            ok=False,
            status=status,
            body=body,
            error=self.snippet(f"{received.method} {received.url}: {message}", 400),
            elapsed_seconds=time.monotonic() - received.started,
            url=received.url,
        )

    def finish(self, received: Received, check_raw: Callable[[bytes], str | None] | None = None,
               scan: Callable[[str], Any] | None = None) -> FetchResult:
        """A received answer read: its text, or its JSON decoded (`check_raw` may refuse a successful body
        before it is decoded, since decoding holds the interpreter for its whole length; `scan` may read a
        successful body's text in a known layout instead, its None leaving it to the JSON decoder)."""
        if received.failure is not None:
            return received.failure
        status, shown, method, started = received.status or 0, received.url, received.method, received.started
        raw, problem = received.raw, received.problem
        received.raw = b""  # the caller's object no longer holds the bytes once they are decoded
        if problem is None and check_raw is not None and status < 400:
            problem = check_raw(raw)
        if problem is not None:
            return self._failed(received, problem, status=status)
        text, warning = decode_body(raw, received.content_type)
        del raw
        if warning is not None:
            warning = f"{method} {shown}: {warning}"
            with self._lock:
                self._warnings = [*self._warnings[-9:], warning]
        if status >= 400:
            snippet = self.snippet(text, 120)
            detail = f"HTTP {status} {received.reason}".rstrip() + (f": {snippet}" if snippet else "")
            return self._failed(received, detail, status=status, body=text)
        if not received.want_json:
            return FetchResult(True, status, text, None, time.monotonic() - started, shown, warning)
        scanned = scan(text) if scan is not None else None
        if scanned is not None:
            return FetchResult(True, status, scanned, None, time.monotonic() - started, shown, warning)
        try:
            decoded = json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            return self._failed(received, "JSON response nested too deeply", status=status, body=None)
        except ValueError:
            return self._failed(received, f"response is not JSON: {self.snippet(text, 80)!r}", status=status,
                                body=text)
        if not isinstance(decoded, (dict, list)):
            return self._failed(
                received, f"JSON response is a {type(decoded).__name__}, not an object", status=status, body=text
            )
        return FetchResult(True, status, decoded, None, time.monotonic() - started, shown, warning)

    def _exchange(
        self, target: _Target, want_json: bool, started: float, method: str = "GET", payload: bytes | None = None
    ) -> tuple[int, str, str, bytes, str | None]:
        """One request/response on a (possibly kept-alive) connection: status, reason, content type, body,
        and a problem (body too large) or None. A reused connection the server closed is retried once."""
        headers = self._headers(target, want_json)
        if payload is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        for attempt in (0, 1):
            connection, reused = self._connection(target)
            connection.deadline = started + self.timeout_seconds
            try:
                connection.request(method, target.path, body=payload, headers=headers)
                response = connection.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._drop(target)
                if reused and attempt == 0:
                    continue
                raise
            raw, problem = self._read_body(response)
            if problem is not None or response.will_close:
                self._drop(target)
            return response.status, response.reason or "", response.getheader("Content-Type", ""), raw, problem
        raise http.client.RemoteDisconnected("connection closed")  # not reached: the loop returns or raises

    def _read_body(self, response: http.client.HTTPResponse) -> tuple[bytes, str | None]:
        """The body, or a problem when it exceeds the size cap (the deadline is enforced by the socket)."""
        declared = response.getheader("Content-Length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.max_body_bytes:
            return b"", f"body larger than {self.max_body_bytes} bytes"
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = response.read(_READ_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > self.max_body_bytes:
                return b"", f"body larger than {self.max_body_bytes} bytes"
            chunks.append(chunk)
        return b"".join(chunks), None


# Charsets a server may declare that are read as declared; any other is read as UTF-8 (with replacement) and
# reported: codecs such as idna or punycode raise on ordinary bytes even with errors="replace".
TEXT_CHARSETS = frozenset({"utf-8", "utf8", "us-ascii", "ascii", "iso-8859-1", "latin-1", "latin1", "windows-1252",
                           "cp1252", "utf-16", "utf-16-le", "utf-16-be", "utf-32"})


def decode_body(raw: bytes, content_type: str) -> tuple[str, str | None]:
    """The body as text per its declared charset, else UTF-8 with replacement and a warning naming the charset."""
    declared = _charset(content_type)
    if declared is None:
        return raw.decode("utf-8", errors="replace"), None
    if declared.lower() in TEXT_CHARSETS:
        try:
            return raw.decode(declared, errors="replace"), None
        except (LookupError, UnicodeError):
            pass
    shown = scrub_text(declared, 40)
    return raw.decode("utf-8", errors="replace"), f"charset {shown!r} not supported; read as UTF-8"


def _charset(content_type: str) -> str | None:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            return value.strip().strip('"')
    return None
