"""The daemon against a hostile world, two soaks.

`world` (the default) runs `pool-advisor run` as a process for a bounded time while 3,000 clients trickle one
header line each every 5 s into its exporter (reconnecting when cut off, then all closing together), a store
target answers lies in turn (+Inf/NaN samples, a body over the cap, JSON nested 200,000 deep, 100,000 series),
a second store trickles its body at 20 B/s, and a genuine SGLang target is scraped alongside. It prints the
daemon's peak RSS, the longest /healthz latency and the SIGTERM-to-exit time against their targets
(RSS < 300 MB, /healthz < 1 s throughout, exit < 2 s).

`churn` runs the daemon in process against a target whose label sets change every scrape (a request id in a
label): RSS should stay flat once warm, and a healthy target scraped alongside keeps its rate.

    python bench/hostile_soak.py                          # world, 60 s
    python bench/hostile_soak.py world --seconds 120 --clients 3000
    python bench/hostile_soak.py churn --cycles 1000 --series 2000 --label-bytes 4000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "hardening"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import requests  # noqa: E402
from hostile_servers import HostileServer, respond, trickle_body  # noqa: E402
from support import LoopbackServer, free_loopback_port  # noqa: E402

from advisor.config import config_from_dict  # noqa: E402
from advisor.daemon.runner import Advisor  # noqa: E402

GENUINE = (REPO / "tests" / "fixtures" / "metrics" / "sglang-0.5.23-single.prom").read_bytes()


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 1e6


def churn(args: argparse.Namespace) -> int:
    def churning(n: int) -> bytes:
        lines = [f'sglang:num_requests_total{{model_name="m",rid="{n}-{i}-{"z" * args.label_bytes}"}} {i}.0\n'
                 for i in range(args.series)]
        return GENUINE + "".join(lines).encode()

    with HostileServer({"/churn/": respond(churning), "/ok/": respond(lambda n: GENUINE)}) as server:
        advisor = Advisor(config_from_dict({
            "targets": [{"name": "churn", "url": server.base_url + "/churn"}, {"name": "ok", "url": server.base_url + "/ok"}],
            "interval_seconds": 1.0, "timeout_seconds": 0.9,
        }, {}))
        started = time.monotonic()
        print(f"{'cycle':>6s} {'RSS MB':>8s} {'churn cycles':>13s} {'ok cycles':>10s} {'churn errors':>13s}")
        try:
            for cycle in range(1, args.cycles + 1):
                advisor.run_cycle(timeout=5.0)
                if cycle in (1, 10, 50) or cycle % 100 == 0:
                    churn, ok = advisor.pipelines
                    errors = sum(churn.errors_total.values())
                    print(f"{cycle:6d} {rss_mb():8.1f} {churn.cycles:13d} {ok.cycles:10d} {errors:13d}")
        finally:
            advisor.close()
        body = len(churning(0)) / 1e6
        print(f"{args.cycles} cycles in {time.monotonic() - started:.0f} s; churning body {body:.1f} MB per scrape")
    return 0


# --- world -----------------------------------------------------------------------------------------------


def _vector(values: dict[str, str]) -> bytes:
    result = [{"metric": {"__name__": "sglang:num_running_reqs", "instance": name}, "value": [time.time(), value]}
              for name, value in values.items()]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def lying_answers() -> list[bytes]:
    """What the lying store answers, in turn: infinities and NaN, 40 MB, deep nesting, 100,000 servers."""
    return [
        _vector({"a:1": "+Inf", "b:2": "NaN", "c:3": "-Inf", "d:4": "1e400", "e:5": "3"}),
        b'{"status": "success", "data": {"resultType": "vector", "result": [' + b'{"metric": {}, "value": [1, "1"]},' * 1_200_000 + b"{}]}}",
        b'{"status": "success", "data": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        _vector({f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:30000": "1" for i in range(100_000)}),
    ]


class TrickleFlood(threading.Thread):
    """`clients` connections to the exporter, each sending one header line every `period` seconds (spread
    evenly) and reconnecting when the server cuts it off; one thread for all of them."""

    def __init__(self, port: int, clients: int, period: float) -> None:
        super().__init__(name="trickle-flood", daemon=True)
        self.port, self.clients, self.period = port, clients, period
        self.stop = threading.Event()
        self.sockets: list[socket.socket | None] = [None] * clients
        self.connects = self.cut_off = self.connect_failures = 0

    def run(self) -> None:
        started = time.monotonic()
        turn = 0
        while not self.stop.is_set():
            for index in range(self.clients):
                if self.stop.is_set():
                    return
                due = started + turn * self.period + index * self.period / self.clients
                delay = due - time.monotonic()
                if delay > 0 and self.stop.wait(delay):
                    return
                self._poke(index)
            turn += 1

    def _poke(self, index: int) -> None:
        sock = self.sockets[index]
        try:
            if sock is None:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=1.0)
                sock.setblocking(False)
                self.sockets[index] = sock
                self.connects += 1
                sock.send(b"GET /metrics HTTP/1.1\r\n")
            else:
                sock.send(b"X-Trickle: 1\r\n")
        except BlockingIOError:
            pass
        except OSError:
            if sock is None:
                self.connect_failures += 1
            else:
                self.cut_off += 1
                sock.close()
            self.sockets[index] = None

    def close_all(self) -> None:
        """Every client closes at once (the issue's "then close together")."""
        self.stop.set()
        self.join(timeout=10)
        for sock in self.sockets:
            if sock is not None:
                sock.close()
        self.sockets = [None] * self.clients


def _probe_process(url: str, every: float, stop: Any, results: Any) -> None:
    """GET /healthz every `every` seconds on a fresh connection until `stop`; latencies and failures go to
    `results`. Its own process, so the flood and the fake stores in this one never delay a probe."""
    latencies, failures = [], []
    while not stop.wait(every):
        started = time.monotonic()
        try:
            response = requests.get(url, timeout=10, headers={"Connection": "close"})
            if response.status_code != 200:
                failures.append(f"HTTP {response.status_code}")
        except requests.RequestException as exc:
            failures.append(type(exc).__name__)
        latencies.append(time.monotonic() - started)
        results["latencies"], results["failures"] = list(latencies), list(failures)


class HealthProbe:
    """GET /healthz every `every` seconds on a fresh connection, from a child process; the longest latency
    and the failures."""

    def __init__(self, url: str, every: float = 0.2) -> None:
        self._manager = multiprocessing.Manager()
        self._stop = self._manager.Event()
        self._results = self._manager.dict(latencies=[], failures=[])
        self._process = multiprocessing.Process(target=_probe_process, args=(url, every, self._stop, self._results),
                                                daemon=True)

    def start(self) -> None:
        self._process.start()

    @property
    def latencies(self) -> list[float]:
        return list(self._results["latencies"])

    @property
    def failures(self) -> list[str]:
        return list(self._results["failures"])

    def finish(self) -> tuple[list[float], list[str]]:
        self._stop.set()
        self._process.join(timeout=15)
        latencies, failures = self.latencies, self.failures
        self._manager.shutdown()
        return latencies, failures


def rss_of(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of `pid` in MB."""
    values = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def world(args: argparse.Namespace) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = args.clients + 512
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, needed * 2), hard))
    answers = lying_answers()
    turn = {"n": 0}

    def lie(path: str, form: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
        turn["n"] += 1
        return 200, answers[turn["n"] % len(answers)]

    genuine = {"/metrics": (200, "text/plain; version=0.0.4", GENUINE, 0.0)}
    with LoopbackServer({}, post=lie) as store, HostileServer({"/": trickle_body(step=0.05, count=100_000)}) as slow, \
            LoopbackServer(genuine) as target, tempfile.TemporaryDirectory() as scratch:
        port = free_loopback_port()
        config = Path(scratch) / "advisor.yaml"
        config.write_text(json.dumps({
            "targets": [
                {"url": target.base_url, "name": "genuine"},
                {"kind": "prometheus", "name": "lying", "url": store.url, "server_info_url": "", "timeout_seconds": "2s"},
                {"kind": "prometheus", "name": "trickling", "url": slow.base_url, "server_info_url": "",
                 "timeout_seconds": "2s"},
            ],
            "interval_seconds": args.interval, "timeout_seconds": min(2.0, args.interval / 2),
            "listen": f"127.0.0.1:{port}", "checkpoint_path": str(Path(scratch) / "checkpoint.json"),
        }))
        daemon = subprocess.Popen([sys.executable, "-m", "advisor", "run", "--config", str(config), "--log-level", "warning"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or daemon.poll() is not None:
                print("the daemon did not start:", daemon.stderr.read() if daemon.stderr else "")
                daemon.kill()
                return 1
            time.sleep(0.2)
        stderr_lines: list[str] = []
        reader = threading.Thread(target=lambda: stderr_lines.extend(daemon.stderr or []), daemon=True)
        reader.start()
        probe = HealthProbe(f"{base}/healthz")
        flood = TrickleFlood(port, args.clients, args.period)
        probe.start()
        flood.start()
        peak_rss = 0.0
        started = time.monotonic()
        print(f"{'seconds':>8s} {'RSS MB':>8s} {'clients open':>13s} {'cut off':>8s} {'healthz max s':>14s} {'errors shown':>13s}")
        next_report = started
        while time.monotonic() - started < args.seconds:
            time.sleep(0.5)
            rss, _hwm = rss_of(daemon.pid)
            peak_rss = max(peak_rss, rss)
            if time.monotonic() >= next_report:
                next_report += 10
                try:
                    status = requests.get(f"{base}/status", timeout=5).json()
                    errors = sum(sum(t["scrape_errors_total"].values()) for t in status["targets"])
                except (requests.RequestException, ValueError):
                    errors = -1
                open_clients = sum(1 for s in flood.sockets if s is not None)
                worst = max(probe.latencies, default=0.0)
                print(f"{time.monotonic() - started:8.0f} {rss:8.1f} {open_clients:13d} {flood.cut_off:8d} {worst:14.3f} {errors:13d}")
        flood.close_all()
        time.sleep(2)  # /healthz keeps being probed after the clients closed together
        latencies, failures = probe.finish()
        _rss, hwm = rss_of(daemon.pid)
        sent = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        try:
            code = daemon.wait(timeout=30)
            exit_seconds = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            daemon.kill()
            code, exit_seconds = daemon.wait(), float("inf")
        reader.join(timeout=5)
    tracebacks = sum("Traceback" in line for line in stderr_lines)
    worst = max(latencies, default=float("inf"))
    print(f"{args.seconds:.0f} s, {args.clients} trickling clients ({flood.connects} connects, {flood.cut_off} cut off, "
          f"{flood.connect_failures} connects refused), {turn['n']} lying store answers")
    print(f"peak RSS (VmHWM): {hwm:.0f} MB (sampled peak {peak_rss:.0f} MB); target < 300 MB: {'met' if hwm < 300 else 'MISSED'}")
    print(f"longest /healthz: {worst:.3f} s over {len(latencies)} probes, {len(failures)} failed; "
          f"target < 1 s: {'met' if worst < 1 and not failures else 'MISSED'}")
    print(f"SIGTERM to exit: {exit_seconds:.2f} s (exit code {code}); target < 2 s: {'met' if exit_seconds < 2 else 'MISSED'}")
    print(f"tracebacks on stderr: {tracebacks}")
    met = hwm < 300 and worst < 1 and not failures and exit_seconds < 2 and code == 0 and tracebacks == 0
    return 0 if met else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode")
    w = sub.add_parser("world", help="the daemon process against trickling clients and lying stores (default)")
    w.add_argument("--seconds", type=float, default=60.0)
    w.add_argument("--clients", type=int, default=3000)
    w.add_argument("--period", type=float, default=5.0, help="seconds between one client's header lines")
    w.add_argument("--interval", type=float, default=2.0, help="the daemon's interval_seconds")
    c = sub.add_parser("churn", help="the daemon in process against a target whose label sets churn")
    c.add_argument("--cycles", type=int, default=400)
    c.add_argument("--series", type=int, default=400)
    c.add_argument("--label-bytes", type=int, default=2000)
    argv = sys.argv[1:] or ["world"]
    if argv[0] not in ("world", "churn", "-h", "--help"):
        argv = ["world", *argv]
    args = parser.parse_args(argv)
    return churn(args) if args.mode == "churn" else world(args)


if __name__ == "__main__":
    sys.exit(main())
