"""export.server: a small threaded HTTP(S) server over a SnapshotStore — /metrics for Prometheus
(prometheus_client's own exposition: gzip, OpenMetrics negotiation, name[] filtering), / as a landing page
with server-side SVG charts, /status as JSON with the reasoning, /healthz for probes. Serving only reads
the last snapshot; slow, trickling or vanishing clients cost a descriptor until their head deadline and a
debug line, never a thread or a traceback (`_AdvisorHTTPServer`)."""

from __future__ import annotations

import html
import io
import json
import logging
import math
import queue
import resource
import selectors
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from socketserver import _SocketWriter  # type: ignore[attr-defined]
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from prometheus_client.registry import CollectorRegistry

from advisor import __version__
from advisor.errors import InputError
from advisor.export.collector import build_registry
from advisor.export.exposition import MetricsRenderer, bake_registry
from advisor.export.snapshot import SnapshotStore
from advisor.export.svg import concurrency_chart, context_chart, goodput_chart, history_chart
from advisor.export.times import utc_with_age
from advisor.export.webconfig import WebConfig
from advisor.json_output import finite_or_none
from advisor.status import TargetStatus

log = logging.getLogger(__name__)

# A suggestion for the daemon's default; any free port works (0 = ephemeral, for tests).
DEFAULT_EXPORTER_PORT = 9415
# The listen backlog (socketserver's default of 5 dropped 60 of 200 concurrent scrapes) and how long one
# connection may take for each write of its answer.
LISTEN_BACKLOG = 1024
CONNECTION_TIMEOUT_SECONDS = 10.0
# How long a client may take for its TLS handshake and whole request head, however it trickles it.
HEADER_TIMEOUT_SECONDS = 5.0
# Connections held at once (reading heads, queued, being answered); also capped at half the descriptor limit.
DEFAULT_MAX_CONNECTIONS = 512
# Threads answering /metrics, / and /status (answers come from the cached snapshot: each takes milliseconds).
DEFAULT_WORKERS = 4
MAX_REQUEST_HEAD_BYTES = 16 << 10
# The landing page draws charts for this many servers at most (the ones furthest from their recommendation).
CHARTED_SERVERS = 12


def status_document(store: SnapshotStore) -> dict[str, Any]:
    """The /status body: when the snapshot was computed and every target with its reasoning."""
    snapshot = store.snapshot()
    return finite_or_none(
        {
            "generated_at": snapshot.generated_at,
            "advisor_version": __version__,
            "targets": [status.to_dict() for status in snapshot.targets],
        }
    )


def _format_ratio(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.3g}"


def _landing_row(status: TargetStatus) -> str:
    rec = status.recommendation
    cells = [
        status.server,
        status.model_name or "–",
        "up" if status.up else "down",
        rec.decision if rec else "–",
        _format_ratio(rec.ratio) if rec else "–",
        f"{_format_ratio(rec.ratio_lower)} – {_format_ratio(rec.ratio_upper)}" if rec else "–",
        _format_ratio(rec.live_ratio) if rec else "–",
        f"{rec.binding_pool_live or '–'} → {rec.binding_pool_recommended or '–'}" if rec else "–",
        f"{rec.confidence:.2f}" if rec else "–",
        (rec.flag_line or "") if rec else "",
    ]
    link = f'<td><a href="/?server={quote(status.server, safe="")}">{html.escape(status.server)}</a></td>'
    return "<tr>" + link + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in cells[1:]) + "</tr>"


def _charted(targets: list[TargetStatus], server: str | None) -> list[TargetStatus]:
    """Whose charts the page draws: the one asked for, else the CHARTED_SERVERS furthest from their
    recommendation (a fleet of a thousand gets its table, not three thousand charts)."""
    if server is not None:
        return [status for status in targets if status.server == server]

    def drift(status: TargetStatus) -> float:
        value = status.recommendation.ratio_drift if status.recommendation else None
        return abs(value) if value is not None and math.isfinite(value) else -1.0

    return sorted(targets, key=drift, reverse=True)[:CHARTED_SERVERS]


