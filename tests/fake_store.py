"""A Prometheus query API on loopback over genuine SGLang expositions (vendored fixtures) standing as the series
of named servers: it evaluates the fleet's query shapes (`max by` / `sum by (...)` over a `__name__=~` selector)
as Prometheus would, for instant and range queries, and can hang or fail on cue. `evaluate` alone serves tests
that read rows without HTTP."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from support import METRICS, LoopbackServer

# (sample name, labels, value), as a store holds one series' latest sample
Sample = tuple[str, dict[str, str], float]


def exposition_samples(text: str, **labels: str) -> list[Sample]:
    """Every sample of an exposition with the labels a scrape adds (instance, job, ...)."""
    return [(sample.name, {**sample.labels, **labels}, float(sample.value))
            for family in text_string_to_metric_families(text) for sample in family.samples]


def fixture_samples(name: str, **labels: str) -> list[Sample]:
    return exposition_samples((METRICS / name).read_text(), **labels)


def evaluate(expr: str, samples: Iterable[Sample]) -> list[tuple[dict[str, str], float]]:
    """The rows Prometheus gives for `max|sum by (labels) ({__name__=~"re", ...})` over these samples (a series
    with a `priority` label is left out where the selector says priority="", one whose `le` does not match is
    left out where the selector has `le=~"re"`), or for `sum by (labels) (max by (labels) ({...}))`."""
    nested = re.fullmatch(r"sum by \(([^)]*)\) \((max by .*)\)", expr)
    if nested:
        inner = evaluate(nested.group(2), samples)
        return _aggregate(expr, [(labels.get("__name__", ""), labels, value) for labels, value in inner])
    return _aggregate(expr, samples)


def _aggregate(expr: str, samples: Iterable[Sample]) -> list[tuple[dict[str, str], float]]:
    by = [label.strip() for label in re.search(r"by \(([^)]*)\)", expr).group(1).split(",")]
    pattern = re.compile(re.search(r'__name__=~"([^"]+)"', expr).group(1))
    le_match = re.search(r'le=~"([^"]*)"', expr)
    le_pattern = re.compile(le_match.group(1)) if le_match else None
    combine: Callable[[float, float], float] = max if expr.startswith("max") else (lambda a, b: a + b)
    no_priority = 'priority=""' in expr
    groups: dict[tuple[str, ...], float] = {}
    for name, labels, value in samples:
        if not pattern.fullmatch(name) or (no_priority and labels.get("priority")):
            continue
        if le_pattern is not None and not le_pattern.fullmatch(labels.get("le", "")):
            continue
        key = tuple(name if label == "__name__" else labels.get(label, "") for label in by)
        groups[key] = combine(groups[key], value) if key in groups else value
    return [({k: v for k, v in zip(by, key, strict=True) if v}, value) for key, value in groups.items()]


class FakeStore(LoopbackServer):
    """`servers` maps an instance name to its samples (the same at every time); `mode` is "ok", "hang" (no
    answer until the store closes), "error" (HTTP 503) or "list_labels" (a well-formed answer whose label
    values are lists, not strings)."""

    def __init__(self, servers: dict[str, list[Sample]]) -> None:
        self.servers = servers
        self.mode = "ok"
        super().__init__({}, post=self._answer)

    def _answer(self, path: str, form: dict[str, str], _headers: dict[str, str]) -> tuple[int, bytes]:
        if self.mode == "hang":
            return 0, b""
        if self.mode == "error":
            return 503, json.dumps({"status": "error", "errorType": "unavailable", "error": "store down"}).encode()
        samples = [(name, {**labels, "instance": instance}, value)
                   for instance, held in self.servers.items() for name, labels, value in held]
        rows: list[tuple[dict[str, Any], float]] = list(evaluate(form.get("query", ""), samples))
        if self.mode == "list_labels":
            rows = [({k: [v] for k, v in labels.items()}, value) for labels, value in rows]
        if path.endswith("/query_range"):
            start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
            times = [start + k * step for k in range(int((end - start) // step) + 1)]
            data = {"resultType": "matrix",
                    "result": [{"metric": labels, "values": [[t, repr(value)] for t in times]} for labels, value in rows]}
        else:
            at = float(form.get("time", "0"))
            data = {"resultType": "vector",
                    "result": [{"metric": labels, "value": [at, repr(value)]} for labels, value in rows]}
        return 200, json.dumps({"status": "success", "data": data}).encode()
