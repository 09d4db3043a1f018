"""The exporter under load and hostile clients, and its exposition: gzip and OpenMetrics negotiation,
build info, process metrics and the cycle-step histogram, /healthz, a deep listen backlog, a timeout per
connection, disconnects without tracebacks, TLS and basic auth from a Prometheus-style web config."""

from __future__ import annotations

import gzip
import shutil
import socket
import struct
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt
import pytest
import requests
from export_samples import drifted_status
from prom_harness import wait_for
from prometheus_client.parser import text_string_to_metric_families

from advisor.errors import InputError
from advisor.export.collector import build_registry
from advisor.export.server import ExporterServer, _AdvisorHTTPServer
from advisor.export.snapshot import CYCLE_STEPS, ServerView, SnapshotStore, history_point
from advisor.export.webconfig import WebConfig, load_web_config, web_config_from_dict

NOW = 1_790_000_030.0
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


@pytest.fixture
def store() -> SnapshotStore:
    snapshot = SnapshotStore()
    snapshot.publish([drifted_status()], now=NOW)
    return snapshot


def _get(url: str, **kwargs: object) -> requests.Response:
    return requests.get(url, timeout=10, **kwargs)  # type: ignore[arg-type]


def test_gzip_openmetrics_and_name_filter(store):
    with ExporterServer(store, "127.0.0.1", 0) as exporter:
        plain = _get(f"{exporter.url}/metrics", headers={"Accept-Encoding": "identity"})
        assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "Content-Encoding" not in plain.headers

        raw = requests.get(f"{exporter.url}/metrics", headers={"Accept-Encoding": "gzip"}, timeout=10, stream=True)
        assert raw.headers["Content-Encoding"] == "gzip"
        body = gzip.decompress(raw.raw.read()).decode()
        assert "sglang_advisor_recommended_ratio{" in body

        openmetrics = _get(f"{exporter.url}/metrics", headers={"Accept": OPENMETRICS})
        assert openmetrics.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        assert openmetrics.text.endswith("# EOF\n")

        only = _get(f"{exporter.url}/metrics?name[]=sglang_advisor_live_ratio").text
        names = {family.name for family in text_string_to_metric_families(only)}
        assert names == {"sglang_advisor_live_ratio"}


def test_build_info_process_metrics_and_step_histogram(store):
    store.observe_steps({"metrics": 0.03, "recommend": 0.002})
    store.observe_step("cycle", 0.2)
    store.observe_step("cycle", float("nan"))  # dropped, not exported as NaN
    with ExporterServer(store, "127.0.0.1", 0) as exporter:
        text = _get(f"{exporter.url}/metrics").text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    build = families["sglang_advisor_build_info"].samples[0]
    assert build.name == "sglang_advisor_build_info" and build.value == 1 and build.labels["version"]
    assert "process_resident_memory_bytes" in families and "process_cpu_seconds" in families
    histogram = families["sglang_advisor_cycle_step_duration_seconds"]
    counts = {s.labels["step"]: s.value for s in histogram.samples if s.name.endswith("_count")}
    assert set(counts) == set(CYCLE_STEPS)  # every step has a series from the first scrape
    assert counts["metrics"] == 1 and counts["recommend"] == 1 and counts["cycle"] == 1 and counts["logs"] == 0
    assert "NaN" not in text


def test_healthz_reports_a_stalled_daemon():
    store = SnapshotStore()
    with ExporterServer(store, "127.0.0.1", 0, healthz_stale_after=3600) as exporter:
        assert _get(f"{exporter.url}/healthz").text == "ok\n"
    with ExporterServer(store, "127.0.0.1", 0, healthz_stale_after=0.0) as exporter:
        stalled = _get(f"{exporter.url}/healthz")
        assert stalled.status_code == 503 and stalled.text.startswith("stale: no cycle published for")


