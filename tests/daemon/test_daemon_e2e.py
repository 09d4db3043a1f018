"""The daemon against the emulated SGLang server on loopback: restarts, kill -9, signals, config errors.

In-process tests share one ManualClock between the emulator and the advisor and step it: the simulation moves
only between cycles, so the runs are deterministic and sleep-free. Tests of the `run` process use real time
and poll for conditions."""

import json
import os
import signal
import subprocess
import sys

import pytest
import requests
from support import free_loopback_port, wait_for

from advisor.config import config_from_dict
from advisor.daemon.runner import Advisor
from advisor.sim.clock import ManualClock
from advisor.sim.config import load_server_config
from advisor.sim.emulator import EmulatedServer
from advisor.sim.workload import load_workload

SPEED = 120.0  # for the tests of the `run` process, which run on real time
STEP_SECONDS = 30.0  # simulated seconds between two cycles of the in-process tests


@pytest.fixture
def emulator(tmp_path):
    """An emulated server on real time (sped up), for the tests of the `run` process."""
    log_path = tmp_path / "sglang.log"
    server = EmulatedServer(load_server_config("default"), load_workload("demo"), speed=SPEED, log_path=str(log_path),
                            request_log_path=str(log_path))
    server.start()
    yield server, log_path
    server.stop()


@pytest.fixture
def stepped(tmp_path):
    """An emulated server on a manual clock the advisor shares: (server, log path, clock)."""
    clock = ManualClock()
    log_path = tmp_path / "sglang.log"
    server = EmulatedServer(load_server_config("default"), load_workload("demo"), log_path=str(log_path),
                            request_log_path=str(log_path), clock=clock)
    server.start()
    yield server, log_path, clock
    server.stop()


def make_advisor(url, log_path, tmp_path, clock, **extra):
    return Advisor(config_from_dict({
        "targets": [{"name": "emu", "url": url, "log_paths": [str(log_path)]}],
        "interval_seconds": STEP_SECONDS, "timeout_seconds": 5.0,
        "checkpoint_path": str(tmp_path / "ckpt.json"),
        # these scenarios run minutes, not the half hour a replay waits for by default
        "replay_min_window_seconds": 300.0, **extra,
    }), wall_clock=clock.time)


def cycles(advisor, server, clock, count):
    """`count` cycles, each after STEP_SECONDS of simulated serving (the emulator's logs written first)."""
    status = None
    for _ in range(count):
        clock.advance(STEP_SECONDS)
        server.sync()
        status = advisor.run_cycle(timeout=30.0)[0]
    return status


def test_restart_with_a_new_ratio_rederives(stepped, tmp_path):
    server, log_path, clock = stepped
    advisor = make_advisor(server.url, log_path, tmp_path, clock)
    before = cycles(advisor, server, clock, 16)
    assert before.recommendation.live_ratio == pytest.approx(0.9)
    assert before.recommendation.decision == "raise_ratio"
    # the operator applies the advice: the advisor re-derives the pools at the new split and holds there
    applied = round(before.recommendation.ratio, 2)
    requests.post(f"{server.url}/_emulator/restart?ratio={applied}", timeout=5).raise_for_status()
    after = cycles(advisor, server, clock, 8)
    assert after.recommendation.live_ratio == pytest.approx(applied)
    assert after.recommendation.predicted_max_running_requests_live > before.recommendation.predicted_max_running_requests_live
    assert after.recommendation.decision == "hold", after.recommendation.reason
    assert after.recommendation.reason_code in ("inside_bounds", "gain_below_threshold")
    # the workload history survives the server restart
    assert after.workload.requests_observed > before.workload.requests_observed
    advisor.close()


def test_history_survives_a_daemon_restart(stepped, tmp_path):
    server, log_path, clock = stepped
    first = make_advisor(server.url, log_path, tmp_path, clock)
    seen = cycles(first, server, clock, 8).workload.requests_observed
    first.close()
    second = make_advisor(server.url, log_path, tmp_path, clock)
    assert second.load_checkpoint() is None
    resumed = cycles(second, server, clock, 1)
    # resumed with the history (no double counting of the lifetime totals on the first scrape)
    assert seen <= resumed.workload.requests_observed < seen * 1.5
    assert resumed.recommendation.confidence > 0
    second.close()


