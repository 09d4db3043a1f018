"""Log-following throughput and memory: LogFollower (+ LogLineParser) on a generated SGLang-format log.

Builds a ~50 MB log from the shared fixtures' real lines (TP2 server: decode/prefill stats on TP0, every
retraction printed by both TP ranks, uvicorn scrape lines, --log-requests json lines), then measures:
  * follow only: LogFollower draining the whole file (MB/s);
  * follow + parse: the same with LogLineParser.feed on every batch;
  * live tail: a writer appends 1 MB at a time and the follower reads after each append;
  * RSS over a long run of daemon-like cycles (scrape parse + diff + follow/parse a fresh chunk, with
    rotation every few hundred cycles): it should stay flat.

    python bench/follow.py                 # defaults: 50 MB, 3000 RSS cycles
    python bench/follow.py --mb 20 --cycles 1000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from advisor.estimate.deltas import diff_counters
from advisor.sources.follow import LogFollower
from advisor.sources.loglines import LogLineParser, Retraction, StatsLine
from advisor.sources.metrics import parse_metrics

SHARED = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def template_messages() -> list[str]:
    """Message parts (prefix removed) of the fixtures' runtime and request lines, in their original order."""
    messages = []
    for name in ("runtime-kvbound-single.log", "runtime-tp8.log"):
        for line in (SHARED / "logs" / name).read_text().splitlines()[8:]:
            messages.append(line.split("] ", 1)[1])
    requests = (SHARED / "logs" / "requests-json.log").read_text().splitlines()
    # Interleave request lines (printed by the tokenizer process, no rank prefix).
    mixed = []
    for index, message in enumerate(messages):
        mixed.append(message)
        if index % 3 == 0:
            mixed.append("\0" + requests[index % len(requests)].split("] ", 1)[1])
    return mixed


