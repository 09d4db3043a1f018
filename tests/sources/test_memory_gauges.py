"""SGLang 0.5.23's memory gauges (`observability/metrics_collector.py` `emit_constants`, lines 1771-1800):
weights, startup-available memory and graph memory per capture phase, read per DP rank."""

from __future__ import annotations

import re

import pytest
from support import METRICS

from advisor.sources.metrics import parse_metrics

FIXTURES = ["sglang-0.5.23-single.prom", "sglang-0.5.23-tp2.prom", "sglang-0.5.23-dp2tp4.prom"]
_SAMPLE = re.compile(r"^(sglang:[a-z_]+)\{([^}]*)\} (\S+)$")


def _raw(text: str, family: str) -> dict[tuple[str | None, str], list[float]]:
    """(dp_rank, tp_rank) -> values of one family, read straight off the exposition lines."""
    out: dict[tuple[str | None, str], list[float]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) != family:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        out.setdefault((labels.get("dp_rank"), labels["tp_rank"]), []).append(float(match.group(3)))
    return out


def _stats_rank(raw: dict[tuple[str | None, str], list[float]], dp_rank: int | None) -> list[float]:
    """The lowest tp_rank's values within one DP rank (the stats-logging scheduler)."""
    key = None if dp_rank is None else str(dp_rank)
    tp_ranks = sorted(tp for dp, tp in raw if dp == key)
    return raw[(key, tp_ranks[0])]


@pytest.mark.parametrize("name", FIXTURES)
def test_memory_gauges_match_the_raw_exposition(name: str) -> None:
    text = (METRICS / name).read_text()
    observation = parse_metrics(text)
    weights = _raw(text, "sglang:weight_memory_usage_gb")
    startup = _raw(text, "sglang:startup_available_gpu_memory_gb")
    graphs = _raw(text, "sglang:graph_memory_usage_gb")
    assert weights and startup and graphs
    for rank in observation.ranks:
        assert rank.weight_memory_gb == _stats_rank(weights, rank.dp_rank)[0]
        assert rank.startup_available_memory_gb == _stats_rank(startup, rank.dp_rank)[0]
        phases = _stats_rank(graphs, rank.dp_rank)
        assert len(phases) >= 2  # decode and prefill are separate series
        assert rank.graph_memory_gb == pytest.approx(sum(phases))


def test_graph_phases_sum_per_rank_and_absent_gauges_stay_none() -> None:
    text = (
        "# TYPE sglang:graph_memory_usage_gb gauge\n"
        'sglang:graph_memory_usage_gb{dp_rank="0",phase="decode",tp_rank="1"} 9.0\n'
        'sglang:graph_memory_usage_gb{dp_rank="0",phase="decode",tp_rank="0"} 1.5\n'
        'sglang:graph_memory_usage_gb{dp_rank="0",phase="target_verify",tp_rank="0"} 0.75\n'
        'sglang:graph_memory_usage_gb{dp_rank="1",phase="decode",tp_rank="0"} 2.0\n'
    )
    observation = parse_metrics(text)
    by_dp = {rank.dp_rank: rank for rank in observation.ranks}
    assert by_dp[0].graph_memory_gb == pytest.approx(2.25)  # tp_rank 0: 1.5 + 0.75; tp_rank 1 ignored
    assert by_dp[1].graph_memory_gb == pytest.approx(2.0)
    assert by_dp[0].weight_memory_gb is None and by_dp[0].startup_available_memory_gb is None
