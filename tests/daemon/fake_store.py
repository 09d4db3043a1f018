"""A Prometheus query API on loopback holding genuine SGLang expositions (vendored fixtures) as the series of
named servers: it answers the fleet's four query shapes (`max by` / `sum by` over a `__name__=~` selector) by
grouping and aggregating the fixture's samples, for instant and range queries, and can hang or fail on cue."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from support import FIXTURES, LoopbackServer

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_QUERY = re.compile(r'^(max|sum) by \(([^)]*)\) \(\{__name__=~"([^"]+)"')

Sample = tuple[dict[str, str], float]


def read_exposition(name: str) -> list[Sample]:
    """The samples of a vendored exposition as (labels with __name__, value)."""
    samples = []
    for line in (FIXTURES / "metrics" / name).read_text().splitlines():
        match = _SAMPLE.match(line)
        if not line or line.startswith("#") or match is None:
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        labels["__name__"] = match.group(1)
        samples.append((labels, float(match.group(3))))
    return samples


class FakeStore(LoopbackServer):
    """`servers` maps an instance name to its exposition's samples; `mode` is "ok", "hang" or "error"."""

    def __init__(self, servers: dict[str, list[Sample]]) -> None:
        self.servers = servers
        self.mode = "ok"
        super().__init__({}, post=self._answer)

    def rows(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """The rows a real Prometheus would give for one of the fleet's queries (every server's samples)."""
        match = _QUERY.match(expr)
        if match is None:
            return []
        aggregate: Callable[[float, float], float] = max if match.group(1) == "max" else (lambda a, b: a + b)
        by = [label.strip() for label in match.group(2).split(",")]
        names = re.compile(match.group(3))
        # priority="" in the rank query keeps only series without a priority label
        no_priority = 'priority=""' in expr
        grouped: dict[tuple[tuple[str, str], ...], float] = {}
        for instance, samples in self.servers.items():
            for labels, value in samples:
                labels = {**labels, "instance": instance}
                if not names.fullmatch(labels["__name__"]) or (no_priority and labels.get("priority")):
                    continue
                key = tuple((label, labels[label]) for label in by if labels.get(label))
                grouped[key] = aggregate(grouped[key], value) if key in grouped else value
        return [(dict(key), value) for key, value in grouped.items()]

    def _answer(self, path: str, form: dict[str, str], _headers: dict[str, str]) -> tuple[int, bytes]:
        if self.mode == "hang":
            return 0, b""
        if self.mode == "error":
            return 503, json.dumps({"status": "error", "errorType": "unavailable", "error": "store down"}).encode()
        rows = self.rows(form.get("query", ""))
        if path.endswith("/query_range"):
            start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
            times = [start + k * step for k in range(int((end - start) // step) + 1)]
            result = [{"metric": labels, "values": [[t, repr(value)] for t in times]} for labels, value in rows]
            data = {"resultType": "matrix", "result": result}
        else:
            at = float(form.get("time", "0"))
            data = {"resultType": "vector", "result": [{"metric": labels, "value": [at, repr(value)]}
                                                       for labels, value in rows]}
        return 200, json.dumps({"status": "success", "data": data}).encode()
