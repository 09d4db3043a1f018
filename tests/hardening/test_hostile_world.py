"""One step further than the other hardening tests: what a hostile world sends must not get through. Each test
names the threat it reproduces, with a fake on loopback (tests/support.py's LoopbackServer for answers that are
well-formed HTTP, hostile_servers.py for raw-socket misbehaviour) or a file in tests/fixtures/hostile/:
1 a device or FIFO as the checkpoint, 2 secrets and huge strings in outputs, 3 YAML bombs, 4 trickling exporter
clients, 5 a lying or huge store, 6 an open boot block, 7 FIFOs where a file is read, 8 tracebacks and noise."""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from hostile_servers import HostileServer, trickle_body
from support import FIXTURES, METRICS, SERVER_INFO, LoopbackServer, wait_for

from advisor.cli import main
from advisor.config import config_from_dict, load_config, parse_config_text
from advisor.daemon.checkpoint import read_checkpoint, write_checkpoint
from advisor.daemon.runner import Advisor
from advisor.errors import InputError
from advisor.export.collector import SnapshotStore
from advisor.export.server import ExporterServer
from advisor.export.webconfig import load_web_config
from advisor.scrub import redact_url, scrub_text
from advisor.sources.bootlog import read_boot_log
from advisor.sources.hf_config import load_hf_config
from advisor.sources.http import HttpClient
from advisor.sources.loglines import LogLineParser
from advisor.sources.prometheus_store import PrometheusClient, StoreAuth
from advisor.status import TargetStatus

HOSTILE = FIXTURES / "hostile"
GENUINE = (METRICS / "sglang-0.5.23-single.prom").read_bytes()
SERVER_INFO_BODY = json.loads((SERVER_INFO / "server_info-single-kvbound.json").read_text())
API_KEY = "sk-hostile-0123456789abcdef"
PASSWORD = "pw-hostile-s3cret"
BASIC_TOKEN = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()