def render_chunk(
    messages: list[str], start: datetime, first_index: int, target_bytes: int
) -> tuple[str, int]:
    """SGLang-format text of about target_bytes, continuing the message cycle at first_index."""
    parts: list[str] = []
    size = 0
    index = first_index
    while size < target_bytes:
        message = messages[index % len(messages)]
        stamp = (start + timedelta(seconds=index // 4)).strftime("%Y-%m-%d %H:%M:%S")
        if message.startswith("\0"):
            lines = [f"[{stamp}] {message[1:]}"]
        elif message.startswith("INFO:"):
            lines = [f"[{stamp}] {message}"]
        elif message.startswith("KV cache pool is full"):
            lines = [f"[{stamp} TP{tp}] {message}" for tp in (1, 0)]
        else:
            lines = [f"[{stamp} TP0] {message}"]
        for line in lines:
            parts.append(line)
            size += len(line) + 1
        index += 1
    return "\n".join(parts) + "\n", index


def drain(follower: LogFollower, parser: LogLineParser | None) -> tuple[int, int]:
    lines = events = 0
    while True:
        batch = follower.read_lines()
        if not batch:
            return lines, events
        lines += len(batch)
        if parser is not None:
            events += len(parser.feed(batch))


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--mb", type=float, default=50.0, help="size of the generated log")
    options.add_argument("--cycles", type=int, default=3000, help="daemon-like cycles for the RSS run")
    options.add_argument("--repeat", type=int, default=3, help="drains per throughput figure (best reported)")
    args = options.parse_args()
    messages = template_messages()
    start = datetime(2026, 11, 29, 12, 0, 0)
    with tempfile.TemporaryDirectory(prefix="advisor-bench-follow-") as directory:
        path = Path(directory) / "sglang.log"
        text, _ = render_chunk(messages, start, 0, int(args.mb * 2**20))
        path.write_text(text)
        size_mb = path.stat().st_size / 2**20
        print(
            f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (figures are wall-clock on a shared box)"
        )
        print(f"generated {size_mb:.1f} MB, {text.count(chr(10))} lines at {path}")
        del text

        def timed(parse: bool, source: Path) -> tuple[float, float, int, int, LogLineParser | None]:
            """Best wall and best CPU seconds of --repeat drains of the whole file (the box is shared)."""
            best_wall = best_cpu = float("inf")
            for _ in range(args.repeat):
                parser = LogLineParser() if parse else None
                wall, cpu = time.perf_counter(), time.process_time()
                lines, events = drain(LogFollower(str(source)), parser)
                best_wall = min(best_wall, time.perf_counter() - wall)
                best_cpu = min(best_cpu, time.process_time() - cpu)
            return best_wall, best_cpu, lines, events, parser

        wall, cpu, lines, _, _ = timed(False, path)
        print(
            f"follow only          : {size_mb / wall:7.1f} MB/s wall, {size_mb / cpu:7.1f} MB/s CPU  ({lines} lines)"
        )
        wall, cpu, lines, events, parser = timed(True, path)
        assert parser is not None
        print(f"follow + parse       : {size_mb / wall:7.1f} MB/s wall, {size_mb / cpu:7.1f} MB/s CPU  ({events} events, "
              f"{parser.duplicate_retractions} TP-duplicate retractions dropped, {parser.unparsed_lines} unparsed)")  # fmt: skip
        stats_only = Path(directory) / "stats-only.log"
        with open(path) as source, open(stats_only, "w") as target:
            target.writelines(line for line in source if '"event": "request.finished"' not in line)
        stats_mb = stats_only.stat().st_size / 2**20
        wall, cpu, lines, events, _ = timed(True, stats_only)
        print(f"  without request log: {stats_mb / wall:7.1f} MB/s wall, {stats_mb / cpu:7.1f} MB/s CPU  "
              f"({stats_mb:.1f} MB, {lines} lines)")  # fmt: skip

        live_path = Path(directory) / "live.log"
        live_path.write_text("")
        follower = LogFollower(str(live_path))
        parser = LogLineParser()
        index = 0
        written = 0
        busy = 0.0
        while written < args.mb * 2**20 / 2:
            chunk, index = render_chunk(messages, start, index, 1 << 20)
            with open(live_path, "a") as handle:
                handle.write(chunk)
            written += len(chunk)
            started = time.perf_counter()
            parser.feed(follower.read_lines())
            busy += time.perf_counter() - started
        print(
            f"live tail + parse    : {written / 2**20 / busy:7.1f} MB/s  (1 MB appends, {written / 2**20:.0f} MB)"
        )

        scrape = (SHARED / "metrics" / "sglang-0.5.23-dp2tp4.prom").read_text()
        rss_path = Path(directory) / "rss.log"
        rss_path.write_text("")
        follower = LogFollower(str(rss_path))
        parser = LogLineParser()
        previous = None
        samples = []
        retractions = stats = 0
        for cycle in range(args.cycles):
            observation = parse_metrics(scrape)
            diff_counters(previous, observation, interval_seconds=15.0)
            previous = observation
            chunk, index = render_chunk(messages, start, index, 64 << 10)
            with open(rss_path, "a") as handle:
                handle.write(chunk)
            for event in parser.feed(follower.read_lines()):
                if isinstance(event, Retraction):
                    retractions += 1
                elif isinstance(event, StatsLine):
                    stats += 1
            if cycle % 300 == 299:  # rotate like a log handler would
                os.rename(rss_path, rss_path.with_suffix(".1"))
                rss_path.write_text("")
            if cycle % max(args.cycles // 10, 1) == 0 or cycle == args.cycles - 1:
                samples.append((cycle + 1, rss_mb()))
        print(
            f"RSS over {args.cycles} cycles (scrape parse+diff, 64 KB of log followed+parsed, rotation every 300):"
        )
        print("  " + "  ".join(f"{cycle}:{mb:.1f}MB" for cycle, mb in samples))
        first_after_warmup = samples[1][1] if len(samples) > 1 else samples[0][1]
        print(f"  growth after warm-up: {samples[-1][1] - first_after_warmup:+.1f} MB; "
              f"{follower.rotations} rotations, {stats} stats lines, {retractions} retractions")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
