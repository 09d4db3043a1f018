"""The store path's pure half: the fixed fleet queries, and store rows read back into the MetricsObservation a
direct scrape gives. Golden tests run the genuine SGLang 0.5.23 expositions through a small evaluator of the
three query shapes (what Prometheus answers for one scrape of them) and compare with `parse_metrics`."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import fields

import pytest
from fake_store import Sample, exposition_samples
from fake_store import evaluate as evaluate_rows
from support import METRICS

from advisor.estimate.traffic import queue_share_over
from advisor.feeder import constants_from_server_info
from advisor.model.serving import ServingConfig, slots_per_request
from advisor.scheduler.engine import DEFAULT_QUEUE_TIME_BOUND
from advisor.scrub import NAME_CHARS, scrub_text
from advisor.sources.fleet_queries import (
    HISTOGRAM_FAMILIES,
    PHASE_FAMILIES,
    QUEUE_TIME_EDGES,
    RANK_FAMILIES,
    TOKENIZER_COUNTERS,
    FleetFrame,
    FleetQuery,
    KnownRows,
    fleet_queries,
    replay_step,
    server_info_from_gauges,
    shard_of,
)
from advisor.sources.metrics import RankMetrics, parse_metrics
from advisor.sources.prometheus_store import scan_vector

FIXTURES = ("single", "tp2", "dp2tp4")
Row = tuple[dict[str, str], list[tuple[float, float]]]


def exposition(name: str) -> str:
    return (METRICS / f"sglang-0.5.23-{name}.prom").read_text()


def evaluate(query: FleetQuery, samples: list[Sample], at: float) -> list[Row]:
    """What Prometheus answers for one of the query shapes, as rows of one point at `at`."""
    return [(labels, [(at, value)]) for labels, value in evaluate_rows(query.expr, samples)]


def store_frame(fleet: dict[str, str], times: Iterable[float] = (1000.0,), server_labels=("instance",)) -> FleetFrame:
    frame = FleetFrame(server_labels)
    for at in times:
        for query in fleet_queries('job="sglang"', server_labels):
            rows: list[Row] = []
            for instance, text in fleet.items():
                rows += evaluate(query, exposition_samples(text, instance=instance, job="sglang"), at)
            frame.add(query, rows)
    return frame


@pytest.mark.parametrize("name", FIXTURES)
def test_store_rows_read_back_as_the_direct_scrape(name):
    text = exposition(name)
    direct = parse_metrics(text)
    ((at, stored),) = store_frame({"gpu-a:30000": text}).observations("gpu-a:30000")
    assert at == 1000.0
    assert [rank.dp_rank for rank in stored.ranks] == [rank.dp_rank for rank in direct.ranks]
    for mine, theirs in zip(stored.ranks, direct.ranks, strict=True):
        for f in fields(RankMetrics):
            assert getattr(mine, f.name) == pytest.approx(getattr(theirs, f.name)), (name, mine.dp_rank, f.name)
    for histogram in ("prompt_tokens_histogram", "generation_tokens_histogram"):
        assert getattr(stored, histogram) == getattr(direct, histogram)
    for counter in ("requests_total", "aborted_requests_total", "prompt_tokens_total", "generation_tokens_total",
                    "cached_tokens_total"):
        assert getattr(stored, counter) == pytest.approx(getattr(direct, counter))
    assert stored.model_name == direct.model_name
    assert stored.families_seen <= direct.families_seen


def test_every_rank_field_the_parser_fills_is_asked_for():
    """A family added to the parser is read from the store too (the tables are shared), graph memory by phase."""
    asked = set(RANK_FAMILIES.values()) | set(PHASE_FAMILIES.values())
    filled = {f.name for f in fields(RankMetrics)} - {"dp_rank", "state_pool_slots"}
    assert filled == asked


def test_the_queries_are_the_same_five_whatever_the_fleet():
    queries = fleet_queries('job="sglang", env=~"prod"', ("cluster", "instance"))
    assert [q.name for q in queries] == ["rank", "counters", "prompt_tokens_histogram", "generation_tokens_histogram",
                                         "queue_time_seconds"]
    for query in queries:
        assert 'job="sglang", env=~"prod"' in query.expr
        assert "by (__name__, cluster, instance" in query.expr
    names = re.search(r'__name__=~"([^"]+)"', queries[0].expr).group(1)
    assert all(re.fullmatch(names, family) for family in {**RANK_FAMILIES, **PHASE_FAMILIES})
    assert 'priority=""' in queries[0].expr  # per-priority breakdowns of the scheduler gauges are left out
    counters = re.search(r'__name__=~"([^"]+)"', queries[1].expr).group(1)
    assert all(re.fullmatch(counters, family) for family in TOKENIZER_COUNTERS)
    for query, family in zip(queries[2:], HISTOGRAM_FAMILIES, strict=True):
        assert family + "_(bucket|sum|count)" in query.expr and "le)" in query.expr
    # the scheduler's queue-time histogram: one copy per DP rank (max over its TP ranks), then the DP ranks summed
    assert queries[4].expr.startswith("sum by (__name__, cluster, instance, le) (max by (__name__, cluster, "
                                      "instance, dp_rank, le) (")
    assert "{" not in fleet_queries()[0].expr.split("({", 1)[1].replace('{__name__', '')  # no selector: none added


# SGLang 0.5.23's queue-time buckets (observability/metrics_collector.py, sglang:queue_time_seconds)
QUEUE_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90,
                 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000)


def _queue_time_lines(waits_by_dp_rank: dict[str, list[float]], tp_ranks: int) -> str:
    """sglang:queue_time_seconds as prometheus_client writes it, observed alike on every TP rank of a DP rank."""
    lines = ["# HELP sglang:queue_time_seconds Histogram of queueing time in seconds.",
             "# TYPE sglang:queue_time_seconds histogram"]
    for dp_rank, waits in waits_by_dp_rank.items():
        for tp_rank in range(tp_ranks):
            labels = f'dp_rank="{dp_rank}",engine_type="unified",model_name="m",pp_rank="0",tp_rank="{tp_rank}"'
            for bound in (*QUEUE_BUCKETS, math.inf):
                le = "+Inf" if bound == math.inf else repr(float(bound))
                count = sum(1 for wait in waits if wait <= bound)
                lines.append(f'sglang:queue_time_seconds_bucket{{{labels},le="{le}"}} {float(count)}')
            lines.append(f"sglang:queue_time_seconds_count{{{labels}}} {float(len(waits))}")
            lines.append(f"sglang:queue_time_seconds_sum{{{labels}}} {float(sum(waits))}")
    return "\n".join(lines) + "\n"


def test_the_queue_time_histogram_from_the_store_says_what_the_direct_scrape_says_beyond_the_bound():
    """The store is asked for the bound's edge of the queue-time histogram only, one TP copy per DP rank: the
    share of requests that waited beyond the replay's queue bound is the direct scrape's, to the last digit."""
    waits = {"0": [0.0, 0.3, 2.0, 9.0, 10.0, 12.0, 45.0], "1": [0.02, 11.0, 700.0]}
    text = exposition("dp2tp4") + _queue_time_lines(waits, tp_ranks=4)
    direct = parse_metrics(text).queue_time_histogram
    ((_, stored),) = store_frame({"gpu-a:30000": text}).observations("gpu-a:30000")
    histogram = stored.queue_time_histogram
    assert direct is not None and histogram is not None
    assert histogram.count == direct.count == 10  # DP ranks summed, TP copies not
    assert histogram.upper_bounds == (10.0, math.inf) and len(direct.upper_bounds) == len(QUEUE_BUCKETS) + 1
    for bound in QUEUE_TIME_EDGES:
        from_store = queue_share_over(histogram.upper_bounds, histogram.bucket_counts(), bound)
        assert from_store == queue_share_over(direct.upper_bounds, direct.bucket_counts(), bound) == 0.4
    assert DEFAULT_QUEUE_TIME_BOUND in QUEUE_TIME_EDGES  # the edge asked for is the one the replay reads


def test_rows_group_by_server_and_time():
    fleet = {"gpu-a:30000": exposition("single"), "gpu-b:30000": exposition("dp2tp4")}
    frame = store_frame(fleet, times=(2000.0, 1000.0))
    assert frame.servers() == ["gpu-a:30000", "gpu-b:30000"]
    timeline = frame.observations("gpu-b:30000")
    assert [t for t, _ in timeline] == [1000.0, 2000.0]
    assert [len(obs.ranks) for _, obs in timeline] == [2, 2]
    assert len(frame.pop_observations("gpu-a:30000")) == 2 and frame.servers() == ["gpu-b:30000"]
    frame.add(fleet_queries()[0], [({"__name__": "sglang:num_running_reqs"}, [(1.0, 3.0)]),  # no server label
                                   ({"__name__": "sglang:unknown", "instance": "x"}, [(1.0, 3.0)])])
    assert frame.skipped_rows == 2


def test_several_labels_name_a_server():
    frame = FleetFrame(("cluster", "instance"))
    query = fleet_queries("", ("cluster", "instance"))[0]
    frame.add(query, [({"__name__": "sglang:num_running_reqs", "cluster": "eu", "instance": "gpu:1"}, [(5.0, 4.0)]),
                      ({"__name__": "sglang:num_running_reqs", "cluster": "us", "instance": "gpu:1"}, [(5.0, 9.0)])])
    assert frame.servers() == ["eu/gpu:1", "us/gpu:1"]
    assert frame.server_label_values["us/gpu:1"] == {"cluster": "us", "instance": "gpu:1"}
    assert frame.observations("us/gpu:1")[0][1].ranks[0].running_requests == 9


def test_labels_as_the_store_sent_them_are_scrubbed_where_kept():
    """The fleet reads answers with their labels unscrubbed (a million rows a cycle are only looked up): the
    frame scrubs what it keeps, so a server or model name carrying a line break or a credential is cleaned."""
    frame = FleetFrame()
    rank, counters = fleet_queries()[:2]
    hostile = "gpu-a:30000\nAuthorization: Bearer abcdefghijklmnopqrstuvwxyz0123"
    frame.add(rank, [({"__name__": "sglang:num_running_reqs", "instance": hostile}, [(1.0, 4.0)])])
    frame.add(counters, [({"__name__": "sglang:num_requests_total", "instance": hostile,
                           "model_name": "org/model\r\nX-Injected: 1"}, [(1.0, 7.0)])])
    (name,) = frame.servers()
    assert "\n" not in name and "abcdefghijklmnopqrstuvwxyz0123" not in name and name.startswith("gpu-a:30000")
    assert frame.server_label_values[name] == {"instance": name}
    ((_, observation),) = frame.observations(name)
    assert observation.ranks[0].running_requests == 4 and observation.requests_total == 7
    assert observation.model_name is not None and "\r" not in observation.model_name
    assert "\n" not in observation.model_name


def test_rows_read_the_same_as_the_store_sent_them_or_scrubbed():
    """Raw labels (the fleet's fast path) and scrubbed labels give the same observations, row for row."""
    fleet = {"gpu-a:30000": exposition("single"), "gpu-b:30000": exposition("dp2tp4")}
    frames = []
    for scrub_first in (True, False):
        frame = FleetFrame()
        for at in (1000.0, 1015.0):
            for query in fleet_queries('job="sglang"'):
                rows = []
                for instance, text in fleet.items():
                    for labels, points in evaluate(query, exposition_samples(text, instance=instance, job="sglang"), at):
                        rows.append(({k: scrub_text(v, NAME_CHARS) for k, v in labels.items()} if scrub_first
                                     else dict(labels), points))
                frame.add(query, rows)
        frames.append({name: frame.observations(name) for name in frame.servers()})
    assert frames[0] == frames[1] and len(frames[0]) == 2


def test_graph_memory_is_summed_over_phases_and_nan_is_no_sample():
    frame = FleetFrame()
    query = fleet_queries()[0]
    frame.add(query, [
        ({"__name__": "sglang:graph_memory_usage_gb", "instance": "a", "phase": "decode"}, [(1.0, 1.7)]),
        ({"__name__": "sglang:graph_memory_usage_gb", "instance": "a", "phase": "prefill"}, [(1.0, 0.4)]),
        ({"__name__": "sglang:num_running_reqs", "instance": "a"}, [(1.0, math.nan), (2.0, 3.0)]),
    ])
    (t1, first), (t2, second) = frame.observations("a")
    assert first.ranks[0].graph_memory_gb == pytest.approx(2.1) and first.ranks[0].running_requests is None
    assert second.ranks[0].running_requests == 3 and isinstance(second.ranks[0].running_requests, int)


def test_a_histogram_without_inf_or_with_falling_counts_reads_as_absent():
    query = fleet_queries()[2]
    bucket = "sglang:prompt_tokens_histogram_bucket"
    cut = FleetFrame()
    cut.add(query, [({"__name__": bucket, "instance": "a", "le": "100"}, [(1.0, 3.0)])])
    assert cut.observations("a")[0][1].prompt_tokens_histogram is None
    falling = FleetFrame()
    falling.add(query, [({"__name__": bucket, "instance": "a", "le": "100"}, [(1.0, 5.0)]),
                        ({"__name__": bucket, "instance": "a", "le": "+Inf"}, [(1.0, 4.0)])])
    assert falling.observations("a")[0][1].prompt_tokens_histogram is None


def test_pool_gauges_stand_in_for_server_info():
    observation = parse_metrics(exposition("dp2tp4"))
    truth = json.loads((METRICS / "sglang-0.5.23-dp2tp4.truth.json").read_text())
    info = server_info_from_gauges(observation, assumed_ratio=0.9)
    assert info is not None and info.serving.mamba_full_memory_ratio == 0.9
    assert [s.max_mamba_cache_size for s in info.shards] == [r["mamba_size"] for r in truth["ranks"]]
    assert [s.kv_capacity_tokens for s in info.shards] == [r["kv_tokens"] for r in truth["ranks"]]
    assert [s.kv_cache_gb for s in info.shards] == pytest.approx([r["kv_gb"] for r in truth["ranks"]])
    slots = slots_per_request(info.serving)
    assert [s.effective_max_running_requests for s in info.shards] == [r["mamba_size"] // slots for r in truth["ranks"]]
    assert constants_from_server_info(info) is not None
    # a different assumed ratio moves the slot size with it: the assumption is the whole caveat
    other = server_info_from_gauges(observation, assumed_ratio=1.8, serving=ServingConfig(strategy="no_buffer"))
    assert other is not None and other.serving.strategy == "no_buffer"
    low, high = constants_from_server_info(info), constants_from_server_info(other)
    assert low is not None and high is not None
    assert high[0].state_bytes_per_slot > 1.9 * low[0].state_bytes_per_slot
    # without the pool gauges (SGLang before 0.5.16) there is nothing to stand in with
    bare = parse_metrics("sglang:num_running_reqs 3\n")
    assert server_info_from_gauges(bare) is None


def test_shards_split_the_servers_disjointly_and_cover_them():
    """Every server lands in exactly one of n shards (the hash is stable across frames), and a sharded frame
    keeps only its servers' rows, counting the others' apart from unreadable rows."""
    rank = next(q for q in fleet_queries() if q.kind == "rank")
    names = [f"10.0.{i // 256}.{i % 256}:30000" for i in range(300)]
    rows = [({"__name__": "sglang:num_running_reqs", "instance": name}, [(1.0, 3.0)]) for name in names]
    for total in (1, 2, 3):
        kept = []
        for index in range(total):
            frame = FleetFrame(shard=(index, total))
            frame.add(rank, rows)
            assert frame.other_shard_rows == len(names) - len(frame.servers()) and frame.skipped_rows == 0
            assert all(shard_of([name], total) == index for name in frame.servers())
            kept.append(set(frame.servers()))
        assert set().union(*kept) == set(names) and sum(map(len, kept)) == len(names)
        if total > 1:  # md5 spreads them: no shard is starved
            assert min(map(len, kept)) > len(names) / total / 2


def test_replay_step():
    assert replay_step(7 * 86400) == math.ceil(7 * 86400 / 240)
    assert replay_step(3600) == 60.0  # never below the floor
    assert replay_step(3600, max_points=10, min_step_seconds=1) == 360
    with pytest.raises(ValueError):
        replay_step(0)


def vector_answer(rows: list[Row]) -> str:
    """The rows as Prometheus writes an instant query's answer (compact JSON, each value a quoted number)."""
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [points[0][0], "NaN" if points[0][1] != points[0][1] else repr(points[0][1])]}
        for labels, points in rows]}}, separators=(",", ":"))


