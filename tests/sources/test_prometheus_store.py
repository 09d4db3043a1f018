"""The Prometheus-API client on loopback: instant and range queries, auth, TLS with a CA file, and every
failure as a one-line value that never shows a credential."""

from __future__ import annotations

import json
import math
import shutil
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import LoopbackServer, PostAnswer, closed_port_url

from advisor.errors import InputError
from advisor.sources.prometheus_store import (
    PrometheusClient,
    StoreAuth,
    parse_duration,
    scan_vector,
    selector_matchers,
)

Answer = PostAnswer

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"__name__": "sglang:num_running_reqs", "instance": "a:1"}, "value": [1700000000.5, "7"]},
    {"metric": {"instance": "b:2"}, "value": [1700000000.5, "NaN"]},
]}}
MATRIX = {"status": "success", "warnings": ["partial"], "data": {"resultType": "matrix", "result": [
    {"metric": {"instance": "a:1"}, "values": [[1700000000, "1"], [1700000060, "2.5"]]},
]}}


class FakeStore(LoopbackServer):
    """The tests' loopback server answering the query API's POST form; `requests` are (path, form, headers)."""

    def __init__(self, answer: Answer, tls: ssl.SSLContext | None = None) -> None:
        super().__init__({}, post=answer, tls=tls)
        self.requests = self.posts  # type: ignore[assignment]


def json_answer(body: dict[str, Any], status: int = 200) -> Answer:
    return lambda path, form, headers: (status, json.dumps(body).encode())


@pytest.fixture
def store_with() -> Iterator[Callable[..., FakeStore]]:
    started: list[FakeStore] = []

    def start(answer: Answer, tls: ssl.SSLContext | None = None) -> FakeStore:
        store = FakeStore(answer, tls).__enter__()
        started.append(store)
        return store

    yield start
    for store in started:
        store.__exit__()


def test_instant_query_sends_the_expression_and_time_and_reads_the_vector(store_with):
    store = store_with(json_answer(VECTOR))
    with PrometheusClient(store.url) as client:
        result = client.query('max by (instance) (sglang:num_running_reqs{job="sglang"})', at=1700000000.5)
    assert result.ok and result.error is None
    path, form, _ = store.requests[0]
    assert path == "/api/v1/query"
    assert form == {"query": 'max by (instance) (sglang:num_running_reqs{job="sglang"})', "time": "1700000000.500"}
    # b:2's only sample is NaN: skipped and counted, and a series left with no sample is dropped
    assert [s.labels["instance"] for s in result.series] == ["a:1"]
    assert result.series[0].samples == [(1700000000.5, 7.0)]
    assert result.skipped_samples == 1 and client.skipped_samples == 1
    assert client.queries_sent == 1


def test_range_query_sends_start_end_step_and_reads_the_matrix(store_with):
    store = store_with(json_answer(MATRIX))
    with PrometheusClient(store.url + "/") as client:
        result = client.query_range("up", 1700000000, 1700000060, 60)
    path, form, _ = store.requests[0]
    assert path == "/api/v1/query_range"
    assert form == {"query": "up", "start": "1700000000.000", "end": "1700000060.000", "step": "60"}
    assert result.ok and result.warnings == ("partial",)
    assert result.series[0].samples == [(1700000000.0, 1.0), (1700000060.0, 2.5)]


def test_bearer_token_is_sent_and_never_shown(store_with):
    def echo_header(path, form, headers):  # an API that quotes the header back in its error
        return 401, json.dumps({"status": "error", "errorType": "unauthorized",
                                "error": f"rejected {headers.get('authorization')}"}).encode()

    store = store_with(echo_header)
    client = PrometheusClient(store.url, auth=StoreAuth(bearer_token="s3cret-token"))
    result = client.query("up")
    assert store.requests[0][2]["authorization"] == "Bearer s3cret-token"
    assert not result.ok and result.error is not None
    assert "unauthorized" in result.error and "s3cret-token" not in result.error and "<redacted>" in result.error
    assert "s3cret-token" not in repr(client) and "s3cret-token" not in repr(client.auth)


def test_basic_auth_is_sent(store_with):
    store = store_with(json_answer(VECTOR))
    PrometheusClient(store.url, auth=StoreAuth(username="advisor", password="pw")).query("up")
    assert store.requests[0][2]["authorization"] == "Basic YWR2aXNvcjpwdw=="  # advisor:pw


@pytest.mark.parametrize("status, body, expected", [
    (400, json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}),
     "bad_data: parse error at char 3"),
    (503, "<html>Service Unavailable</html>", "HTTP 503"),
    (200, "not json", "response is not JSON"),
    (200, json.dumps({"status": "success", "data": {"resultType": "string", "result": [1, "x"]}}), "malformed result"),
    (200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}),
     "malformed result"),
])
def test_api_failures_are_one_line_values(store_with, status, body, expected):
    store = store_with(lambda path, form, headers: (status, body.encode()))
    result = PrometheusClient(store.url).query("up")
    assert not result.ok and result.series == []
    assert result.error is not None and expected in result.error and "\n" not in result.error


def test_connection_refused_and_timeout_are_values(store_with):
    refused = PrometheusClient(closed_port_url()).query("up")
    assert not refused.ok and refused.error is not None and "connection refused" in refused.error
    store = store_with(lambda path, form, headers: (0, b""))
    hung = PrometheusClient(store.url, timeout_seconds=0.3).query("up")
    assert not hung.ok and hung.error is not None and "timed out after 0.3s" in hung.error


