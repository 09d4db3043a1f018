"""Hostile HTTP servers on 127.0.0.1 for the hardening tests: raw sockets, so they can misbehave in ways
http.server would not (trickled headers, trickled or endless bodies, giant lines, never answering).

Every behaviour is finite: a trickle ends with a complete, valid response after `trickle_seconds`, so a client
without a total deadline would eventually get `ok` (and the test fails) instead of hanging the suite.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

# A behaviour returns True when it sent its whole response, False when the client went away first.
Behaviour = Callable[[socket.socket, threading.Event], bool]


def _send(conn: socket.socket, data: bytes) -> bool:
    try:
        conn.sendall(data)
        return True
    except OSError:
        return False


def _read_request(conn: socket.socket) -> bytes:
    conn.settimeout(10)
    data = b""
    try:
        while b"\r\n\r\n" not in data and len(data) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data


def trickle_headers(body: bytes = b"sglang:num_running_reqs 1\n", step: float = 0.05, count: int = 400) -> Behaviour:
    """Headers one byte every `step` seconds (a long padding header), then a valid response."""

    def behave(conn: socket.socket, stop: threading.Event) -> None:
        _read_request(conn)
        if not _send(conn, b"HTTP/1.1 200 OK\r\nX-Pad: "):
            return False
        for _ in range(count):
            if stop.wait(step) or not _send(conn, b"a"):
                return False
        return _send(conn, b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)

    return behave


def trickle_body(step: float = 0.05, count: int = 400) -> Behaviour:
    """Prompt headers, then a body of `count` short lines, one every `step` seconds."""
    line = b"# x\n"

    def behave(conn: socket.socket, stop: threading.Event) -> None:
        _read_request(conn)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % (len(line) * count)
        if not _send(conn, head):
            return False
        for _ in range(count):
            if stop.wait(step) or not _send(conn, line):
                return False
        return True

    return behave


def endless_body(chunk: bytes = b"# filler line of an endless exposition\n" * 1600, limit_bytes: int = 1 << 30) -> Behaviour:
    """No Content-Length, `Connection: close`, then bytes as fast as the client takes them (up to 1 GiB)."""

    def behave(conn: socket.socket, stop: threading.Event) -> None:
        _read_request(conn)
        if not _send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"):
            return False
        sent = 0
        while sent < limit_bytes and not stop.is_set():
            if not _send(conn, chunk):
                return False
            sent += len(chunk)
        return sent >= limit_bytes

    return behave


def silent(hold_seconds: float = 30.0) -> Behaviour:
    """Accepts, reads the request, never answers (until `hold_seconds`, the server stops or the client leaves)."""

    def behave(conn: socket.socket, stop: threading.Event) -> None:
        _read_request(conn)
        conn.settimeout(0.05)
        waited = 0.0
        while waited < hold_seconds and not stop.is_set():
            try:
                if conn.recv(1) == b"":
                    return False  # the client closed the connection
            except TimeoutError:
                waited += 0.05
            except OSError:
                return False
        return True

    return behave


def respond(
    make_body: Callable[[int], bytes], content_type: str = "text/plain; version=0.0.4", status: bytes = b"200 OK"
) -> Behaviour:
    """A well-formed response whose body is `make_body(n)` for the n-th request (0-based)."""
    counter = {"n": 0}
    lock = threading.Lock()

    def behave(conn: socket.socket, stop: threading.Event) -> None:
        _read_request(conn)
        with lock:
            n = counter["n"]
            counter["n"] += 1
        body = make_body(n)
        head = b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
            status, content_type.encode(), len(body))
        return _send(conn, head + body)

    return behave


class HostileServer:
    """Serves one behaviour per path prefix on 127.0.0.1 (ephemeral port); a thread per connection."""

    def __init__(self, routes: dict[str, Behaviour]) -> None:
        self.routes = routes
        self.stop_event = threading.Event()
        self.connections = 0
        self.outcomes: list[tuple[str, bool]] = []  # (path, whole response sent) per finished connection
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._open: list[socket.socket] = []

    @property
    def base_url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    def _accept_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        path = "/"
        try:
            conn.setblocking(True)
            peek = conn.recv(2048, socket.MSG_PEEK)
            path = peek.split(b" ", 2)[1].decode("latin-1") if peek.count(b" ") >= 2 else "/"
            behaviour = next((b for prefix, b in self.routes.items() if path.startswith(prefix)), None)
            if behaviour is None:
                _read_request(conn)
                _send(conn, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            else:
                self.outcomes.append((path, behaviour(conn, self.stop_event)))
        except OSError:
            self.outcomes.append((path, False))
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def outcome(self, path: str, timeout: float = 60.0) -> bool:
        """Whether the server sent its whole response on the (first finished) connection to `path`: polls
        until that connection ends."""
        finished = threading.Event()
        deadline_wait = 0.02
        waited = 0.0
        while waited < timeout:
            for seen, complete in self.outcomes:
                if seen == path:
                    return complete
            finished.wait(deadline_wait)
            waited += deadline_wait
        raise AssertionError(f"no connection to {path} finished within {timeout}s")

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_event.set()
        for conn in self._open:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._listener.close()
        self._thread.join(timeout=5)
