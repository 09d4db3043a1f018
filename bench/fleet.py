"""The store path at fleet scale: one advisor reading N SGLang servers through a Prometheus-API store.

A synthetic store (its own process, so its CPU is shared but its memory is not counted) answers the advisor's
fixed queries for N servers whose counters, gauges and token histograms move with the clock as SGLang's do.
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


class SyntheticFleet:
    """N servers' series as functions of time; renders the four query shapes' JSON answers."""

    def __init__(self, servers: int, start: float) -> None:
        self.start = start
        self.servers = []
        for i in range(servers):
            prompt_median = 800.0 * (1 + (i % 7))
            output_median = 300.0 * (1 + (i % 3))
            self.servers.append({
                "instance": f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}:30000",
                "rate": 2.0 + (i % 5),  # requests per second
                "running": 20 + (i % 40),
                "prompt_cdf": [_lognormal_cdf(b, prompt_median) for b in BUCKETS],
                "output_cdf": [_lognormal_cdf(b, output_median) for b in BUCKETS],
                "prompt_mean": prompt_median * math.exp(0.9 ** 2 / 2),
                "output_mean": output_median * math.exp(0.9 ** 2 / 2),
            })

    def _gauges(self, s: dict[str, Any], t: float) -> dict[str, float]:
        wobble = math.sin(t / 300.0 + s["rate"])
        running = max(1, int(s["running"] * (1 + 0.2 * wobble)))
        used_slots = min(STATE_SLOTS, running * 2)
        kv_used = int(running * (s["prompt_mean"] + s["output_mean"]))
        elapsed = max(0.0, t - self.start)
        return {
            "sglang:num_running_reqs": running, "sglang:num_queue_reqs": max(0, int(3 * wobble)),
            "sglang:max_total_num_tokens": KV_TOKENS, "sglang:kv_used_tokens": kv_used,
            "sglang:kv_available_tokens": KV_TOKENS - kv_used, "sglang:kv_evictable_tokens": 0,
            "sglang:mamba_used_tokens": used_slots, "sglang:mamba_available_tokens": STATE_SLOTS - used_slots,
            "sglang:mamba_evictable_tokens": 0, "sglang:decode_sum_seq_lens": kv_used,
            "sglang:new_token_ratio": 0.4, "sglang:page_size": 1, "sglang:context_len": 262144,
            "sglang:kv_cache_memory_usage_gb": 15.03, "sglang:weight_memory_usage_gb": 38.2,
            "sglang:startup_available_gpu_memory_gb": 61.4, "sglang:graph_memory_usage_gb": 2.1,
            "sglang:num_retracted_requests_total": int(elapsed * 0.01),
            "sglang:num_retracted_input_tokens_total": int(elapsed * 20),
            "sglang:num_retracted_output_tokens_total": int(elapsed * 2),
        }

    def _count(self, s: dict[str, Any], t: float) -> float:
        return float(int(s["rate"] * max(0.0, t - self.start)))

    def rows(self, expr: str, times: list[float]) -> list[tuple[str, list[str]]]:
        """(metric labels JSON, values per time) of every row the query returns."""
        out: list[tuple[str, list[str]]] = []
        if expr.startswith("max by"):
            names = [n for n in RANK_FAMILIES if n in expr or n.removeprefix("sglang:") in expr]
            names.append("sglang:graph_memory_usage_gb")
            per_time = [[self._gauges(s, t) for t in times] for s in self.servers]
            for s, gauges in zip(self.servers, per_time, strict=True):
                for name in names:
                    if name not in gauges[0]:
                        continue
                    labels = json.dumps({"__name__": name, "instance": s["instance"]})
                    out.append((labels, [repr(float(g[name])) for g in gauges]))
            return out
        if "model_name" in expr:
            for s in self.servers:
                counts = [self._count(s, t) for t in times]
                for name in TOKENIZER_COUNTERS:
                    factor = {"sglang:num_requests_total": 1.0, "sglang:prompt_tokens_total": s["prompt_mean"],
                              "sglang:generation_tokens_total": s["output_mean"]}.get(name, 0.0)
                    labels = json.dumps({"__name__": name, "instance": s["instance"], "model_name": "example/hybrid"})
                    out.append((labels, [repr(float(int(c * factor))) for c in counts]))
            return out
        match = re.search(r"sglang:(prompt|generation)_tokens_histogram", expr)
        if not match:
            return out
        kind = match.group(1)
        family = f"sglang:{kind}_tokens_histogram"
        cdf_key, mean_key = ("prompt_cdf", "prompt_mean") if kind == "prompt" else ("output_cdf", "output_mean")
        for s in self.servers:
            counts = [self._count(s, t) for t in times]
            for bound, share in zip((*BUCKETS, math.inf), (*s[cdf_key], 1.0), strict=True):
                le = "+Inf" if math.isinf(bound) else f"{bound:.1f}"
                labels = json.dumps({"__name__": family + "_bucket", "instance": s["instance"], "le": le})
                out.append((labels, [repr(float(int(c * share))) for c in counts]))
            out.append((json.dumps({"__name__": family + "_count", "instance": s["instance"]}),
                        [repr(c) for c in counts]))
            out.append((json.dumps({"__name__": family + "_sum", "instance": s["instance"]}),
                        [repr(c * s[mean_key]) for c in counts]))
        return out

    def answer(self, endpoint: str, form: dict[str, str]) -> bytes:
        expr = form.get("query", "")
        if endpoint == "query":
            at = float(form.get("time", time.time()))
            rows = self.rows(expr, [at])
            result = ",".join(f'{{"metric":{labels},"value":[{at:.3f},"{values[0]}"]}}' for labels, values in rows)
            return f'{{"status":"success","data":{{"resultType":"vector","result":[{result}]}}}}'.encode()
        start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
        times = [start + k * step for k in range(int((end - start) // step) + 1) if start + k * step >= self.start]
        rows = self.rows(expr, times) if times else []
        result = ",".join(
            f'{{"metric":{labels},"values":[' + ",".join(f'[{t:.3f},"{v}"]' for t, v in zip(times, values, strict=True))
            + "]}" for labels, values in rows
        )
        return f'{{"status":"success","data":{{"resultType":"matrix","result":[{result}]}}}}'.encode()


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
