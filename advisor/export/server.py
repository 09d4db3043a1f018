"""export.server: a small threaded HTTP(S) server over a SnapshotStore — /metrics for Prometheus
(prometheus_client's own exposition: gzip, OpenMetrics negotiation, name[] filtering), / as a landing page
with server-side SVG charts, /status as JSON with the reasoning, /healthz for probes. Serving only reads
the last snapshot; slow or vanishing clients cost one timed-out thread and a debug line, never a traceback."""

from __future__ import annotations

import html
import json
import logging
import math
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from prometheus_client.registry import CollectorRegistry

from advisor import __version__
from advisor.errors import InputError
from advisor.export.collector import SnapshotStore, build_registry
from advisor.export.exposition import MetricsRenderer, bake_registry
from advisor.export.svg import concurrency_chart, context_chart, goodput_chart, history_chart
from advisor.export.times import utc_with_age
from advisor.export.webconfig import WebConfig
from advisor.json_output import finite_or_none
from advisor.status import TargetStatus

log = logging.getLogger(__name__)

# A suggestion for the daemon's default; any free port works (0 = ephemeral, for tests).
DEFAULT_EXPORTER_PORT = 9415
# The listen backlog (socketserver's default of 5 dropped 60 of 200 concurrent scrapes) and how long one
# connection may take to send its request or TLS handshake before its thread gives up on it.
LISTEN_BACKLOG = 1024
CONNECTION_TIMEOUT_SECONDS = 10.0
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
    server: _AdvisorHTTPServer
    server_version = f"sglang-pool-advisor/{__version__}"

    def setup(self) -> None:
        self.timeout = self.server.connection_timeout  # type: ignore[misc]  # StreamRequestHandler applies it
        super().setup()

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
        stale_after = self.server.healthz_stale_after
        age = self.server.store.seconds_since_publish()
        if stale_after is not None and age > stale_after:
            return 503, "text/plain; charset=utf-8", f"stale: no cycle published for {age:.0f} s\n".encode()
        return 200, "text/plain; charset=utf-8", b"ok\n"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (signature of the base class)
        log.debug("%s - %s", self.address_string(), format % args)


# What a client that goes away or stalls raises: one debug line each, not a traceback on stderr.
_CLIENT_GONE = (ConnectionError, TimeoutError, ssl.SSLError)


class _AdvisorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], store: SnapshotStore, registry: CollectorRegistry,
                 web_config: WebConfig, connection_timeout: float, healthz_stale_after: float | None,
                 renderer: MetricsRenderer | None = None) -> None:
        self.store = store
        self.registry = registry
        self.renderer = renderer
        self.web_config = web_config
        self.connection_timeout = connection_timeout
        self.healthz_stale_after = healthz_stale_after
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """TLS handshakes run here, in the connection's own thread, under the connection timeout."""
        context = self.web_config.ssl_context
        if context is not None:
            try:
                request.settimeout(self.connection_timeout)
                request = context.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError) as exc:
                log.debug("TLS handshake with %s failed: %s", client_address, exc)
                self.shutdown_request(request)
                return
        super().process_request_thread(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, _CLIENT_GONE):
            log.debug("client %s went away: %s", client_address, error)
        else:
            log.warning("error handling a request from %s: %s: %s", client_address, type(error).__name__, error)
            log.debug("request error", exc_info=True)


class ExporterServer:
    """Serves /metrics, / and /status for `store` on host:port from a background thread."""

    def __init__(self, store: SnapshotStore, host: str = "127.0.0.1", port: int = DEFAULT_EXPORTER_PORT,
                 registry: CollectorRegistry | None = None, *, web_config: WebConfig | None = None,
                 connection_timeout: float = CONNECTION_TIMEOUT_SECONDS,
                 healthz_stale_after: float | None = None) -> None:
        """`web_config`: TLS and basic auth (advisor.export.webconfig); `healthz_stale_after`: seconds
        without a publish after which /healthz answers 503 (None: always 200 while serving)."""
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InputError(f"exporter port must be an integer 0..65535, got {port!r}")
        if not connection_timeout > 0:
            raise InputError(f"exporter connection timeout must be > 0 seconds, got {connection_timeout!r}")
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
                                       self.renderer)
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
