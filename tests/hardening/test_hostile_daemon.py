"""The daemon against hostile loopback targets: a trickling target is abandoned per cycle, counted and shown
while a healthy one keeps its rate; SIGTERM ends the process while a target trickles; a password in a target
URL never reaches /status, `/`, /metrics, `run --once` or the checkpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import requests
from hostile_servers import HostileServer, respond, trickle_headers
from support import LOGS, METRICS, free_loopback_port, wait_for

from advisor.cli import main
from advisor.config import config_from_dict
from advisor.daemon.runner import Advisor

GENUINE = (METRICS / "sglang-0.5.23-single.prom").read_bytes()
PASSWORD = "pw-hardening-s3cret"


def test_trickling_target_is_abandoned_counted_and_shown_while_a_healthy_one_keeps_its_rate() -> None:
    routes = {"/slow/": trickle_headers(GENUINE), "/ok/metrics": respond(lambda n: GENUINE)}
    with HostileServer(routes) as server:
        advisor = Advisor(config_from_dict({
            "targets": [{"name": "slow", "url": server.base_url + "/slow"}, {"name": "ok", "url": server.base_url + "/ok"}],
            "interval_seconds": 1.0, "timeout_seconds": 0.9,
        }, {}))
        try:
            advisor.run_cycle(timeout=0.7)  # the slow target's cycle needs >= 1.8 s (two requests to their deadline)
            shown = advisor.latest["slow"]  # shown at once, down, with the reason
            assert not shown.up and shown.scrape_errors_total["deadline"] == 1
            assert any("deadline" in error for error in shown.last_errors)
            for _ in range(2):
                advisor.run_cycle(timeout=0.7)
            healthy, slow = advisor.pipelines[1], advisor.pipelines[0]
            assert healthy.cycles == 3  # never skipped, never waited for the slow one
            assert advisor.latest["ok"].up
            # its own cycles end by the HTTP deadline (0.9 s per request), so it is never stuck for good
            wait_for(lambda: advisor._busy["slow"].done() or None, 10, what="the slow target's cycle to end")
            assert slow.errors_total["metrics"] >= 1
        finally:
            advisor.close()


def test_sigterm_ends_the_daemon_while_a_target_trickles(tmp_path) -> None:
    routes = {"/": trickle_headers(GENUINE, step=0.05, count=2000)}
    with HostileServer(routes) as server:
        port = free_loopback_port()
        url = server.base_url.replace("http://", f"http://admin:{PASSWORD}@")
        config = tmp_path / "advisor.yaml"
        checkpoint = tmp_path / "ckpt.json"
        config.write_text(json.dumps({
            "targets": [url], "interval_seconds": 1.0, "timeout_seconds": 0.9,
            "listen": f"127.0.0.1:{port}", "checkpoint_path": str(checkpoint),
        }))
        daemon = subprocess.Popen([sys.executable, "-m", "advisor", "run", "--config", str(config)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def shown() -> dict | None:
                try:
                    targets = requests.get(f"http://127.0.0.1:{port}/status", timeout=2).json().get("targets")
                except (requests.RequestException, ValueError):
                    return None
                return targets[0] if targets else None

            status = wait_for(shown, 30, interval=0.1, what="the trickling target in /status")
            assert status["up"] is False and status["server"] == server.base_url.split("://")[1]
            wait_for(lambda: checkpoint.exists() or None, 30, what="a checkpoint")
            pages = [requests.get(f"http://127.0.0.1:{port}{path}", timeout=5).text for path in ("/", "/status", "/metrics")]
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                out, err = daemon.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                out, err = daemon.communicate()
                raise AssertionError("SIGTERM did not end the daemon within 30 s") from None
        assert daemon.returncode == 0, err
        for text in (*pages, out, err, checkpoint.read_text()):
            assert PASSWORD not in text and "admin:" not in text


def test_run_once_never_shows_the_password(capsys) -> None:
    with HostileServer({"/": respond(lambda n: GENUINE)}) as server:
        url = server.base_url.replace("http://", f"http://admin:{PASSWORD}@")
        main(["run", "--once", "--json", "--target", url, "--interval", "10"])
        out, err = capsys.readouterr()
        statuses = json.loads(out)
        assert statuses[0]["server"] == server.base_url.split("://")[1]
        main(["run", "--once", "--target", url.rstrip("/") + "/nothing-here", "--interval", "10"])
        out2, err2 = capsys.readouterr()
    for text in (out, err, out2, err2):
        assert PASSWORD not in text and "admin:" not in text


def test_bad_request_log_lines_are_skipped_and_counted_under_logs(tmp_path) -> None:
    good = [line for line in (LOGS / "requests-json.log").read_text().splitlines() if line.strip()][:20]
    head = good[0].split("] ", 1)[0] + "] "
    bad = [
        head + good[0].split("] ", 1)[1].replace('"prompt_tokens": 1194', '"prompt_tokens": Infinity'),
        head + good[0].split("] ", 1)[1].replace('"prompt_tokens": 1194', '"prompt_tokens": 1e400'),
        head + '{"event": "request.finished", "out": ' + "[" * 5000 + "]" * 5000 + "}",
    ]
    log = tmp_path / "requests.log"
    log.write_text("\n".join(good[:10] + bad + good[10:]) + "\n")
    with HostileServer({"/": respond(lambda n: GENUINE)}) as server:
        advisor = Advisor(config_from_dict({"targets": [{"name": "t", "url": server.base_url, "log_paths": [str(log)]}],
                                            "interval_seconds": 5.0, "timeout_seconds": 2.0}, {}))
        try:
            status = advisor.run_cycle()[0]
            report = advisor.reports["t"]
        finally:
            advisor.close()
    assert report.request_records == len(good)  # every good line kept, before and after the bad ones
    assert status.scrape_errors_total["logs"] >= 1
    assert status.scrape_errors_total["internal"] == 0 and status.scrape_errors_total["metrics"] == 0


def test_a_target_stuck_from_an_earlier_cycle_does_not_stretch_later_cycles() -> None:
    # The slow target trickles for 60 s under a 20 s HTTP deadline: its cycle lasts ~40 s. A later cycle with a
    # 45 s budget must return once the healthy target is done, not when the stuck one ends.
    routes = {"/slow/": trickle_headers(GENUINE, step=0.05, count=1200), "/ok/": respond(lambda n: GENUINE)}
    with HostileServer(routes) as server:
        advisor = Advisor(config_from_dict({
            "targets": [{"name": "slow", "url": server.base_url + "/slow"}, {"name": "ok", "url": server.base_url + "/ok"}],
            "interval_seconds": 60.0, "timeout_seconds": 20.0,
        }, {}))
        try:
            advisor.run_cycle(timeout=0.5)
            advisor.run_cycle(timeout=45.0)
            assert not advisor._busy["slow"].done()  # returned while the stuck target still runs
            assert advisor.pipelines[1].cycles == 2 and advisor.latest["ok"].up
            assert advisor.latest["slow"].scrape_errors_total["deadline"] == 2
        finally:
            advisor.close()