def start_daemon(tmp_path, url, log_path, port):
    config = tmp_path / "advisor.yaml"
    config.write_text(json.dumps({
        "targets": [{"name": "emu", "url": url, "log_paths": [str(log_path)]}],
        "interval_seconds": 0.5, "time_scale": SPEED, "timeout_seconds": 0.45,
        "checkpoint_path": str(tmp_path / "ckpt.json"), "listen": f"127.0.0.1:{port}",
    }))
    return subprocess.Popen([sys.executable, "-m", "advisor", "run", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def daemon_status(port):
    """The daemon's /status for its one target, or None while it is not up yet."""
    try:
        status = requests.get(f"http://127.0.0.1:{port}/status", timeout=2).json()
    except (requests.RequestException, ValueError):
        return None
    return status["targets"][0] if status.get("targets") else None


def wait_for_requests(port, minimum, timeout=30.0):
    def reached():
        target = daemon_status(port)
        return target if target and target["workload"]["requests_observed"] >= minimum else None

    return wait_for(reached, timeout, interval=0.1, what=f"the daemon to observe {minimum} requests")


def test_kill_9_mid_run_then_restart_keeps_history(emulator, tmp_path):
    server, log_path = emulator
    port = free_loopback_port()
    daemon = start_daemon(tmp_path, server.url, log_path, port)
    try:
        before = wait_for_requests(port, 300)
        # one more checkpoint lands after the status we read (the kill may then hit mid-write)
        written = os.stat(tmp_path / "ckpt.json").st_mtime_ns
        wait_for(lambda: os.stat(tmp_path / "ckpt.json").st_mtime_ns > written, 10, what="a newer checkpoint")
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
    checkpoint = json.loads((tmp_path / "ckpt.json").read_text())
    assert checkpoint["state"]["targets"]["emu"]["estimator"]["requests_total"] >= before["workload"]["requests_observed"] * 0.5
    daemon = start_daemon(tmp_path, server.url, log_path, port)
    try:
        resumed = wait_for_requests(port, before["workload"]["requests_observed"])
        assert resumed["recommendation"]["confidence"] > 0
    finally:
        daemon.send_signal(signal.SIGTERM)
        out, err = daemon.communicate(timeout=20)
    assert daemon.returncode == 0, err


def test_sigterm_flushes_the_checkpoint_and_exits_0(emulator, tmp_path):
    server, log_path = emulator
    port = free_loopback_port()
    daemon = start_daemon(tmp_path, server.url, log_path, port)
    wait_for_requests(port, 100)
    # /status is published at the end of a cycle, its checkpoint written just after: wait for that write
    checkpoint = tmp_path / "ckpt.json"
    wait_for(checkpoint.exists, 20.0, what="the first checkpoint")
    mtime_before = os.stat(checkpoint).st_mtime_ns
    daemon.send_signal(signal.SIGTERM)
    out, err = daemon.communicate(timeout=20)
    assert daemon.returncode == 0, err
    assert os.stat(tmp_path / "ckpt.json").st_mtime_ns >= mtime_before
    assert json.loads((tmp_path / "ckpt.json").read_text())["state"]["targets"]["emu"]["estimator"]["requests_total"] >= 100


def test_a_hanging_emulated_target_does_not_delay_a_healthy_one(emulator, tmp_path):
    server, log_path = emulator
    hanging = EmulatedServer(load_server_config("default"), load_workload("demo"), speed=SPEED)
    hanging.start()
    try:
        hanging.set_fault("hang")
        advisor = Advisor(config_from_dict({
            "targets": [{"name": "hang", "url": hanging.url}, {"name": "ok", "url": server.url}],
            "interval_seconds": 0.5, "timeout_seconds": 3.0,
        }))
        advisor.run_cycle(timeout=0.8)
        # the cycle came back while the hanging target still waits on its 3 s timeout
        assert not advisor._busy["hang"].done()
        assert advisor.latest["ok"].up
        # shown down with the reason and counted, not missing from /status (issue 10)
        assert not advisor.latest["hang"].up and advisor.latest["hang"].scrape_errors_total["deadline"] == 1
        advisor.close()
    finally:
        hanging.stop()


@pytest.mark.parametrize(
    ("content", "message"),
    [("interval_secs: 3\ntargets: [http://127.0.0.1:1]\n", "unknown field 'interval_secs'"),
     ("targets: [{url: 'http://127.0.0.1:1', timeout: 3}]\n", "unknown field 'timeout' in targets[0]")],
)
def test_config_error_exits_2_naming_the_field(tmp_path, content, message):
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    proc = subprocess.run([sys.executable, "-m", "advisor", "run", "--config", str(config), "--once"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_once_prints_the_recommendation(emulator, tmp_path):
    server, _ = emulator
    wait_for(lambda: server.url and requests.get(f"{server.url}/metrics", timeout=2).ok, 10, what="the emulator")
    proc = subprocess.run([sys.executable, "-m", "advisor", "run", "--target", server.url, "--once", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)[0]
    assert status["up"] and status["recommendation"]["decision"] in ("insufficient_data", "raise_ratio")


def test_older_sglang_0_5_10_profile_still_gets_a_recommendation(tmp_path):
    """0.5.10: `mamba_scheduler_strategy`, no slot gauges, token histograms only with the collect flag."""
    log_path = tmp_path / "sglang.log"
    clock = ManualClock()
    server = EmulatedServer(load_server_config("default"), load_workload("demo"), log_path=str(log_path),
                            version_profile="0.5.10", collect_tokens_histogram=True, clock=clock)
    server.start()
    try:
        advisor = make_advisor(server.url, log_path, tmp_path, clock)
        status = cycles(advisor, server, clock, 14)
        assert status.up
        assert advisor.pipelines[0].server_info.serving.strategy == "extra_buffer"
        assert status.info["version"] == "0.5.10"
        assert status.recommendation.decision == "raise_ratio", status.recommendation.reason
        assert status.recommendation.reason_code == "state_pool_short"
        assert status.recommendation.ratio > 4
        advisor.close()
    finally:
        server.stop()


def test_api_key_is_sent_and_never_shown(tmp_path):
    server = EmulatedServer(load_server_config("default"), load_workload("demo"), speed=SPEED, api_key="sk-secret-123")
    server.start()
    try:
        keyed = Advisor(config_from_dict({"targets": [{"name": "k", "url": server.url, "api_key": "sk-secret-123"}],
                                          "timeout_seconds": 2.0}))
        status = keyed.run_cycle(timeout=5.0)[0]
        assert status.up and keyed.pipelines[0].server_info is not None
        keyed.close()
        keyless = Advisor(config_from_dict({"targets": [{"name": "n", "url": server.url, "api_key": "wrong-key-456"}],
                                            "timeout_seconds": 2.0}))
        status = keyless.run_cycle(timeout=5.0)[0]
        assert status.scrape_errors_total["server_info"] == 1  # /server_info needs the key; /metrics is open
        assert "wrong-key-456" not in json.dumps(status.to_dict(), default=str)
        keyless.close()
    finally:
        server.stop()
