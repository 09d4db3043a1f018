"""HttpClient against hostile loopback servers: one total deadline per GET whatever the server does, a capped
body, secrets scrubbed before any truncation, hostile JSON as a value."""

from __future__ import annotations

import base64

import pytest
from hostile_servers import HostileServer, endless_body, respond, silent, trickle_body, trickle_headers

from advisor.sources.http import HttpClient

SECRET = "sk-hardening-0123456789abcdef0123456789"


@pytest.fixture(scope="module")
def hostile():
    routes = {
        "/trickle-headers": trickle_headers(),
        "/trickle-body": trickle_body(),
        "/endless": endless_body(),
        "/silent": silent(),
        # a 401 page that echoes the Authorization header after ~100 characters: a cut at 120 falls in the key
        "/echo-auth": respond(
            lambda n: b"x" * 80 + b" you sent: Bearer " + SECRET.encode() + b" (wrong key)\n",
            status=b"401 Unauthorized",
        ),
        "/deep-json": respond(lambda n: b"[" * 200_000 + b"]" * 200_000, "application/json"),
        "/nan-json": respond(lambda n: b'{"max_total_num_tokens": NaN, "x": Infinity}', "application/json"),
        "/ok": respond(lambda n: b"sglang:num_running_reqs 1\n"),
    }
    with HostileServer(routes) as server:
        yield server


@pytest.mark.parametrize("path", ["/trickle-headers", "/trickle-body", "/silent"])
def test_total_deadline_holds_against_trickling_and_silent_servers(hostile: HostileServer, path: str) -> None:
    # Each of these servers would complete a valid response after ~20 s (or never): a per-read timeout alone
    # would return ok. The total deadline makes it a timeout value.
    client = HttpClient(timeout_seconds=0.5)
    result = client.get_text(hostile.base_url + path)
    assert not result.ok
    assert result.error is not None and "timed out after 0.5s" in result.error
    # the client gave up mid-trickle: the server never got to send its whole response
    assert hostile.outcome(path) is False
    # the client is still usable afterwards (the broken connection was dropped)
    assert client.get_text(hostile.base_url + "/ok").ok


def test_endless_body_is_cut_at_the_cap(hostile: HostileServer) -> None:
    result = HttpClient(timeout_seconds=30, max_body_bytes=1 << 20).get_text(hostile.base_url + "/endless")
    assert not result.ok and result.body is None
    assert result.error is not None and "body larger than 1048576 bytes" in result.error


def test_secret_is_scrubbed_before_the_snippet_is_cut(hostile: HostileServer) -> None:
    result = HttpClient(timeout_seconds=5, api_key=SECRET).get_text(hostile.base_url + "/echo-auth")
    assert not result.ok and result.status == 401 and result.error is not None
    assert "you sent: Bearer" in result.error  # the snippet reaches the key's position
    for size in range(6, len(SECRET) + 1):
        for start in range(0, len(SECRET) - size + 1, 3):
            assert SECRET[start : start + size] not in result.error


def test_password_in_url_goes_as_basic_auth_and_is_never_shown(hostile: HostileServer) -> None:
    password = "hunter2-very-secret"
    url = hostile.base_url.replace("http://", f"http://admin:{password}@") + "/silent"
    result = HttpClient(timeout_seconds=0.3).get_text(url)
    assert not result.ok and result.error is not None
    token = base64.b64encode(f"admin:{password}".encode()).decode()
    for shown in (result.error, result.url, repr(result)):
        assert password not in shown and "admin" not in shown and token not in shown


def test_hostile_json_is_a_value(hostile: HostileServer) -> None:
    client = HttpClient(timeout_seconds=10)
    deep = client.get_json(hostile.base_url + "/deep-json")
    assert not deep.ok and deep.error is not None and "nested too deeply" in deep.error
    nan = client.get_json(hostile.base_url + "/nan-json")
    assert not nan.ok and nan.error is not None and "not JSON" in nan.error