def _server_section(store: SnapshotStore, status: TargetStatus, index: int, now: float) -> str:
    rec = status.recommendation
    history = store.history(status.server)
    charts = [
        concurrency_chart(store.model(status.server), rec, status.workload, chart_id=f"concurrency-{index}"),
        goodput_chart(rec, chart_id=f"goodput-{index}"),
        context_chart(store.context_weights(status.server), status.workload, chart_id=f"context-{index}"),
        history_chart(history, chart_id=f"history-{index}"),
    ]
    reason = html.escape(rec.reason) if rec else "no recommendation yet"
    times = [f"last successful cycle {utc_with_age(status.last_success_timestamp, now)}"]
    if history:
        times.append(f"the history chart ends at {utc_with_age(history[-1].time, now)}")
    if status.last_restart_timestamp is not None:
        times.append(f"SGLang restart seen {utc_with_age(status.last_restart_timestamp, now)}")
    return (f'<section id="server-{index}"><h2>{html.escape(status.server)}</h2><p>{reason}</p>\n'
            f'<p>{html.escape("; ".join(times))}</p>\n'
            f'<div class="charts">{"".join(charts)}</div></section>')


def landing_page(store: SnapshotStore, server: str | None = None, now: float | None = None) -> str:
    """An HTML page: per server the decision, recommended vs live ratio and binding pool, then charts for
    `server` (or the servers furthest from their recommendation). Times are UTC dates with their age at `now`
    (default: the clock)."""
    now = time.time() if now is None else now
    snapshot = store.snapshot()
    targets = sorted(snapshot.targets, key=lambda s: s.server)
    if targets:
        rows = "\n".join(_landing_row(status) for status in targets)
    else:
        rows = '<tr><td colspan="10">no cycle has completed yet</td></tr>'
    charted = _charted(targets, server)
    sections = "\n".join(_server_section(store, status, index, now) for index, status in enumerate(charted))
    if server is not None and not charted:
        sections = f"<p>no server {html.escape(server)} in the last snapshot</p>"
    elif len(charted) < len(targets):
        sections = (f"<p>charts for the {len(charted)} servers furthest from their recommendation; "
                    f"click a server for its own.</p>\n" + sections)
    generated = utc_with_age(snapshot.generated_at, now)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>SGLang pool advisor</title>
