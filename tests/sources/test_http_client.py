"""HttpClient against real loopback servers: bodies, every failure as a one-line value, the API key kept secret."""

from __future__ import annotations

import logging

import pytest
from support import LoopbackServer, closed_port_url

from advisor.sources.http import HttpClient, redact_url

SECRET = "sk-test-7f3a9c-do-not-leak"


def _auth_route(headers: dict[str, str]) -> tuple[int, str, bytes, float]:
    if headers.get("authorization") == f"Bearer {SECRET}":
        return 200, "application/json", b'{"authorized": true}', 0.0
    return 401, "application/json", b'{"detail": "bad key"}', 0.0


ROUTES = {
    "/metrics": (200, "text/plain; version=0.0.4; charset=utf-8", b"sglang:num_running_reqs 3.0\n", 0.0),
    "/json": (200, "application/json", b'{"loads": [{"dp_rank": 0}]}', 0.0),
    "/list": (200, "application/json", b"[1, 2]", 0.0),
    "/scalar": (200, "application/json", b"42", 0.0),
    "/html": (200, "text/html", b"<html>\n<body>proxy login</body>\n</html>", 0.0),
    "/down": (503, "text/plain", b"Service\nUnavailable: starting up", 0.0),
    "/slow": (200, "text/plain", b"late\n", 1.5),
    "/big": (200, "text/plain", b"x" * 5000, 0.0),
    "/auth": _auth_route,
}


@pytest.fixture(scope="module")
def server():
    with LoopbackServer(ROUTES) as running:
        yield running


def test_text_and_json_bodies(server: LoopbackServer) -> None:
    client = HttpClient(timeout_seconds=5)
    text = client.get_text(server.base_url + "/metrics")
    assert text.ok and text.status == 200 and text.error is None
    assert text.body == "sglang:num_running_reqs 3.0\n"
    data = client.get_json(server.base_url + "/json")
    assert data.ok and data.body == {"loads": [{"dp_rank": 0}]}
    assert client.get_json(server.base_url + "/list").body == [1, 2]


@pytest.mark.parametrize(
    ("path", "method", "status", "message"),
    [
        ("/down", "get_text", 503, "HTTP 503 Service Unavailable: Service Unavailable: starting up"),
        ("/missing", "get_json", 404, "HTTP 404 Not Found"),
        ("/html", "get_json", 200, "response is not JSON"),
        ("/scalar", "get_json", 200, "JSON response is a int, not an object"),
        ("/big", "get_text", 200, "body larger than 1000 bytes"),
    ],
)
def test_http_level_failures_are_values(
    server: LoopbackServer, path: str, method: str, status: int, message: str
) -> None:
    client = HttpClient(timeout_seconds=5, api_key=SECRET, max_body_bytes=1000)
    result = getattr(client, method)(server.base_url + path)
    assert not result.ok
    assert result.status == status
    assert result.error is not None and message in result.error
    assert "\n" not in result.error and SECRET not in result.error


def test_connection_refused_is_a_value() -> None:
    result = HttpClient(timeout_seconds=2, api_key=SECRET).get_text(closed_port_url() + "/metrics")
    assert not result.ok and result.status is None
    assert result.error is not None and result.error.endswith("connection refused")
    assert SECRET not in result.error


def test_timeout_is_a_value(server: LoopbackServer) -> None:
    result = HttpClient(timeout_seconds=0.2, api_key=SECRET).get_text(server.base_url + "/slow")
    assert not result.ok and result.status is None
    assert result.error is not None and "timed out after 0.2s" in result.error


def test_invalid_url_is_a_value() -> None:
    result = HttpClient(timeout_seconds=1).get_text("not a url")
    assert not result.ok and result.error is not None and "invalid URL" in result.error


def test_api_key_sent_as_bearer_and_never_shown(
    server: LoopbackServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = HttpClient(timeout_seconds=5, api_key=SECRET)
    ok = client.get_json(server.base_url + "/auth")
    assert ok.ok and ok.body == {"authorized": True}
    assert server.requests[-1][1]["authorization"] == f"Bearer {SECRET}"
    refused = client.get_json(closed_port_url() + "/auth")
    wrong = HttpClient(timeout_seconds=5, api_key="other").get_json(server.base_url + "/auth")
    assert wrong.status == 401 and not wrong.ok
    for text in (repr(client), str(client), repr(ok), repr(refused), caplog.text):
        assert SECRET not in text
    assert "api_key=set" in repr(client)


def test_no_authorization_header_without_key(server: LoopbackServer) -> None:
    HttpClient(timeout_seconds=5).get_text(server.base_url + "/metrics")
    assert "authorization" not in server.requests[-1][1]


def test_credentials_in_url_are_redacted() -> None:
    assert redact_url("http://user:pw@127.0.0.1:30000/metrics") == "http://127.0.0.1:30000/metrics"
    result = HttpClient(timeout_seconds=1).get_text(
        closed_port_url().replace("http://", "http://user:pw@") + "/x"
    )
    assert result.error is not None and "pw" not in result.error and "user" not in result.error


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_seconds must be > 0"):
        HttpClient(timeout_seconds=0)