@pytest.mark.parametrize("shard", [None, (0, 2), (1, 2)])
def test_vector_texts_read_as_the_decoded_rows(shard):
    """An instant answer read from its text (the fleet's every cycle) fills the frame as the decoded rows do,
    rows skipped and another shard's counted alike; a second answer with the same labels reuses the rows'
    servers and slots, and one whose labels changed resolves them again."""
    fleet = {"gpu-a:30000": exposition("single"), "gpu-b:30000": exposition("dp2tp4"),
             "gpu-c:30000": exposition("single")}
    known = {query.name: KnownRows() for query in fleet_queries('job="sglang"')}
    for at, extra in ((1000.0, False), (1015.0, False), (1030.0, True)):
        decoded, texts = FleetFrame(shard=shard), FleetFrame(shard=shard)
        for query in fleet_queries('job="sglang"'):
            rows = []
            for instance, text in fleet.items():
                rows += evaluate(query, exposition_samples(text, instance=instance, job="sglang"), at)
            rows.append(({"__name__": "sglang:unknown_family", "instance": "gpu-a:30000"}, [(at, 1.0)]))
            rows.append(({"__name__": "sglang:num_running_reqs", "instance": "gpu-b:30000"}, [(at, math.nan)]))
            if extra:  # a server joins: the labels changed
                rows.append(({"__name__": "sglang:num_running_reqs", "instance": "gpu-d:30000"}, [(at, 2.0)]))
            decoded.add(query, [(labels, points) for labels, points in rows if points[0][1] == points[0][1]])
            scanned = scan_vector(vector_answer(rows), known_digest=known[query.name].digest)
            assert scanned is not None and len(scanned.values) == len(rows)
            assert (scanned.rows is None) == (at == 1015.0)  # the labels of the answer before: values only
            assert texts.add_texts(query, scanned, known[query.name]) == 1  # the NaN sample
        assert texts.servers() == decoded.servers() and len(texts.servers()) >= 1
        assert {name: texts.observations(name) for name in texts.servers()} == \
            {name: decoded.observations(name) for name in decoded.servers()}
        assert (texts.skipped_rows, texts.other_shard_rows, texts.values_added) == \
            (decoded.skipped_rows, decoded.other_shard_rows, decoded.values_added)
        assert texts.server_label_values == decoded.server_label_values
