"""What one /metrics scrape costs the advisor per fleet size: the first scrape after a publish when the
cycle's end has not rendered it (encode everything), the first one after the cycle's end rendered it, and the
next ones (per-server bytes cached, only the daemon's own metrics re-encoded), in text and OpenMetrics, with
and without gzip; and what the rendering at the cycle's end costs the daemon. Prints one JSON object per
fleet size.

    python bench/exporter_scrape.py                 # 10, 100, 1000 servers
    python bench/exporter_scrape.py --servers 5000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "export"))

from export_samples import drifted_status  # noqa: E402

from advisor.export.exposition import MetricsRenderer  # noqa: E402
from advisor.export.snapshot import SnapshotStore  # noqa: E402

OPENMETRICS = "application/openmetrics-text;version=1.0.0"


def _milliseconds(action, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        action()
    return (time.perf_counter() - started) / repeat * 1000


def _one_format(store: SnapshotStore, statuses: list, accept: str, encoding: str,
                repeat: int) -> tuple[float, float, float, float, int]:
    """(first scrape after a publish, cycle-end render, first scrape after it, cached scrape, body bytes)."""
    store = SnapshotStore()  # one renderer listening: the cycle end renders this format only
    renderer = MetricsRenderer(store)
    clock = iter(range(1, 10**9))

    def publish() -> None:
        store.publish(statuses, now=1_790_000_000.0 + next(clock))

    def first_after_publish() -> None:
        publish()
        renderer.render(accept, encoding, {})

    def rendered_at_cycle_end() -> None:
        publish()
        store.cycle_ended()

    publish_alone = _milliseconds(publish, repeat)
    first = _milliseconds(first_after_publish, repeat) - publish_alone  # the last one leaves a warm cache
    render = _milliseconds(rendered_at_cycle_end, repeat) - publish_alone
    after_render = _milliseconds(lambda: renderer.render(accept, encoding, {}), 1)  # the first after the cycle end
    cached = _milliseconds(lambda: renderer.render(accept, encoding, {}), repeat)
    return first, render, after_render, cached, len(renderer.render(accept, encoding, {})[1])


def measure(servers: int, repeat: int) -> dict[str, object]:
    store = SnapshotStore()
    statuses = [drifted_status(server=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:30000") for i in range(servers)]
    result: dict[str, object] = {"servers": servers}
    for label, accept, encoding in (("text", "", ""), ("text_gzip", "", "gzip"), ("openmetrics", OPENMETRICS, ""),
                                    ("openmetrics_gzip", OPENMETRICS, "gzip")):
        first, render, after_render, cached, size = _one_format(store, statuses, accept, encoding, repeat)
        result[f"{label}_first_ms"] = round(first, 1)
        result[f"{label}_cycle_end_render_ms"] = round(render, 1)
        result[f"{label}_first_after_cycle_end_ms"] = round(after_render, 2)
        result[f"{label}_cached_ms"] = round(cached, 2)
        result[f"{label}_bytes"] = size
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, action="append", help="fleet size (repeatable; default 10, 100, 1000)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for servers in args.servers or [10, 100, 1000]:
        print(json.dumps(measure(servers, args.repeat)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
