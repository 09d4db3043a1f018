"""A real HTTP server on 127.0.0.1 (ephemeral port) answering from a route table, for the sources tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# A route answers (status, content type, body bytes, delay before answering in seconds).
Route = tuple[int, str, bytes, float]


class LoopbackServer:
    def __init__(self, routes: dict[str, Route | Callable[[dict[str, str]], Route]]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, dict[str, str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                headers = {key.lower(): value for key, value in self.headers.items()}
                server.requests.append((self.path, headers))
                route = server.routes.get(self.path.split("?")[0])
                if route is None:
                    status, content_type, body, delay = (
                        404,
                        "application/json",
                        b'{"detail":"Not Found"}',
                        0.0,
                    )
                elif callable(route):
                    status, content_type, body, delay = route(headers)
                else:
                    status, content_type, body, delay = route
                if delay:
                    time.sleep(delay)
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

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def closed_port_url() -> str:
    """A loopback URL nobody listens on (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"
