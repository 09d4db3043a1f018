"""The store path at fleet scale: one advisor reading N SGLang servers through a Prometheus-API store.

A synthetic store (its own process, so its CPU is shared but its memory is not counted) answers the advisor's
fixed queries for N servers whose counters, gauges, token and queue-time histograms move with the clock as
SGLang's do.
For each fleet size the advisor runs in a fresh process: the history replay at start (VPA's history init),
then live cycles; it prints the seconds per cycle (the slowest), the advisor's peak RSS and the queries sent
per cycle, which stays the same whatever the fleet size, the what-if replays each cycle ran within its
budget (`replay_budget_seconds`, a quarter of the 15 s interval by default), and the history replay's cost per
server-sample. A start-up row replays a long history (default 1000 servers x 6 h, the default `history`)
and runs one cycle.

    python bench/fleet.py                       # 1000 and 10,000 servers, then 1000 servers x 6 h start-up
    python bench/fleet.py --json                # one JSON object per row
    python bench/fleet.py --sizes 10,3000 --history 1h --cycles 5 --startup none
"""

from __future__ import annotations

import argparse
import json
import math
import re
import resource
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import numpy as np

from advisor.sources.fleet_queries import RANK_FAMILIES, TOKENIZER_COUNTERS

# SGLang 0.5.23's default token-histogram buckets (observables reference, prompt_tokens_histogram).
BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500, 15000,
           17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000, 400000,
           600000, 800000, 1000000, 1100000)
STATE_SLOTS = 257
KV_TOKENS = 1167552


# -- the synthetic store --------------------------------------------------------------------------------------

def _lognormal_cdf(x: float, median: float, sigma: float = 0.9) -> float:
    return 0.5 * (1 + math.erf(math.log(x / median) / (sigma * math.sqrt(2))))


def _whole(values: np.ndarray) -> np.ndarray:
    """float(int(x)) of every x (all >= 0 here): truncated, and -0.0 read as 0.0 as int() reads it."""
    return np.trunc(values) + 0.0


def _texts(values: np.ndarray) -> np.ndarray:
    """repr() of every value (as Python's float repr, what Prometheus' shortest round-trip text also is), as an
    object array of the same shape: each distinct value is formatted once (a fleet repeats a few hundred)."""
    distinct, inverse = np.unique(values, return_inverse=True)
    return np.array([repr(v) for v in distinct.tolist()], dtype=object)[inverse.reshape(values.shape)]