<style>body{{font-family:"DejaVu Sans",sans-serif;margin:16px}} table{{border-collapse:collapse}}
td,th{{padding:3px 6px}} .charts{{display:flex;flex-wrap:wrap;gap:12px}} svg{{border:1px solid #ddd}}</style></head>
<body>
<h1>SGLang pool advisor {html.escape(__version__)}</h1>
<p>Last snapshot: {generated}. <a href="/metrics">/metrics</a> · <a href="/status">/status</a> (JSON with the reasoning)
· <a href="/healthz">/healthz</a></p>
<table border="1" cellpadding="4">
<tr><th>server</th><th>model</th><th>target</th><th>decision</th><th>recommended ratio</th><th>band</th>
<th>live ratio</th><th>binding pool (live → recommended)</th><th>confidence</th><th>flags</th></tr>
{rows}
</table>
{sections}
</body></html>
"""


class _Handler(BaseHTTPRequestHandler):
    """One request whose head the listener already read (`head`); HTTP/1.0, so the connection then closes."""

    server: _AdvisorHTTPServer  # type: ignore[assignment]
    server_version = f"sglang-pool-advisor/{__version__}"

    def __init__(self, request: Any, client_address: Any, server: _AdvisorHTTPServer, head: bytes) -> None:
        self._head = head
        super().__init__(request, client_address, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self._head)  # type: ignore[assignment]
        self.wfile = _SocketWriter(self.request)  # type: ignore[assignment]

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._respond(send_body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._respond(send_body=False)

    def _respond(self, send_body: bool) -> None:
        url = urlsplit(self.path)
        path = url.path
        headers: list[tuple[str, str]] = []
        try:
            if path != "/healthz" and not self.server.web_config.authorized(self.headers.get("Authorization")):
                status, content_type, body = 401, "text/plain; charset=utf-8", b"Unauthorized\n"
                headers.append(("WWW-Authenticate", 'Basic realm="sglang-pool-advisor"'))
            elif path == "/metrics":
                accept, encoding = self.headers.get("Accept", ""), self.headers.get("Accept-Encoding", "")
                if self.server.renderer is not None:
                    baked_headers, body = self.server.renderer.render(accept, encoding, parse_qs(url.query))
                else:
                    baked_headers, body = bake_registry(self.server.registry, accept, encoding, parse_qs(url.query))
                status = 200
                content_type = dict(baked_headers)["Content-Type"]
                headers.extend((name, value) for name, value in baked_headers if name != "Content-Type")
            elif path == "/healthz":
                status, content_type, body = self._health()
            elif path == "/status":
                document = json.dumps(status_document(self.server.store), indent=1, allow_nan=False)
                status, content_type, body = 200, "application/json", document.encode()
            elif path in ("/", "/index.html"):
                status, content_type = 200, "text/html; charset=utf-8"
                chosen = parse_qs(url.query).get("server")
                body = landing_page(self.server.store, chosen[0] if chosen else None).encode()
            else:
                status, content_type, body = 404, "text/plain; charset=utf-8", b"not found: try /metrics\n"
        except Exception as exc:  # a bad snapshot must not kill the server thread
            log.warning("error serving %s: %s: %s", path, type(exc).__name__, exc)
            log.debug("error serving %s", path, exc_info=True)
            status, content_type = 500, "text/plain; charset=utf-8"
            body = f"internal error: {type(exc).__name__}: {exc}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _health(self) -> tuple[int, str, bytes]:
        return _health(self.server.store, self.server.healthz_stale_after)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (signature of the base class)
        log.debug("%s - %s", self.address_string(), format % args)


# What a client that goes away or stalls raises: one debug line each, not a traceback on stderr.
_CLIENT_GONE = (ConnectionError, TimeoutError, ssl.SSLError)


class _Pending:
    """A connection still sending its request head: its socket, the bytes so far, when it was accepted."""

    __slots__ = ("sock", "address", "data", "accepted", "handshaken")

    def __init__(self, sock: socket.socket, address: Any, accepted: float, handshaken: bool) -> None:
        self.sock = sock
        self.address = address
        self.data = bytearray()
        self.accepted = accepted
        self.handshaken = handshaken


class _AdvisorHTTPServer:
    """The exporter's listener. One thread (`serve_forever`) accepts connections and reads every request head
    without blocking, under one deadline per connection (`header_timeout`: a client trickling a byte at a time
    is cut off when it passes, however often it sends). At most `max_connections` connections are held; a new
    one beyond that displaces the oldest that has not finished its head. /healthz is answered on that thread at
    once; other requests go to a few worker threads (`workers`), so thousands of slow clients cost file
    descriptors and buffers, never threads, and never delay a probe. Nothing here is shared with the cycles."""

    def __init__(self, address: tuple[str, int], store: SnapshotStore, registry: CollectorRegistry,
                 web_config: WebConfig, connection_timeout: float, healthz_stale_after: float | None,
                 renderer: MetricsRenderer | None = None, *, header_timeout: float | None = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, workers: int = DEFAULT_WORKERS) -> None:
        self.store = store
        self.registry = registry
        self.renderer = renderer
        self.web_config = web_config
        self.connection_timeout = connection_timeout
        self.header_timeout = min(connection_timeout, HEADER_TIMEOUT_SECONDS) if header_timeout is None else header_timeout
        self.healthz_stale_after = healthz_stale_after
        self.max_connections = max(1, min(int(max_connections), _descriptor_budget()))
        self.evicted_total = 0  # connections closed to make room, or over their head deadline
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
            listener.listen(LISTEN_BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self.socket = listener
        self.server_address = listener.getsockname()
        self._pending: dict[int, _Pending] = {}  # fd -> connection, oldest first (insertion order)
        self._work: queue.Queue[tuple[socket.socket, Any, bytes] | None] = queue.Queue()
        self._active = 0  # connections handed to workers and not yet closed
        self._active_lock = threading.Lock()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._workers = [threading.Thread(target=self._worker, name=f"advisor-exporter-worker-{n}", daemon=True)
                         for n in range(max(1, int(workers)))]
        for worker in self._workers:
            worker.start()

    # -- the accept and head-reading loop -------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.1) -> None:
        self._stopped.clear()
        selector = selectors.DefaultSelector()
        selector.register(self.socket, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                for key, _events in selector.select(timeout=poll_interval):
                    if key.data is None:
                        self._accept(selector)
                    else:
                        self._read_head(selector, key.data)
                self._expire(selector, time.monotonic())
        finally:
            for pending in list(self._pending.values()):
                self._drop(selector, pending)
            selector.close()
            self._stopped.set()

    def _held(self) -> int:
        return len(self._pending) + self._work.qsize() + self._active

    def _accept(self, selector: selectors.BaseSelector) -> None:
        for _ in range(256):  # a bounded batch, then the pending reads get their turn
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: make room by dropping the oldest unfinished head
                log.debug("accept failed: %s", exc)
                if not self._evict_oldest(selector):
                    return
                continue
            if self._held() >= self.max_connections and not self._evict_oldest(selector):
                self.evicted_total += 1
                _close(sock)  # every held connection is past its head and being served: refuse this one
                continue
            sock.setblocking(False)
            context = self.web_config.ssl_context
            try:
                if context is not None:
                    sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ssl.SSLError) as exc:
                log.debug("TLS setup with %s failed: %s", address, exc)
                _close(sock)
                continue
            pending = _Pending(sock, address, time.monotonic(), handshaken=context is None)
            self._pending[sock.fileno()] = pending
            selector.register(sock, selectors.EVENT_READ, pending)

    def _evict_oldest(self, selector: selectors.BaseSelector) -> bool:
        if not self._pending:
            return False
        oldest = next(iter(self._pending.values()))
        self.evicted_total += 1
        self._drop(selector, oldest)
        return True

    def _drop(self, selector: selectors.BaseSelector, pending: _Pending) -> None:
        self._pending.pop(pending.sock.fileno(), None)
        try:
            selector.unregister(pending.sock)
        except (KeyError, ValueError, OSError):
            pass
        _close(pending.sock)

    def _expire(self, selector: selectors.BaseSelector, now: float) -> None:
        cutoff = now - self.header_timeout
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.accepted > cutoff:
                return
            log.debug("client %s did not send its request within %.1f s", oldest.address, self.header_timeout)
            self.evicted_total += 1
            self._drop(selector, oldest)

    def _read_head(self, selector: selectors.BaseSelector, pending: _Pending) -> None:
        sock = pending.sock
        try:
            if not pending.handshaken:
                sock.do_handshake()  # type: ignore[attr-defined]
                pending.handshaken = True
            chunk = sock.recv(MAX_REQUEST_HEAD_BYTES + 1 - len(pending.data))
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
            return
        except (OSError, ssl.SSLError) as exc:
            log.debug("client %s went away: %s", pending.address, exc)
            self._drop(selector, pending)
            return
        if not chunk:
            self._drop(selector, pending)
            return
        pending.data += chunk
        end = pending.data.find(b"\r\n\r\n")
        if end < 0:
            end = pending.data.find(b"\n\n")
        if end < 0:
            if len(pending.data) > MAX_REQUEST_HEAD_BYTES:
                self._answer_inline(pending, 431, b"request head too large\n")
                self._drop(selector, pending)
            return
        self._pending.pop(sock.fileno(), None)
        selector.unregister(sock)
        head = bytes(pending.data)
        method, _, rest = head.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        if method in (b"GET", b"HEAD") and path == b"/healthz":
            status, _type, body = _health(self.store, self.healthz_stale_after)
            self._answer_inline(pending, status, body if method == b"GET" else b"", len(body))
            _close(sock)
            return
        with self._active_lock:
            self._active += 1
        self._work.put((sock, pending.address, head))

    def _answer_inline(self, pending: _Pending, status: int, body: bytes, length: int | None = None) -> None:
        """A short answer written without blocking (it fits the socket buffer; a client not reading loses it)."""
        reason = {200: "OK", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}.get(status, "")
        head = (f"HTTP/1.0 {status} {reason}\r\nServer: {_Handler.server_version}\r\n"
                f"Content-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n")
        try:
            pending.sock.send(head.encode() + body)
        except (OSError, ssl.SSLError):
            pass

    # -- workers --------------------------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            sock, address, head = item
            try:
                sock.setblocking(True)
                sock.settimeout(self.connection_timeout)  # each write: a client that stops reading is cut off
                _Handler(sock, address, self, head)
            except Exception:  # noqa: BLE001 (one request's failure must not end the worker)
                self.handle_error(sock, address)
            finally:
                _close(sock)
                with self._active_lock:
                    self._active -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, _CLIENT_GONE):
            log.debug("client %s went away: %s", client_address, error)
        else:
            log.warning("error handling a request from %s: %s: %s", client_address, type(error).__name__, error)
            log.debug("request error", exc_info=True)

    # -- lifecycle ------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        self._stop.set()
        self._stopped.wait(5)

    def server_close(self) -> None:
        self._stop.set()
        for _ in self._workers:
            self._work.put(None)
        _close(self.socket)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _descriptor_budget() -> int:
    """How many connections the process can hold: half its descriptor limit (the rest: logs, targets, store)."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return DEFAULT_MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(16, soft // 2)


def _health(store: SnapshotStore, stale_after: float | None) -> tuple[int, str, bytes]:
    age = store.seconds_since_publish()
    if stale_after is not None and age > stale_after:
        return 503, "text/plain; charset=utf-8", f"stale: no cycle published for {age:.0f} s\n".encode()
    return 200, "text/plain; charset=utf-8", b"ok\n"


class ExporterServer:
    """Serves /metrics, / and /status for `store` on host:port from a background thread."""

    def __init__(self, store: SnapshotStore, host: str = "127.0.0.1", port: int = DEFAULT_EXPORTER_PORT,
                 registry: CollectorRegistry | None = None, *, web_config: WebConfig | None = None,
                 connection_timeout: float = CONNECTION_TIMEOUT_SECONDS,
                 healthz_stale_after: float | None = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 header_timeout: float = HEADER_TIMEOUT_SECONDS) -> None:
        """`web_config`: TLS and basic auth (advisor.export.webconfig); `healthz_stale_after`: seconds
        without a publish after which /healthz answers 503 (None: always 200 while serving);
        `max_connections`: connections held at once; `header_timeout`: seconds a client has for its TLS
        handshake and request head, in all."""
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InputError(f"exporter port must be an integer 0..65535, got {port!r}")
        if not connection_timeout > 0:
            raise InputError(f"exporter connection timeout must be > 0 seconds, got {connection_timeout!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or not 1 <= max_connections <= 1_000_000:
            raise InputError(f"exporter max connections must be a whole number 1..1000000, got {max_connections!r}")
        if not 0 < header_timeout <= 3600:
            raise InputError(f"exporter header timeout must be > 0 and at most 3600 seconds, got {header_timeout!r}")
        self.max_connections = max_connections
        self.header_timeout = min(float(header_timeout), float(connection_timeout))
        self.store = store
        self.host = host
        # our own registries get the cached renderer; a caller's registry is exposed as it is, uncached
        self.renderer = MetricsRenderer(store) if registry is None else None
        self.registry = registry if registry is not None else build_registry(store)
        self.web_config = web_config or WebConfig()
        self.connection_timeout = float(connection_timeout)
        self.healthz_stale_after = healthz_stale_after
        self._requested_port = port
        self._httpd: _AdvisorHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ExporterServer:
        if self._httpd is not None:
            return self
        try:
            httpd = _AdvisorHTTPServer((self.host, self._requested_port), self.store, self.registry,
                                       self.web_config, self.connection_timeout, self.healthz_stale_after,
                                       self.renderer, header_timeout=self.header_timeout,
                                       max_connections=self.max_connections)
        except OSError as exc:
            raise InputError(
                f"cannot listen on {self.host}:{self._requested_port}: {exc.strerror or exc}"
            ) from exc
        thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="advisor-exporter", daemon=True
        )
        thread.start()
        self._httpd, self._thread = httpd, thread
        log.info("exporter listening on %s", self.url)
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)

    @property
    def port(self) -> int:
        """The bound port (the ephemeral one when constructed with port 0)."""
        if self._httpd is None:
            raise RuntimeError("exporter server is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        scheme = "https" if self.web_config.ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    def __enter__(self) -> ExporterServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