def test_a_burst_of_connections_queues_instead_of_being_dropped(store):
    """200 clients connect while the server is not accepting (as in a burst): with socketserver's
    backlog of 5 all but ~6 would hang in SYN retries; all 200 must connect, then all get answers."""
    httpd = _AdvisorHTTPServer(("127.0.0.1", 0), store, build_registry(store), WebConfig(), 10.0, None)
    port = httpd.server_address[1]
    clients: list[socket.socket] = []
    thread: threading.Thread | None = None
    try:
        for _ in range(200):
            client = socket.create_connection(("127.0.0.1", port), timeout=3)
            client.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            clients.append(client)
        thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()

        def answer(client: socket.socket) -> bytes:
            client.settimeout(10)  # generous: a dropped connection never answers at all
            try:
                return client.recv(12)
            except TimeoutError:
                return b"no answer"

        with ThreadPoolExecutor(max_workers=len(clients)) as pool:
            heads = list(pool.map(answer, clients))
        assert heads == [b"HTTP/1.0 200"] * 200
    finally:
        for client in clients:
            client.close()
        if thread is not None:  # shutdown() waits for serve_forever, which must have started
            httpd.shutdown()
        httpd.server_close()


def test_a_silent_client_is_cut_off_and_does_not_block_scrapes(store):
    with ExporterServer(store, "127.0.0.1", 0, connection_timeout=0.5) as exporter:
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=15) as silent:
            silent.sendall(b"GET /metr")  # half a request line, then nothing
            assert _get(f"{exporter.url}/metrics").status_code == 200  # served meanwhile
            assert silent.recv(100) == b""  # the server closed it (a hang would raise socket.timeout)


def test_clients_that_vanish_leave_no_traceback(store, capfd, caplog):
    with ExporterServer(store, "127.0.0.1", 0) as exporter:
        for request in (b"GET /metrics HTTP/1.0\r\n\r\n", b"GET / HTTP/1.0\r\n\r\n", b"GET /met"):
            client = socket.create_connection(("127.0.0.1", exporter.port), timeout=5)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
            client.sendall(request)
            client.close()
        # the server is still fine and each vanished client was at most a debug line
        assert _get(f"{exporter.url}/metrics").status_code == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err
    assert [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")] == []


def _openssl() -> str:
    path = shutil.which("openssl")
    if not path:
        pytest.skip("`openssl` not found; install it with `apt-get install openssl`")
    return path


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [_openssl(), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def test_tls_from_a_web_config_file(store, certificate, tmp_path):
    cert, key = certificate
    (tmp_path / "web.yml").write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key.name}\n")
    shutil.copy(key, tmp_path / key.name)  # a relative path resolves against the web config's directory
    web = load_web_config(tmp_path / "web.yml")
    with ExporterServer(store, "127.0.0.1", 0, web_config=web, connection_timeout=2) as exporter:
        assert exporter.url.startswith("https://")
        assert "sglang_advisor_recommended_ratio" in _get(f"{exporter.url}/metrics", verify=str(cert)).text
        with pytest.raises(requests.exceptions.ConnectionError):  # plain HTTP is refused, not served
            _get(exporter.url.replace("https://", "http://") + "/metrics")
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=15) as stalled:
            assert stalled.recv(10) == b""  # no ClientHello: closed after the connection timeout
        assert _get(f"{exporter.url}/healthz", verify=str(cert)).text == "ok\n"


