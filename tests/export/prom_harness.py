"""Test harness: runs Debian's real `prometheus` (and `promtool`) on loopback for tests.

`require_binary(name)` skips a test when the binary is missing (saying `apt-get install prometheus`) and
fails it instead when POOL_ADVISOR_REQUIRE_BINARIES=1 (CI). `PrometheusServer` starts prometheus on a free
127.0.0.1 port with a temp config and data dir, waits for readiness, queries its HTTP API and always stops
it; the `prometheus_server` fixture hands out a factory that tears every started server down.
Import the fixture into a test module with `from prom_harness import prometheus_server`.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from support import REQUIRE_BINARIES_ENV, free_loopback_port, require_binary, wait_for  # noqa: F401 (re-exported)


def run_promtool(*args: str, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run promtool with `args`, returning the completed process (never raises on a non-zero exit)."""
    promtool = require_binary("promtool")
    return subprocess.run(
        [promtool, *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


class PrometheusServer:
    """One prometheus process on 127.0.0.1 with its own config file, rule files and TSDB under `workdir`."""

    def __init__(
        self,
        workdir: Path,
        scrape_targets: Mapping[str, Sequence[str]],
        rule_files: Mapping[str, str] | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        relabel_configs: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    ) -> None:
        self.workdir = workdir
        self.relabel_configs = {job: list(rules) for job, rules in (relabel_configs or {}).items()}
        self.scrape_targets = {job: list(targets) for job, targets in scrape_targets.items()}
        self.rule_files = dict(rule_files or {})
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("prometheus is not started")
        return f"http://127.0.0.1:{self.port}"

    def write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        rule_paths = []
        for name, text in self.rule_files.items():
            path = self.workdir / name
            path.write_text(text)
            rule_paths.append(str(path))
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,  # must not exceed the interval
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": rule_paths,
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}],
                 **({"relabel_configs": self.relabel_configs[job]} if job in self.relabel_configs else {})}
                for job, targets in self.scrape_targets.items()
            ],
        }
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        return config_path

    def start(self, ready_timeout: float = 15.0, attempts: int = 3) -> PrometheusServer:
        """Start and wait until /-/ready answers; retry on a new port if the probed one got taken."""
        for attempt in range(attempts):
            try:
                return self._start_once(ready_timeout)
            except RuntimeError as error:
                if "address already in use" not in str(error) or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, ready_timeout: float) -> PrometheusServer:
        binary = require_binary("prometheus")
        config_path = self.write_config()
        data_dir = self.workdir / "data"
        data_dir.mkdir(exist_ok=True)
        self.port = free_loopback_port()
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={data_dir}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(self._ready, ready_timeout, what=f"prometheus ready on {self.url}")
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"prometheus did not become ready:\n{self.log_tail()}") from None
        return self

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}")
        try:
            return requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no prometheus log)"

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; returns `data`, raising on an API error."""
        response = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=5)
        body = response.json()
        if body.get("status") != "success":
            raise AssertionError(f"prometheus API {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the list of result series (`metric` labels and `value` [ts, "v"])."""
        data = self.api("query", query=expr)
        result = data["result"]
        return result if isinstance(result, list) else [{"metric": {}, "value": result}]

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])

    def targets_up(self) -> bool:
        active = self.api("targets")["activeTargets"]
        return bool(active) and all(target.get("health") == "up" for target in active)


@pytest.fixture
def prometheus_server(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """Factory fixture: `prometheus_server(scrape_targets={...}, rule_files={...})` -> a started server.

    Every server started through it is stopped at teardown, whatever the test did.
    """
    started: list[PrometheusServer] = []

    def start(
        scrape_targets: Mapping[str, Sequence[str]],
        rule_files: Mapping[str, str] | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
    ) -> PrometheusServer:
        server = PrometheusServer(
            tmp_path / f"prometheus-{len(started)}",
            scrape_targets,
            rule_files,
            scrape_interval=scrape_interval,
            evaluation_interval=evaluation_interval,
        )
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