def _mkfifo(path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    os.mkfifo(path)
    return path


# --- 1. a checkpoint path that is a device node or a FIFO ------------------------------------------------


def test_a_checkpoint_path_that_is_not_a_regular_file_is_never_replaced(tmp_path: Path) -> None:
    fifo = _mkfifo(tmp_path / "checkpoint.json")
    with pytest.raises(OSError, match="not a regular file"):
        write_checkpoint(fifo, {"targets": {}})
    state, problem = read_checkpoint(fifo)  # and reading it neither blocks nor moves it aside
    assert state is None and problem is not None and "not a regular file" in problem
    assert fifo.is_fifo()
    parent_is_a_file = tmp_path / "plain"
    parent_is_a_file.write_text("x")
    with pytest.raises(OSError, match="not a directory"):
        write_checkpoint(parent_is_a_file / "checkpoint.json", {"targets": {}})
    assert parent_is_a_file.read_text() == "x"


def test_the_daemon_refuses_to_start_on_a_device_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = _mkfifo(tmp_path / "ckpt")
    code = main(["run", "--once", "--target", "http://127.0.0.1:9", "--checkpoint", str(fifo)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and fifo.is_fifo()
    assert len(err.splitlines()) == 1 and "not a regular file" in err


# --- 2. secrets and huge strings from outside --------------------------------------------------------------


def _echo_headers(headers: dict[str, str]) -> tuple[int, str, bytes, float]:
    """A /metrics that answers 200 with the request headers (a debug endpoint, a misrouted proxy)."""
    echoed = "; ".join(f"{name}: {value}" for name, value in sorted(headers.items(), key=lambda kv: kv[0] != "authorization"))
    return 200, "text/plain", f"# echo\nnot a metric line {{{echoed}}}\n".encode(), 0.0


def _huge_server_info(headers: dict[str, str]) -> tuple[int, str, bytes, float]:
    body = dict(SERVER_INFO_BODY, version="0.5.23-" + "v" * 5_000_000, served_model_name="m" * 1_000_000)
    return 200, "application/json", json.dumps(body).encode(), 0.0


def _no_secret(text: str) -> None:
    for secret in (API_KEY, PASSWORD, BASIC_TOKEN, BASIC_TOKEN[:12]):
        assert secret not in text


def test_an_echoing_target_and_a_huge_server_info_field_leave_no_secret_and_a_small_status() -> None:
    routes = {"/metrics": _echo_headers, "/server_info": _huge_server_info}
    with LoopbackServer(routes) as server:
        userinfo_url = server.base_url.replace("http://", f"http://admin:{PASSWORD}@")
        advisor = Advisor(config_from_dict({
            "targets": [{"name": "keyed", "url": server.base_url, "api_key": API_KEY},
                        {"name": "basic", "url": userinfo_url}],
            "interval_seconds": 5, "timeout_seconds": 2,
        }, {}))
        try:
            statuses = advisor.run_cycle(timeout=10)
            exporter = ExporterServer(advisor.store, "127.0.0.1", 0).start()
            try:
                status_page = requests.get(f"{exporter.url}/status", timeout=10).text
                landing = requests.get(f"{exporter.url}/", timeout=10).text
            finally:
                exporter.stop()
        finally:
            advisor.close()
    # the echo reached the parser (both headers were sent), and its error quotes the body
    sent = {headers.get("authorization") for _, headers in server.requests}
    assert f"Bearer {API_KEY}" in sent and f"Basic {BASIC_TOKEN}" in sent
    dumped = json.dumps([status.to_dict() for status in statuses])
    assert any("metrics" in error for status in statuses for error in status.last_errors)
    for text in (dumped, status_page, landing):
        _no_secret(text)
    assert len(status_page) < 200_000  # a 5 MB field contributes at most its cap
    assert all(len(status.info.get("version", "")) <= 200 for status in statuses)


def test_run_once_json_and_inspect_show_no_secret(capsys: pytest.CaptureFixture[str]) -> None:
    with LoopbackServer({"/metrics": _echo_headers, "/server_info": _huge_server_info}) as server:
        main(["run", "--once", "--json", "--target", server.base_url.replace("http://", f"http://admin:{PASSWORD}@")])
        once = capsys.readouterr()
        main(["inspect", "--url", server.base_url, "--api-key", API_KEY])
        inspected = capsys.readouterr()
    for text in (once.out, once.err, inspected.out, inspected.err):
        _no_secret(text)
    assert "<redacted>" in once.out + inspected.out + inspected.err
    assert len(once.out) < 200_000


def test_the_store_client_never_shows_a_basic_token_or_password() -> None:
    def echo(path: str, form: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
        return 401, f"unauthorized: {headers.get('authorization')}".encode()

    with LoopbackServer({}, post=echo) as store:
        by_flags = PrometheusClient(store.url, auth=StoreAuth(username="admin", password=PASSWORD)).query("up")
        in_url = PrometheusClient(store.url.replace("http://", f"http://admin:{PASSWORD}@")).query("up")
    for result in (by_flags, in_url):
        assert not result.ok and result.error is not None and "401" in result.error
        _no_secret(result.error)
    assert store.posts[0][2]["authorization"] == f"Basic {BASIC_TOKEN}"


@pytest.mark.parametrize("url", ["http://user:s3cr/etPW@host:80", "http://user:s3cr?etPW@host", "http://u:s3cr#etPW@h"])
def test_a_config_error_never_quotes_a_password_holding_a_slash(url: str) -> None:
    with pytest.raises(InputError) as error:
        config_from_dict({"targets": [{"url": url, "name": "x"}], "interval_seconds": "fast"}, {})
    assert "etPW" not in str(error.value) and "s3cr" not in str(error.value)
    assert "s3cr" not in redact_url(url)


def test_scrubbing_is_one_cut_line_with_credentials_replaced() -> None:
    text = scrub_text(f"Authorization: Bearer {API_KEY}\nX-Api-Key: {API_KEY[:20]}\x00 " + "z" * 10_000, 120)
    assert API_KEY[:20] not in text and "\n" not in text and "\x00" not in text and len(text) <= 120
    status = TargetStatus(server="s", model_name="m" * 1_000_000, last_errors=[f"token={API_KEY}"] * 1000)
    assert len(status.model_name) <= 200 and len(status.last_errors) <= 20
    _no_secret(json.dumps(status.to_dict()))
    figures = scrub_text("KV bytes per token: 12345; token=abc123")  # a figure stays, a credential goes
    assert figures.startswith("KV bytes per token: 12345; token") and "abc123" not in figures


# --- 3. YAML bombs -------------------------------------------------------------------------------------------


def test_a_billion_laughs_config_is_refused_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(InputError, match="aliases"):
        load_config(HOSTILE / "billion-laughs-config.yaml")
    assert time.monotonic() - started < 5  # (expanded, the error message took over 1 GB and 15 s)
    parse_config_text(b"a: &x 1\nb: 2\n")  # an anchor without an alias is fine


def test_a_billion_laughs_web_config_is_refused_at_once() -> None:
    with pytest.raises(InputError, match="aliases") as error:
        load_web_config(HOSTILE / "billion-laughs-web-config.yaml")
    assert len(str(error.value)) < 300


def test_a_huge_config_value_is_quoted_short() -> None:
    with pytest.raises(InputError) as error:
        config_from_dict({"targets": ["http://127.0.0.1:1"], "interval_seconds": [["x" * 100_000] * 50] * 50}, {})
    assert len(str(error.value)) < 200 and "interval_seconds" in str(error.value)


# --- 4. trickling clients against the exporter -----------------------------------------------------------------


def test_trickling_clients_are_cut_off_at_the_head_deadline_and_healthz_stays_prompt() -> None:
    store = SnapshotStore()
    store.publish([TargetStatus(server="a", up=True)], now=time.time())
    threads_before = threading.active_count()
    with ExporterServer(store, "127.0.0.1", 0, max_connections=100, header_timeout=1.0) as exporter:
        stop = threading.Event()
        cut_off: list[float] = []
        clients: list[socket.socket] = []
        for _ in range(300):  # three times the cap
            client = socket.create_connection(("127.0.0.1", exporter.port), timeout=5)
            client.sendall(b"GET /metrics HTTP/1.1\r\n")
            clients.append(client)

        def trickle(client: socket.socket, opened: float) -> None:
            try:
                while not stop.is_set():  # one header byte every 0.1 s: never idle, never done
                    client.sendall(b"X")
                    if stop.wait(0.1):
                        return
            except OSError:
                cut_off.append(time.monotonic() - opened)

        opened = time.monotonic()
        tricklers = [threading.Thread(target=trickle, args=(c, opened), daemon=True) for c in clients]
        for thread in tricklers:
            thread.start()
        try:
            latencies = []
            for _ in range(15):
                started = time.monotonic()
                health = requests.get(f"{exporter.url}/healthz", timeout=5)
                latencies.append(time.monotonic() - started)
                assert health.status_code == 200 and health.text == "ok\n"
                time.sleep(0.1)
            assert requests.get(f"{exporter.url}/metrics", timeout=5).status_code == 200
            assert max(latencies) < 1.0, latencies
            # the server's threads do not grow with the clients (its own: one listener, a few workers)
            assert threading.active_count() - threads_before - len(tricklers) <= 8
            wait_for(lambda: len(cut_off) == len(clients) or None, 20, what="every trickling client to be cut off")
        finally:
            stop.set()
            for client in clients:
                client.close()
    assert max(cut_off) < 10  # the head deadline (1 s) holds although each one keeps sending


def test_the_connection_cap_is_a_run_flag_with_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--target", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--max-connections", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "max connections" in err[0]


# --- 5. a lying or huge store ----------------------------------------------------------------------------------


def _vector(values: dict[str, str]) -> bytes:
    result = [{"metric": {"__name__": "sglang:num_running_reqs", "instance": name}, "value": [time.time(), value]}
              for name, value in values.items()]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def test_non_finite_samples_are_skipped_and_counted() -> None:
    answer = _vector({"a:1": "+Inf", "b:2": "NaN", "c:3": "-Inf", "d:4": "1e400", "e:5": "7"})
    with LoopbackServer({}, post=lambda path, form, headers: (200, answer)) as store:
        result = PrometheusClient(store.url).query("up")
    assert result.ok and [s.labels["instance"] for s in result.series] == ["e:5"]
    assert result.skipped_samples == 4 and any("not finite" in w for w in result.warnings)


def test_recommend_from_a_store_of_infinities_is_one_line_not_a_traceback() -> None:
    answer = _vector({"a:1": "+Inf", "b:2": "NaN"})
    with LoopbackServer({}, post=lambda path, form, headers: (200, answer)) as store:
        done = subprocess.run([sys.executable, "-m", "advisor", "recommend", "--prometheus-url", store.url,
                               "--store-timeout", "5s"], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and "OverflowError" not in done.stderr
    assert done.returncode in (0, 2) and len(done.stderr.strip().splitlines()) <= 1


def test_a_daemon_on_a_lying_store_counts_instead_of_crashing(caplog: pytest.LogCaptureFixture) -> None:
    answer = _vector({"a:1": "+Inf", "b:2": "NaN", "c:3": "5"})
    with LoopbackServer({}, post=lambda path, form, headers: (200, answer)) as store:
        advisor = Advisor(config_from_dict({"targets": [{"kind": "prometheus", "url": store.url, "server_info_url": ""}],
                                            "interval_seconds": 5, "timeout_seconds": 2}, {}))
        try:
            with caplog.at_level(logging.WARNING):
                statuses = advisor.run_cycle(timeout=30)
        finally:
            advisor.close()
    assert not [r for r in caplog.records if r.exc_info]  # no traceback
    assert [s.server for s in statuses] == ["c:3"]
    assert advisor.fleets[0].client.skipped_samples > 0


def test_a_store_trickling_its_body_ends_at_the_deadline() -> None:
    with HostileServer({"/": trickle_body(step=0.05, count=400)}) as server:
        started = time.monotonic()
        result = PrometheusClient(server.base_url, timeout_seconds=1.0).query("up")
        elapsed = time.monotonic() - started
    assert not result.ok and result.error is not None and "timed out after 1s" in result.error
    assert elapsed < 3  # (requests' per-read timeout let a 1 B/s body run for minutes)


def test_a_store_body_over_the_cap_is_refused_unread() -> None:
    answer = _vector({f"s{i}": "1" for i in range(40_000)})
    with LoopbackServer({}, post=lambda path, form, headers: (200, answer)) as store:
        result = PrometheusClient(store.url, max_body_bytes=1 << 20).query("up")
    assert not result.ok and result.error is not None and "body larger than" in result.error


def test_too_many_series_or_servers_is_a_counted_error_naming_the_cap() -> None:
    answer = _vector({f"10.0.{i // 250}.{i % 250}:30000": "1" for i in range(3000)})
    with LoopbackServer({}, post=lambda path, form, headers: (200, answer)) as store:
        capped = PrometheusClient(store.url, max_series=100).query("up")
        advisor = Advisor(config_from_dict({"targets": [{"kind": "prometheus", "url": store.url, "server_info_url": ""}],
                                            "interval_seconds": 5, "timeout_seconds": 2}, {}))
        try:
            advisor.run_cycle(timeout=60)
        finally:
            advisor.close()
    assert not capped.ok and capped.error is not None and "max_series=100" in capped.error
    fleet = advisor.fleets[0]
    assert fleet.store_errors_total >= 1 and fleet.last_error is not None and "max_servers_per_store" in fleet.last_error
    assert fleet.pipelines == {}


def test_deeply_nested_store_json_is_an_error_value() -> None:
    answer = b'{"status": "success", "data": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with LoopbackServer({}, post=lambda path, form, headers: (200, answer)) as store:
        result = PrometheusClient(store.url).query("up")
    assert not result.ok and result.error is not None and "nested too deeply" in result.error


# --- 6. an open boot block -------------------------------------------------------------------------------------


def test_an_open_boot_block_is_bounded_given_up_and_counted() -> None:
    parser = LogLineParser()
    head = "[2026-12-01 10:00:00 TP0] "
    parser.feed([head + "server_args=ServerArgs(model_path='m')"])
    line = head + "x" * 100_000
    for _ in range(100):  # 10 MB of log after a server_args line with no caps line
        parser.feed([line] * 10)
    assert parser.abandoned_boot_blocks >= 1
    held = parser._boot_lines or []
    assert sum(len(text) for text in held) <= 4 << 20


def test_bad_export_lines_are_counted_inside_an_open_boot_block() -> None:
    parser = LogLineParser()
    head = "[2026-12-01 10:00:00 TP0] "
    parser.feed([head + "server_args=ServerArgs(model_path='m')"])
    before = parser.bad_request_lines
    bad = ('[2026-12-01 10:00:01] {"event": "request.finished", "rid": "1", '
           '"out": {"meta_info": {"prompt_tokens": Infinity, "completion_tokens": 3}}}')
    parser.feed([bad])
    assert parser.bad_request_lines == before + 1


# --- 7. FIFOs and other special files ------------------------------------------------------------------------


@pytest.mark.parametrize("reader", [
    lambda path: read_boot_log(path),
    lambda path: load_hf_config(path),
    lambda path: load_web_config(path),
])
def test_a_fifo_where_a_file_is_read_is_refused_at_once(tmp_path: Path, reader: Any) -> None:
    fifo = _mkfifo(tmp_path / "named.pipe")
    with pytest.raises(InputError, match="not a regular file"):
        reader(fifo)


def test_cli_paths_that_are_fifos_are_one_line_errors(tmp_path: Path) -> None:
    fifo = _mkfifo(tmp_path / "pipe")
    config = tmp_path / "advisor.yaml"
    config.write_text(json.dumps({"targets": [{"url": "http://127.0.0.1:9", "boot_log": str(fifo)}],
                                  "interval_seconds": 5, "timeout_seconds": 1}))
    commands = [
        ["recommend", "--boot-log", str(fifo), "-L", "4096"],
        ["recommend", "--model-config", str(fifo), "-L", "4096"],
        ["run", "--target", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--web-config-file", str(fifo)],
    ]
    for command in commands:
        done = subprocess.run([sys.executable, "-m", "advisor", *command], capture_output=True, text=True, timeout=60)
        assert "Traceback" not in done.stderr, command
        assert "not a regular file" in done.stderr + done.stdout, command
    # in the daemon, a FIFO as a target's boot log is that target's counted error, not a hang
    done = subprocess.run([sys.executable, "-m", "advisor", "run", "--once", "--json", "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    (status,) = json.loads(done.stdout)
    assert status["scrape_errors_total"]["boot_log"] == 1 and "Traceback" not in done.stderr


def test_a_web_config_over_its_size_cap_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "web.yml"
    big.write_text("basic_auth_users:\n" + "".join(f"  u{i}: $2y$10$" + "x" * 53 + "\n" for i in range(200_000)))
    started = time.monotonic()
    with pytest.raises(InputError, match="larger than"):
        load_web_config(big)
    assert time.monotonic() - started < 2


# --- 8. tracebacks and noise -------------------------------------------------------------------------------------


def test_an_unusable_charset_is_read_as_utf8_and_counted() -> None:
    routes = {"/metrics": (200, "text/plain; version=0.0.4; charset=idna", GENUINE, 0.0)}
    with LoopbackServer(routes) as server:
        with HttpClient(2.0) as client:
            result = client.get_text(server.base_url + "/metrics")
            warnings = client.take_warnings()
        advisor = Advisor(config_from_dict({"targets": [server.base_url], "interval_seconds": 5, "timeout_seconds": 2}, {}))
        try:
            (status,) = advisor.run_cycle(timeout=10)
        finally:
            advisor.close()
    assert result.ok and isinstance(result.body, str) and "sglang:" in result.body
    assert result.warning is not None and "idna" in result.warning and len(warnings) == 1
    assert status.up and status.scrape_errors_total["metrics"] == 1 and "idna" in " ".join(status.last_errors)


def test_deep_json_and_list_values_in_configs_are_one_line_errors() -> None:
    with pytest.raises(InputError, match="nested too deeply"):
        load_hf_config(HOSTILE / "deep-model-config.json")
    with pytest.raises(InputError, match="client_auth_type|min_version"):
        load_web_config(HOSTILE / "web-config-list-values.yaml")


@pytest.mark.parametrize("argv", [["recommend", "-L", "abc"], ["run", "--interval", "soon"], ["inspect", "--timeout", "x"],
                                  ["nosuchcommand"]])
def test_usage_errors_are_one_line_with_exit_2(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "advisor", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "error:" in done.stderr
