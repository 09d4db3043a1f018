"""The daemon's memory against a hostile target whose label sets change every scrape (a request id in a label):
RSS should stay flat once warm. A healthy target scraped alongside shows it keeps its rate.

    python bench/hostile_soak.py                   # 400 cycles, 400 churning series of ~2 KB per scrape
    python bench/hostile_soak.py --cycles 1000 --series 2000 --label-bytes 4000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "hardening"))
sys.path.insert(0, str(REPO))

from hostile_servers import HostileServer, respond  # noqa: E402

from advisor.config import config_from_dict  # noqa: E402
from advisor.daemon.runner import Advisor  # noqa: E402

GENUINE = (REPO / "tests" / "fixtures" / "metrics" / "sglang-0.5.23-single.prom").read_bytes()


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=400)
    parser.add_argument("--series", type=int, default=400)
    parser.add_argument("--label-bytes", type=int, default=2000)
    args = parser.parse_args()

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


if __name__ == "__main__":
    sys.exit(main())