class SyntheticFleet:
    """N servers' series as functions of time; answers the five fixed queries as a store would, cheaply: each
    series' labels are rendered once, the values of every server at every asked time are worked out as arrays
    and each distinct value formatted once (as Prometheus, in Go, spends little per series)."""

    def __init__(self, servers: int, start: float) -> None:
        self.start = start
        index = np.arange(servers)
        self.instances = [f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}:30000" for i in range(servers)]
        self.rate = 2.0 + (index % 5)  # requests per second
        self.running = 20 + (index % 40)
        prompt_median = 800.0 * (1 + (index % 7))
        output_median = 300.0 * (1 + (index % 3))
        self.cdf = {"prompt": self._cdfs(prompt_median), "generation": self._cdfs(output_median)}
        self.mean = {"prompt": prompt_median * math.exp(0.9 ** 2 / 2), "generation": output_median * math.exp(0.9 ** 2 / 2)}
        self._labels: dict[str, list[str]] = {}  # expr -> each row's labels, as JSON
        self._heads: dict[tuple[str, str], np.ndarray] = {}  # (expr, "value" or "values") -> each row's opening

    @staticmethod
    def _cdfs(medians: np.ndarray) -> np.ndarray:
        """Each server's share of requests at or under each bucket bound, then 1.0 for +Inf: (servers, 36)."""
        rows = {m: [_lognormal_cdf(b, m) for b in BUCKETS] + [1.0] for m in set(medians.tolist())}
        return np.array([rows[m] for m in medians.tolist()]).reshape(len(medians), len(BUCKETS) + 1)

    def _elapsed(self, times: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, times - self.start) + 0.0

    def _gauges(self, times: np.ndarray) -> dict[str, np.ndarray]:
        """Every rank gauge's value per (server, time)."""
        arguments = times[None, :] / 300.0 + self.rate[:, None]
        distinct, inverse = np.unique(arguments, return_inverse=True)
        wobble = np.array([math.sin(x) for x in distinct.tolist()])[inverse.reshape(arguments.shape)]
        running = np.maximum(1.0, _whole(self.running[:, None] * (1 + 0.2 * wobble)))
        used_slots = np.minimum(float(STATE_SLOTS), running * 2)
        kv_used = _whole(running * (self.mean["prompt"] + self.mean["generation"])[:, None])
        elapsed = np.broadcast_to(self._elapsed(times)[None, :], running.shape)
        constant = np.ones_like(running)
        return {
            "sglang:num_running_reqs": running, "sglang:num_queue_reqs": np.maximum(0.0, _whole(3 * wobble)),
            "sglang:max_total_num_tokens": constant * KV_TOKENS, "sglang:kv_used_tokens": kv_used,
            "sglang:kv_available_tokens": KV_TOKENS - kv_used, "sglang:kv_evictable_tokens": constant * 0,
            "sglang:mamba_used_tokens": used_slots, "sglang:mamba_available_tokens": STATE_SLOTS - used_slots,
            "sglang:mamba_evictable_tokens": constant * 0, "sglang:decode_sum_seq_lens": kv_used,
            "sglang:new_token_ratio": constant * 0.4, "sglang:page_size": constant, "sglang:context_len": constant * 262144,
            "sglang:kv_cache_memory_usage_gb": constant * 15.03, "sglang:weight_memory_usage_gb": constant * 38.2,
            "sglang:startup_available_gpu_memory_gb": constant * 61.4, "sglang:graph_memory_usage_gb": constant * 2.1,
            "sglang:num_retracted_requests_total": _whole(elapsed * 0.01),
            "sglang:num_retracted_input_tokens_total": _whole(elapsed * 20),
            "sglang:num_retracted_output_tokens_total": _whole(elapsed * 2),
        }

    def _counts(self, times: np.ndarray) -> np.ndarray:
        """Requests served per (server, time)."""
        return _whole(self.rate[:, None] * self._elapsed(times)[None, :])

    def _series(self, expr: str, times: np.ndarray) -> tuple[list[str], np.ndarray]:
        """The labels (JSON, rendered once per query) of every row the query returns and their values, (rows,
        times), rows in the order a store lists them: server by server."""
        servers = len(self.instances)
        if expr.startswith("max by"):
            gauges = self._gauges(times)
            names = [n for n in RANK_FAMILIES if n in expr or n.removeprefix("sglang:") in expr]
            names = [n for n in [*names, "sglang:graph_memory_usage_gb"] if n in gauges]
            values = np.stack([gauges[n] for n in names], axis=1)
            per_server: list[tuple[str, dict[str, str]]] = [(n, {}) for n in names]
        elif "model_name" in expr:
            counts = self._counts(times)
            factors = {"sglang:num_requests_total": np.ones(servers), "sglang:prompt_tokens_total": self.mean["prompt"],
                       "sglang:generation_tokens_total": self.mean["generation"]}
            values = np.stack([_whole(counts * factors.get(n, np.zeros(servers))[:, None]) for n in TOKENIZER_COUNTERS],
                              axis=1)
            per_server = [(n, {"model_name": "example/hybrid"}) for n in TOKENIZER_COUNTERS]
        elif "sglang:queue_time_seconds" in expr:
            # the bound's edge only, as the query asks (`le=~"|10([.]0)?|[+]Inf"`): a few percent of a server's
            # requests waited beyond 10 s, each of those ~20 s, the rest ~0.5 s
            counts = self._counts(times)
            over = _whole(counts * (0.01 * (1 + self.rate % 3))[:, None])
            values = np.stack([counts - over, counts, counts, 0.5 * (counts - over) + 20.0 * over], axis=1)
            family = "sglang:queue_time_seconds"
            per_server = [(family + "_bucket", {"le": "10.0"}), (family + "_bucket", {"le": "+Inf"}),
                          (family + "_count", {}), (family + "_sum", {})]
        else:
            match = re.search(r"sglang:(prompt|generation)_tokens_histogram", expr)
            if not match:
                return [], np.zeros((0, len(times)))
            kind = match.group(1)
            family = f"sglang:{kind}_tokens_histogram"
            counts = self._counts(times)
            buckets = _whole(counts[:, None, :] * self.cdf[kind][:, :, None])
            values = np.concatenate([buckets, counts[:, None, :], (counts * self.mean[kind][:, None])[:, None, :]], axis=1)
            les = [f"{bound:.1f}" for bound in BUCKETS] + ["+Inf"]
            per_server = [*((family + "_bucket", {"le": le}) for le in les), (family + "_count", {}), (family + "_sum", {})]
        texts = self._labels.get(expr)
        if texts is None:
            texts = self._labels[expr] = [json.dumps({"__name__": name, "instance": instance, **extra})
                                          for instance in self.instances for name, extra in per_server]
        return texts, values.reshape(-1, len(times))

    def answer(self, endpoint: str, form: dict[str, str]) -> bytes:
        expr = form.get("query", "")
        if endpoint == "query":
            at = float(form.get("time", time.time()))
            times = np.array([at])
            stamps = [f"{at:.3f}"]
            value_key, kind = "value", "vector"
        else:
            start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
            listed = [start + k * step for k in range(int((end - start) // step) + 1) if start + k * step >= self.start]
            times = np.array(listed, dtype=float)
            stamps = [f"{t:.3f}" for t in listed]
            value_key, kind = "values", "matrix"
        labels, values = self._series(expr, times) if len(times) else ([], np.zeros((0, 0)))
        body = self._rows_text(expr, value_key, labels, values, stamps) if labels else ""
        return f'{{"status":"success","data":{{"resultType":"{kind}","result":[{body}]}}}}'.encode()

    def _rows_text(self, expr: str, value_key: str, labels: list[str], values: np.ndarray, stamps: list[str]) -> str:
        """Every row as `{"metric":LABELS,"value":[T,"V"]}` (or `"values":[[T,"V"],...]`), comma-separated:
        the texts laid out in one array and joined once."""
        heads = self._heads.get((expr, value_key))
        if heads is None:
            heads = self._heads[(expr, value_key)] = np.array([f'{{"metric":{text},"{value_key}":[' for text in labels],
                                                              dtype=object)
        rows, points = values.shape
        cells = np.empty((rows, points + 2), dtype=object)
        cells[:, 0] = heads
        if value_key == "value":
            cells[:, 1] = f'{stamps[0]},"' + _texts(values[:, 0]) + '"]}'
        else:
            before = np.array([("[" if k == 0 else ",[") + f'{stamp},"' for k, stamp in enumerate(stamps)], dtype=object)
            cells[:, 1:-1] = before[None, :] + _texts(values) + '"]'
        cells[:, -1] = "" if value_key == "value" else "]}"
        cells[:-1, -1] += ","
        return "".join(cells.ravel().tolist())


def serve_synthetic(servers: int, history_seconds: float) -> None:
    fleet = SyntheticFleet(servers, start=time.time() - history_seconds)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("Content-Length", "0"))
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            body = fleet.answer(self.path.rsplit("/", 1)[-1], form)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


# -- the advisor side (a fresh process per fleet size) -----------------------------------------------------

def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


def run_advisor(store_url: str, servers: int, history: str, cycles: int, interval: float) -> dict[str, Any]:
    from advisor.config import config_from_dict
    from advisor.daemon.store_targets import StoreFleet
    from advisor.store_config import store_target_from_dict

    store = store_target_from_dict({"kind": "prometheus", "url": store_url, "history": history,
                                    "server_info_url": "", "timeout_seconds": "300s",
                                    "max_servers_per_store": max(servers, 2000)}, "bench", {})
    fleet = StoreFleet(store, config_from_dict({"targets": []}), quiet=True)
    started = time.monotonic()
    fed = fleet.bootstrap(time.time())
    bootstrap_seconds = time.monotonic() - started
    bootstrap_queries = fleet.client.queries_sent
    bootstrap_peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    durations, queries, decisions = [], [], {}
    replays = []
    for _ in range(cycles):
        sent = fleet.client.queries_sent
        started = time.monotonic()
        statuses = [result.status for result in fleet.cycle(time.time())]
        durations.append(time.monotonic() - started)
        queries.append(fleet.client.queries_sent - sent)
        budget = fleet.last_replay_budget
        replays.append((budget.ran, round(budget.spent, 2)) if budget is not None else (0, 0.0))
        decisions = {}
        for status in statuses:
            decision = status.recommendation.decision if status.recommendation else "none"
            decisions[decision] = decisions.get(decision, 0) + 1
        time.sleep(interval)
    seen = len(fleet.pipelines)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the checkpoint's JSON below
    rss_mb = _rss_mb()
    started = time.monotonic()  # what the daemon's checkpoint adds to a cycle: every server's state, as JSON
    checkpoint = json.dumps({name: p.state() for name, p in fleet.pipelines.items()}, separators=(",", ":"))
    checkpoint_seconds = time.monotonic() - started
    state_kb = len(checkpoint) / max(1, seen) / 1024
    del checkpoint
    fleet.close()
    if fleet.last_error or seen != servers:
        raise SystemExit(f"fleet of {servers}: saw {seen} servers; store error: {fleet.last_error}")
    return {
        "servers": servers,
        "cycle_seconds": round(max(durations), 3),
        "cycle_seconds_median": round(sorted(durations)[len(durations) // 2], 3),
        "peak_rss_mb": round(peak_mb, 1),
        "queries_per_cycle": max(queries),
        "rss_after_cycles_mb": round(rss_mb, 1),
        "bootstrap_peak_rss_mb": round(bootstrap_peak_mb, 1),
        "bootstrap_seconds": round(bootstrap_seconds, 2),
        "bootstrap_queries": bootstrap_queries,
        "bootstrap_samples_fed": fed,
        "bootstrap_ms_per_server_sample": round(1000 * bootstrap_seconds / max(1, fed), 3),
        "replays_per_cycle": [ran for ran, _ in replays],
        "replay_seconds_per_cycle": [spent for _, spent in replays],
        "checkpoint_kb_per_server": round(state_kb, 1),
        "checkpoint_seconds": round(checkpoint_seconds, 2),
        "history": history,
        "decisions": decisions,
    }


def measure(servers: int, history: str, cycles: int, interval: float) -> dict[str, Any]:
    from advisor.sources.prometheus_store import parse_duration

    store = subprocess.Popen([sys.executable, __file__, "--serve-synthetic", str(servers), "--history", history],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert store.stdout is not None
        url = store.stdout.readline().strip()
        parse_duration(history)
        child = subprocess.run([sys.executable, __file__, "--advisor", url, "--servers", str(servers), "--history",
                                history, "--cycles", str(cycles), "--interval", str(interval)],
                               capture_output=True, text=True, check=False)
        if child.returncode != 0:
            raise SystemExit(f"advisor for {servers} servers failed:\n{child.stderr[-2000:]}")
        return dict(json.loads(child.stdout))
    finally:
        store.terminate()
        store.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated fleet sizes (default 1000,10000)")
    parser.add_argument("--history", default="5m", help="history replayed at start of the size rows (default 5m)")
    parser.add_argument("--startup", default="1000x6h",
                        help="a start-up row: SERVERSxHISTORY, one cycle (default 1000x6h; 'none' to skip)")
    parser.add_argument("--cycles", type=int, default=3, help="live cycles after the replay (default 3)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between live cycles (default 1)")
    parser.add_argument("--json", action="store_true", help="one JSON object per fleet size, one per line")
    parser.add_argument("--serve-synthetic", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument("--advisor", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--servers", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_synthetic:
        from advisor.sources.prometheus_store import parse_duration

        serve_synthetic(args.serve_synthetic, parse_duration(args.history))
        return 0
    if args.advisor:
        print(json.dumps(run_advisor(args.advisor, args.servers, args.history, args.cycles, args.interval)))
        return 0
    results = [{"row": "cycles", **measure(int(n), args.history, args.cycles, args.interval)}
               for n in args.sizes.split(",") if n]
    if args.startup != "none":
        servers, history = args.startup.split("x", 1)
        results.append({"row": "startup", **measure(int(servers), history, 1, args.interval)})
    if args.json:
        for result in results:
            print(json.dumps(result))
        return 0
    print(f"{'row':>8} {'servers':>8} {'history':>8} {'cycle s':>8} {'peak RSS MB':>12} {'queries/cycle':>14} "
          f"{'replays/cycle':>14} {'start-up s':>11} {'samples':>9} {'ms/sample':>10}  decisions")
    for r in results:
        print(f"{r['row']:>8} {r['servers']:>8} {r['history']:>8} {r['cycle_seconds']:>8.3f} {r['peak_rss_mb']:>12.1f} "
              f"{r['queries_per_cycle']:>14} {max(r['replays_per_cycle']):>14} {r['bootstrap_seconds']:>11.2f} "
              f"{r['bootstrap_samples_fed']:>9} {r['bootstrap_ms_per_server_sample']:>10.3f}  {r['decisions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