def test_credentials_in_the_url_are_not_shown():
    result = PrometheusClient("http://user:pw-in-url@" + closed_port_url().split("://")[1]).query("up")
    assert result.error is not None and "pw-in-url" not in result.error


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("`openssl` not found on PATH; install it with `apt-get install openssl`")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls_is_verified_against_the_given_ca_file(store_with, tls_files):
    cert, key = tls_files
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    store = store_with(json_answer(VECTOR), tls=context)
    assert store.url.startswith("https://")
    trusted = PrometheusClient(store.url, auth=StoreAuth(ca_file=str(cert))).query("up")
    assert trusted.ok, trusted.error
    untrusted = PrometheusClient(store.url).query("up")
    assert not untrusted.ok and untrusted.error is not None and "TLS error" in untrusted.error


@pytest.mark.parametrize("text, seconds", [("7d", 604800), ("1h30m", 5400), ("90s", 90), ("250ms", 0.25),
                                           ("2w", 1209600), ("600", 600), (" 15m ", 900)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "7x", "-3", "d", "7d3", "0s", "1.5.5h"])
def test_bad_durations_are_named(text):
    with pytest.raises(InputError, match="not a positive duration"):
        parse_duration(text, "--history")


def test_selectors():
    assert selector_matchers('{job="sglang"}') == 'job="sglang"'
    assert selector_matchers(' { job="sglang", env=~"prod|staging", } ') == 'job="sglang", env=~"prod|staging"'
    assert selector_matchers("{}") == "" and selector_matchers(None) == "" and selector_matchers("") == ""
    for bad in ('job="sglang"', "{job}", "{a{b}}", "sglang:up{}"):
        with pytest.raises(InputError, match="selector"):
            selector_matchers(bad)


def test_auth_misuse_is_an_input_error():
    with pytest.raises(InputError, match="not both"):
        StoreAuth(bearer_token="t", username="u", password="p")
    with pytest.raises(InputError, match="username"):
        StoreAuth(password="p")
    with pytest.raises(InputError, match="http"):
        PrometheusClient("prometheus:9090")


def test_a_vector_answer_in_prometheus_layout_is_scanned_and_any_other_is_left_to_json():
    """scan_vector reads the rows' texts of an answer written as Prometheus writes it; whatever it cannot read
    exactly (a brace in a label, an escape in a value, rows at different times, warnings, whitespace, a
    matrix) it leaves to the JSON decoder."""
    head = '{"status":"success","data":{"resultType":"vector","result":['
    rows = ('{"metric":{"__name__":"up","instance":"a:1"},"value":[1700000000.5,"1"]},'
            '{"metric":{"instance":"b:2"},"value":[1700000000.5,"NaN"]}')
    scanned = scan_vector(head + rows + "]}}\n")
    assert scanned is not None and scanned.stamp == "1700000000.5" and scanned.rows is not None
    assert [row[:2] for row in scanned.rows] == [('{"__name__":"up","instance":"a:1"}', "1"), ('{"instance":"b:2"}', "NaN")]
    assert scanned.values == ["1", "NaN"]
    # the same labels again (other values, another time): the values are all that is read
    again = scan_vector(head + rows.replace('"1"]', '"2"]').replace("1700000000.5", "1700000015") + "]}}",
                        known_digest=scanned.digest)
    assert again is not None and again.rows is None and again.values == ["2", "NaN"] and again.stamp == "1700000015"
    changed = scan_vector(head + rows.replace("b:2", "c:3") + "]}}", known_digest=scanned.digest)
    assert changed is not None and changed.rows is not None and changed.digest != scanned.digest
    assert scan_vector(head + "]}}") == ("", b"", [], [])
    quoted = scan_vector(head + rows.replace('"a:1"', '"a\\",\\"value\\":[1"') + "]}}")  # escaped: no row end
    assert quoted is not None and json.loads(quoted.rows[0][0])["instance"] == 'a","value":[1'
    for text in (
        head + rows.replace('"a:1"', '"a{1}"') + "]}}",  # a brace inside a label value
        head + rows.replace('"1"]', '"\\u0031"]') + "]}}",  # an escape in a value
        head + rows.replace('1700000000.5,"NaN"', '1700000001,"NaN"') + "]}}",  # another time
        head + rows + '],"warnings":["w"]}}',
        head + rows.replace("},{", "}, {") + "]}}",
        head + rows.replace("},{", "}{") + "]}}",  # no comma between rows
        head.replace("vector", "matrix") + rows + "]}}",
        '{"status":"error","errorType":"bad_data","error":"x"}',
    ):
        assert scan_vector(text) is None, text


def test_a_scanned_answer_is_handed_over_as_texts_and_counts_what_is_not_finite(store_with):
    text = ('{"status":"success","data":{"resultType":"vector","result":['
            '{"metric":{"instance":"a:1"},"value":[1.5,"2"]},{"metric":{"instance":"b:2"},"value":[1.5,"+Inf"]}]}}')
    store = store_with(lambda path, form, headers: (200, text.encode()))
    taken: list[Any] = []

    def take_texts(scanned):
        taken.extend(scanned.values)
        return sum(1 for value in scanned.values if not math.isfinite(float(value)))

    with PrometheusClient(store.url) as client:
        result = client.read(client.send_query("up"), take=lambda rows: pytest.fail("decoded as JSON"),
                             take_texts=take_texts)
    assert result.ok and len(taken) == 2 and result.skipped_samples == 1 and client.skipped_samples == 1
