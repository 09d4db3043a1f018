"""Test support shared by every test folder: fixture paths (all vendored in tests/fixtures, see its README),
the pollers, free ports, binary look-ups, and the one loopback HTTP server the tests use."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
LOGS = FIXTURES / "logs"
METRICS = FIXTURES / "metrics"
SERVER_INFO = FIXTURES / "server_info"
REAL = FIXTURES / "real"

# --- pollers, ports, binaries ---------------------------------------------------------------------

T = TypeVar("T")
REQUIRE_BINARIES_ENV = "POOL_ADVISOR_REQUIRE_BINARIES"


def wait_for(check: Callable[[], T | None], timeout: float, interval: float = 0.05, what: str = "condition") -> T:
    """Poll `check` until it returns something truthy, at most `timeout` seconds; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def closed_port_url() -> str:
    """A loopback URL nobody listens on (connection refused)."""
    return f"http://127.0.0.1:{free_loopback_port()}"


def require_binary(name: str, package: str = "prometheus") -> str:
    """Absolute path of `name`; skip saying how to get it (or fail under POOL_ADVISOR_REQUIRE_BINARIES=1)."""
    path = shutil.which(name)
    if path:
        return path
    message = f"`{name}` not found on PATH; install it with `apt-get install {package}`"
    if os.environ.get(REQUIRE_BINARIES_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_BINARIES_ENV}=1 forbids skipping)")
    pytest.skip(message)


# --- the one loopback HTTP server of the tests ----------------------------------------------------

# A route answers (status, content type, body bytes, delay before answering in seconds).
Route = tuple[int, str, bytes, float]


# A POST answer: (status, body) from the request's path, form fields and headers; status 0 hangs until close.
PostAnswer = Callable[[str, dict[str, str], dict[str, str]], tuple[int, bytes]]


class LoopbackServer:
    """A real HTTP(S) server on 127.0.0.1 (ephemeral port). GETs answer from a route table (a fixed answer or a
    callable of the request headers); POSTs (form-encoded, as the Prometheus query API takes them) from `post`.
    A delay or hang is waited on an event that closing the server sets, so it never outlives its test."""

    def __init__(
        self,
        routes: dict[str, Route | Callable[[dict[str, str]], Route]],
        *,
        post: PostAnswer | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.routes = routes
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.posts: list[tuple[str, dict[str, str], dict[str, str]]] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                headers = {key.lower(): value for key, value in self.headers.items()}
                server.requests.append((self.path, headers))
                route = server.routes.get(self.path.split("?")[0])
                if route is None:
                    status, content_type, body, delay = 404, "application/json", b'{"detail":"Not Found"}', 0.0
                elif callable(route):
                    status, content_type, body, delay = route(headers)
                else:
                    status, content_type, body, delay = route
                if delay and server.release.wait(delay):
                    return  # the server is closing: drop the connection
                self._answer(status, content_type, body)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", "0"))
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                headers = {key.lower(): value for key, value in self.headers.items()}
                server.posts.append((self.path, form, headers))
                if server.post is None:
                    self._answer(405, "text/plain", b"no POST here")
                    return
                status, body = server.post(self.path, form, headers)
                if status == 0:  # hang until the test ends
                    server.release.wait(10)
                    return
                self._answer(status, "application/json", body)

            def _answer(self, status: int, content_type: str, body: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (timeout tests)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.post = post
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        if tls is not None:
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
        self._scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{self._scheme}://{host!s}:{port}"

    url = base_url

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


# The keys every simulation result carries (the `simulate --json` contract).
RESULT_KEYS = {
    "ratio",
    "max_running_requests",
    "kv_capacity_tokens",
    "max_mamba_cache_size",
    "completed_requests",
    "goodput_requests_per_second",
    "goodput_tokens_per_second",
    "slo_goodput_tokens_per_second",
    "queue_time_bound",
    "retractions",
    "retracted_requests",
    "wasted_tokens",
    "queue_time_p50",
    "queue_time_p90",
    "queue_time_p99",
    "mean_running_requests",
    "state_bound_fraction",
    "kv_bound_fraction",
    "mean_live_context",
    "mean_request_context",
}