def test_basic_auth_with_bcrypt_hashes(store):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    web = web_config_from_dict({"basic_auth_users": {"prometheus": hashed}})
    with ExporterServer(store, "127.0.0.1", 0, web_config=web) as exporter:
        anonymous = _get(f"{exporter.url}/metrics")
        assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"].startswith("Basic")
        assert _get(f"{exporter.url}/status", auth=("prometheus", "wrong")).status_code == 401
        assert _get(f"{exporter.url}/", auth=("nobody", "s3cret")).status_code == 401
        for _ in range(2):  # the second check comes from the cache and must agree
            assert _get(f"{exporter.url}/metrics", auth=("prometheus", "s3cret")).status_code == 200
        assert _get(f"{exporter.url}/metrics", auth=("prometheus", "s3cret!")).status_code == 401
        assert _get(f"{exporter.url}/healthz").status_code == 200  # probes need no credentials


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"tls_server_config": {"cert_file": "c.pem"}}, "missing 'tls_server_config.key_file'"),
        ({"tls_server_config": {"cert_file": "c.pem", "key_file": "k.pem", "cipher_suites": []}},
         "'tls_server_config.cipher_suites' is not supported"),
        ({"basic_auth_users": {"alice": "plaintext"}}, "must be a bcrypt hash"),
        ({"basic_auth_user": {}}, "unknown field 'basic_auth_user'"),
        ({"tls_server_config": {"cert_file": "/nonexistent/c.pem", "key_file": "/nonexistent/k.pem"}},
         "cannot load cert_file /nonexistent/c.pem"),
        ([1, 2], "must be a mapping"),
    ],
)
def test_web_config_errors_name_the_field(data, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace("[", r"\[")):
        web_config_from_dict(data)


def test_client_auth_needs_a_ca(certificate):
    cert, key = certificate
    with pytest.raises(InputError, match="needs 'tls_server_config.client_ca_file'"):
        web_config_from_dict({"tls_server_config": {"cert_file": str(cert), "key_file": str(key),
                                                    "client_auth_type": "RequireAndVerifyClientCert"}})


def test_history_and_page_data_of_a_vanished_server_are_dropped(store):
    point = history_point(drifted_status().recommendation, NOW)
    store.publish([ServerView(drifted_status(server="a:1"), context_weights=(1.0,), history=(point,))], now=NOW)
    assert len(store.history("a:1")) == 1 and store.context_weights("a:1") == (1.0,)
    store.publish([drifted_status(server="b:1")], now=NOW + 1)
    assert store.history("a:1") == [] and store.context_weights("a:1") is None
    wait_for(lambda: store.seconds_since_publish() >= 0, timeout=1, what="a monotonic age")


def test_client_certificates_required_and_verified(store, certificate, tmp_path):
    """RequireAndVerifyClientCert: a client without a certificate signed by client_ca_file is refused."""
    cert, key = certificate
    client_key, client_csr, client_cert = tmp_path / "client.key", tmp_path / "client.csr", tmp_path / "client.pem"
    openssl = _openssl()
    subprocess.run([openssl, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=prometheus",
                    "-keyout", str(client_key), "-out", str(client_csr)], check=True, capture_output=True, timeout=60)
    subprocess.run([openssl, "x509", "-req", "-in", str(client_csr), "-CA", str(cert), "-CAkey", str(key),
                    "-CAcreateserial", "-days", "2", "-out", str(client_cert)], check=True, capture_output=True,
                   timeout=60)
    web = web_config_from_dict({"tls_server_config": {
        "cert_file": str(cert), "key_file": str(key), "client_auth_type": "RequireAndVerifyClientCert",
        "client_ca_file": str(cert), "min_version": "TLS12"}})
    with ExporterServer(store, "127.0.0.1", 0, web_config=web, connection_timeout=2) as exporter:
        url = f"{exporter.url}/metrics"
        with pytest.raises(requests.exceptions.SSLError):
            _get(url, verify=str(cert))
        response = _get(url, verify=str(cert), cert=(str(client_cert), str(client_key)))
        assert response.status_code == 200 and "sglang_advisor_" in response.text


def test_full_exposition_is_promtool_clean(store):
    """Everything /metrics serves (per-server families, build info, step histogram, process metrics)."""
    from prom_harness import run_promtool

    store.observe_step("cycle", 0.5)
    with ExporterServer(store, "127.0.0.1", 0) as exporter:
        text = _get(f"{exporter.url}/metrics").text
    result = run_promtool("check", "metrics", stdin=text)
    assert result.returncode == 0, result.stdout + result.stderr
