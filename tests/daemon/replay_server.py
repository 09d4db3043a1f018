"""Genuine SGLang bodies (vendored fixtures) served by the tests' loopback server, with fault modes."""

from __future__ import annotations

from support import FIXTURES, LoopbackServer, Route

FAULTS = ("none", "hang", "http500", "garbage", "truncate")


class ReplayServer(LoopbackServer):
    """/metrics and /server_info from the fixtures; `fault` switches every answer to one failure mode."""

    def __init__(self, metrics: str = "sglang-0.5.23-single.prom", server_info: str = "server_info-single-kvbound.json") -> None:
        self.bodies = {
            "/metrics": (FIXTURES / "metrics" / metrics).read_bytes(),
            "/server_info": (FIXTURES / "server_info" / server_info).read_bytes(),
        }
        self.fault = "none"
        self.hang_seconds = 10.0
        super().__init__({path: self._answer(path) for path in self.bodies})

    def _answer(self, path: str):
        def route(_headers: dict[str, str]) -> Route:
            if self.fault not in FAULTS:
                raise ValueError(f"unknown fault {self.fault!r}")
            body = self.bodies[path]
            if self.fault == "hang":
                return 200, "text/plain", body, self.hang_seconds
            if self.fault == "http500":
                return 500, "text/plain", b"boom", 0.0
            if self.fault == "garbage" and path == "/metrics":
                return 200, "text/plain", b"\x00\x01 this is not an exposition {{{\n", 0.0
            if self.fault == "truncate" and path == "/metrics":
                return 200, "text/plain", body[: len(body) // 2], 0.0
            return 200, "text/plain" if path == "/metrics" else "application/json", body, 0.0

        return route
