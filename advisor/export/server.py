"""export.server: a small threaded HTTP server over a SnapshotStore — /metrics for Prometheus, / as a
human landing page, /status as JSON with the reasoning. Serving only reads the last snapshot."""

from __future__ import annotations

import html
import json
import logging
import math
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from advisor import __version__
from advisor.errors import InputError
from advisor.export.collector import SnapshotStore, build_registry
from advisor.status import TargetStatus

log = logging.getLogger(__name__)

# A suggestion for the daemon's default; any free port works (0 = ephemeral, for tests).
DEFAULT_EXPORTER_PORT = 9415
# generate_latest() with its default (underscores) escaping writes the classic text format 0.0.4 that
# every Prometheus understands; newer prometheus_client releases label it 1.0.0 in CONTENT_TYPE_LATEST.
EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _json_safe(value: Any) -> Any:
    """Replace non-finite floats by None so the document is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def status_document(store: SnapshotStore) -> dict[str, Any]:
    """The /status body: when the snapshot was computed and every target with its reasoning."""
    snapshot = store.snapshot()
    return _json_safe(
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
    return "<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in cells) + "</tr>"


def landing_page(store: SnapshotStore) -> str:
    """A short HTML page: per server the decision, recommended vs live ratio and binding pool."""
    snapshot = store.snapshot()
    if snapshot.targets:
        rows = "\n".join(_landing_row(status) for status in sorted(snapshot.targets, key=lambda s: s.server))
    else:
        rows = '<tr><td colspan="10">no cycle has completed yet</td></tr>'
    generated = "never" if snapshot.generated_at is None else f"{snapshot.generated_at:.0f} (unix seconds)"
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>SGLang pool advisor</title></head>
<body>
<h1>SGLang pool advisor {html.escape(__version__)}</h1>
<p>Last snapshot: {generated}. <a href="/metrics">/metrics</a> · <a href="/status">/status</a> (JSON with the reasoning)</p>
<table border="1" cellpadding="4">
<tr><th>server</th><th>model</th><th>target</th><th>decision</th><th>recommended ratio</th><th>band</th>
<th>live ratio</th><th>binding pool (live → recommended)</th><th>confidence</th><th>flags</th></tr>
{rows}
</table>
</body></html>
"""


class _Handler(BaseHTTPRequestHandler):
    server: _AdvisorHTTPServer
    server_version = f"sglang-pool-advisor/{__version__}"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._respond(send_body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._respond(send_body=False)

    def _respond(self, send_body: bool) -> None:
        path = urlsplit(self.path).path
        try:
            if path == "/metrics":
                status, content_type, body = 200, EXPOSITION_CONTENT_TYPE, generate_latest(self.server.registry)
            elif path == "/status":
                document = json.dumps(status_document(self.server.store), indent=1, allow_nan=False)
                status, content_type, body = 200, "application/json", document.encode()
            elif path in ("/", "/index.html"):
                status, content_type = 200, "text/html; charset=utf-8"
                body = landing_page(self.server.store).encode()
            else:
                status, content_type, body = 404, "text/plain; charset=utf-8", b"not found: try /metrics\n"
        except Exception as exc:  # a bad snapshot must not kill the server thread
            log.exception("error serving %s", path)
            status, content_type = 500, "text/plain; charset=utf-8"
            body = f"internal error: {type(exc).__name__}: {exc}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (signature of the base class)
        log.debug("%s - %s", self.address_string(), format % args)


class _AdvisorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: SnapshotStore, registry: CollectorRegistry) -> None:
        self.store = store
        self.registry = registry
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


class ExporterServer:
    """Serves /metrics, / and /status for `store` on host:port from a background thread."""

    def __init__(self, store: SnapshotStore, host: str = "127.0.0.1", port: int = DEFAULT_EXPORTER_PORT,
                 registry: CollectorRegistry | None = None) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InputError(f"exporter port must be an integer 0..65535, got {port!r}")
        self.store = store
        self.host = host
        self.registry = registry if registry is not None else build_registry(store)
        self._requested_port = port
        self._httpd: _AdvisorHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ExporterServer:
        if self._httpd is not None:
            return self
        try:
            httpd = _AdvisorHTTPServer((self.host, self._requested_port), self.store, self.registry)
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
        return f"http://{host}:{self.port}"

    def __enter__(self) -> ExporterServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
