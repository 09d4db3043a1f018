"""A loopback HTTP server that replays genuine SGLang bodies from the vendored fixtures, with fault modes."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class ReplayServer:
    def __init__(self, metrics: str = "sglang-0.5.23-single.prom", server_info: str = "server_info-single-kvbound.json") -> None:
        self.bodies = {
            "/metrics": (FIXTURES / "metrics" / metrics).read_bytes(),
            "/server_info": (FIXTURES / "server_info" / server_info).read_bytes(),
        }
        self.fault = "none"
        self.hang_seconds = 10.0
        self.requests: list[str] = []
        self._release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.requests.append(self.path)
                if outer.fault == "hang":
                    outer._release.wait(outer.hang_seconds)
                    return
                if outer.fault == "http500":
                    self.send_error(500, "boom")
                    return
                body = outer.bodies.get(self.path.split("?")[0])
                if body is None:
                    self.send_error(404)
                    return
                if outer.fault == "garbage" and self.path == "/metrics":
                    body = b"\x00\x01 this is not an exposition {{{\n"
                if outer.fault == "truncate" and self.path == "/metrics":
                    body = body[: len(body) // 2]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> ReplayServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        time.sleep(0)
