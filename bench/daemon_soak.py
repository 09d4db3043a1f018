"""Memory per target over a long run of the whole daemon pipeline (scrape, follow, estimate, recommend,
checkpoint) against emulated SGLang servers running in their own processes: the RSS measured is the
advisor's alone, and it should stay flat once warm.

    python bench/daemon_soak.py                  # 1500 cycles, 2 targets
    python bench/daemon_soak.py --cycles 500 --targets 4 --workload bimodal-chat-docs
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from advisor.config import config_from_dict
from advisor.daemon.runner import Advisor


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def start_emulator(workload: str, speed: float, seed: int, log_path: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "advisor", "emulate", "--port", "0", "--speed", str(speed), "--seed", str(seed),
         "--workload", workload, "--log-file", log_path, "--request-log-file", log_path],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not match:
        proc.kill()
        raise SystemExit(f"emulator did not start: {line.strip()}")
    return proc, match.group(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1500)
    parser.add_argument("--targets", type=int, default=2)
    parser.add_argument("--speed", type=float, default=300.0)
    parser.add_argument("--workload", default="steady-long-docs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="advisor-soak-") as tmp:
        emulators, targets = [], []
        try:
            for index in range(args.targets):
                log_path = str(Path(tmp) / f"sglang-{index}.log")
                proc, url = start_emulator(args.workload, args.speed, index, log_path)
                emulators.append(proc)
                targets.append({"name": f"t{index}", "url": url, "log_paths": [log_path]})
            advisor = Advisor(config_from_dict({"targets": targets, "interval_seconds": 0.1, "time_scale": args.speed,
                                                "checkpoint_path": str(Path(tmp) / "ckpt.json")}))
            print(f"{args.targets} targets ({args.workload}), {args.cycles} cycles, emulators at {args.speed:g}x "
                  f"in their own processes")
            started = time.monotonic()
            marks = []
            for cycle in range(1, args.cycles + 1):
                statuses = advisor.run_cycle(timeout=10.0)
                if cycle == 1 or cycle % max(1, args.cycles // 10) == 0:
                    marks.append((cycle, rss_mb()))
                    requests = sum(s.workload.requests_observed for s in statuses)
                    print(f"  cycle {cycle:5d}: RSS {marks[-1][1]:6.1f} MB, {requests:9,.0f} requests observed, "
                          f"{(time.monotonic() - started) / cycle * 1000:5.1f} ms per cycle", flush=True)
            advisor.close()
        finally:
            for proc in emulators:
                proc.terminate()
                proc.wait(timeout=10)
        warm_cycle, warm = marks[min(2, len(marks) - 1)]
        print(f"advisor RSS growth after warm-up (cycle {warm_cycle} -> {marks[-1][0]}): {marks[-1][1] - warm:+.1f} MB "
              f"for {args.targets} targets")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
