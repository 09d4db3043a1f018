"""`pool-advisor run` as an operator starts it: --web-config-file puts basic auth in front of the
exporter (/healthz stays open), --log-level info gives one line per cycle with the decision and none
of APScheduler's per-run lines, SIGTERM ends it with 0; a bad web config is one line and exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import bcrypt
import requests
from prom_harness import free_loopback_port, wait_for


def test_daemon_with_basic_auth_and_one_log_line_per_cycle(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{bcrypt.hashpw(b'pw', bcrypt.gensalt(4)).decode()}'\n")
    port, dead = free_loopback_port(), free_loopback_port()
    daemon = subprocess.Popen(
        [sys.executable, "-m", "advisor", "run", "--target", f"http://127.0.0.1:{dead}", "--interval", "0.5",
         "--listen", f"127.0.0.1:{port}", "--web-config-file", str(web), "--log-level", "info"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "POOL_ADVISOR_TIMEOUT_SECONDS": "0.4"})
    try:
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                return requests.get(f"{url}/healthz", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_for(healthy, timeout=30, what="the daemon's /healthz")
        assert requests.get(f"{url}/metrics", timeout=5).status_code == 401
        wait_for(lambda: "sglang_advisor_target_up{" in requests.get(f"{url}/metrics", auth=("prometheus", "pw"),
                                                                   timeout=5).text,
                 timeout=30, what="a published cycle behind basic auth")
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, err
    cycle_lines = [line for line in err.splitlines() if "INFO pool_advisor: cycle " in line]
    assert cycle_lines, err
    assert "1 target(s), 0 up" in cycle_lines[0] and f"127.0.0.1:{dead} insufficient_data" in cycle_lines[0]
    assert "Running job" not in err and "executed successfully" not in err  # APScheduler's per-run lines
    assert "Traceback" not in err


def test_a_bad_web_config_is_one_line_and_exit_2(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: plaintext\n")
    result = subprocess.run([sys.executable, "-m", "advisor", "run", "--target", "http://127.0.0.1:1",
                             "--web-config-file", str(web)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "must be a bcrypt hash" in result.stderr
