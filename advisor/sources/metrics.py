"""Fast parser of SGLang's Prometheus `/metrics` text into one `MetricsObservation` per scrape.

Reads only the `sglang:` families the advisor needs and skips every other line after a prefix check, so a
150 KB multiprocess exposition costs well under a millisecond. Label rules follow SGLang 0.5.23
`observability/metrics_collector.py` (scheduler labels vs tokenizer labels, see the comments below).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from advisor.errors import InputError, LimitExceeded


class MetricsParseError(InputError):
    """The `/metrics` body is not a complete Prometheus text exposition we can read."""


class MetricsLimitExceeded(MetricsParseError, LimitExceeded):
    """The exposition exceeds one of `MetricsLimits` (a hostile or broken target): nothing of it is kept."""


@dataclass(frozen=True)
class MetricsLimits:
    """Caps on one exposition (config: max_line_bytes, max_labels_per_series, max_series). Lengths are
    counted in characters of the decoded text (at most the bytes for UTF-8)."""

    max_line_bytes: int = 1 << 20
    max_labels_per_series: int = 64
    max_series: int = 200_000


DEFAULT_LIMITS = MetricsLimits()


@dataclass(frozen=True, slots=True)
class RankMetrics:
    """One DP rank's pool state, read from its stats-logging scheduler (tp_rank 0 within the DP rank).

    None means the family was absent from the exposition (older SGLang, or metrics not yet written).
    State-pool figures are slots (one per running request or cached state), not tokens.
    """

    dp_rank: int | None
    running_requests: int | None = None
    queued_requests: int | None = None
    kv_capacity_tokens: int | None = None
    kv_used_tokens: int | None = None
    kv_available_tokens: int | None = None
    kv_evictable_tokens: int | None = None
    state_slots_used: int | None = None
    state_slots_available: int | None = None
    state_slots_evictable: int | None = None
    state_pool_slots: int | None = None
    decode_sum_seq_lens: int | None = None
    new_token_ratio: float | None = None
    full_token_usage: float | None = None
    mamba_usage: float | None = None
    token_usage: float | None = None
    gen_throughput: float | None = None
    page_size: int | None = None
    context_len: int | None = None
    kv_cache_memory_gb: float | None = None
    retracted_requests_total: float | None = None
    retracted_input_tokens_total: float | None = None
    retracted_output_tokens_total: float | None = None
    spec_accept_length: float | None = None
    spec_num_draft_tokens: int | None = None
    # Size of the latest retraction in the last stats window (gauge with a `pid` label; the counter above
    # is the reliable source) and requests paused by async weight sync.
    last_retracted_requests: int | None = None
    paused_requests: int | None = None
    # Memory gauges (GiB, set once at startup): weights, idle memory after the pools and graph capture
    # (scheduler.py measures startup_available after building the worker), and graphs summed over phases.
    weight_memory_gb: float | None = None
    startup_available_memory_gb: float | None = None
    graph_memory_gb: float | None = None


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram: cumulative counts per upper bound (the last bound is +Inf)."""

    upper_bounds: tuple[float, ...]
    cumulative_counts: tuple[float, ...]
    sum: float
    count: float

    def bucket_counts(self) -> tuple[float, ...]:
        """Non-cumulative count per bucket (observations in (previous bound, this bound])."""
        counts = self.cumulative_counts
        return tuple(map(operator.sub, counts, (0.0, *counts[:-1])))


@dataclass(frozen=True, slots=True)
class MetricsObservation:
    """What one scrape of `/metrics` says. Counters are lifetime totals (see `advisor.estimate.deltas`)."""

    ranks: list[RankMetrics]
    model_name: str | None = None
    requests_total: float | None = None
    aborted_requests_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    cached_tokens_total: float | None = None
    prompt_tokens_histogram: Histogram | None = None
    generation_tokens_histogram: Histogram | None = None
    queue_time_histogram: Histogram | None = None
    families_seen: frozenset[str] = field(default_factory=frozenset)

    def rank(self, dp_rank: int | None) -> RankMetrics | None:
        for rank in self.ranks:
            if rank.dp_rank == dp_rank:
                return rank
        return None


# Family name -> RankMetrics field. Scheduler-side: written per scheduler rank, carry tp_rank/dp_rank.
_RANK_GAUGES: dict[str, str] = {
    "sglang:num_running_reqs": "running_requests",
    "sglang:num_queue_reqs": "queued_requests",
    "sglang:max_total_num_tokens": "kv_capacity_tokens",
    "sglang:kv_used_tokens": "kv_used_tokens",
    "sglang:kv_available_tokens": "kv_available_tokens",
    "sglang:kv_evictable_tokens": "kv_evictable_tokens",
    "sglang:mamba_used_tokens": "state_slots_used",
    "sglang:mamba_available_tokens": "state_slots_available",
    "sglang:mamba_evictable_tokens": "state_slots_evictable",
    "sglang:decode_sum_seq_lens": "decode_sum_seq_lens",
    "sglang:new_token_ratio": "new_token_ratio",
    "sglang:full_token_usage": "full_token_usage",
    "sglang:mamba_usage": "mamba_usage",
    "sglang:token_usage": "token_usage",
    "sglang:gen_throughput": "gen_throughput",
    "sglang:page_size": "page_size",
    "sglang:context_len": "context_len",
    "sglang:kv_cache_memory_usage_gb": "kv_cache_memory_gb",
    "sglang:weight_memory_usage_gb": "weight_memory_gb",
    "sglang:startup_available_gpu_memory_gb": "startup_available_memory_gb",
    "sglang:spec_accept_length": "spec_accept_length",
    "sglang:spec_num_draft_tokens": "spec_num_draft_tokens",
    # Gauges without multiprocess_mode: one series per writing process, told apart by a `pid` label.
    "sglang:num_retracted_reqs": "last_retracted_requests",
    "sglang:num_paused_reqs": "paused_requests",
}
# Scheduler counters written on EVERY TP rank (managers/scheduler.py update_running_batch): count once.
_RANK_COUNTERS: dict[str, str] = {
    "sglang:num_retracted_requests_total": "retracted_requests_total",
    "sglang:num_retracted_input_tokens_total": "retracted_input_tokens_total",
    "sglang:num_retracted_output_tokens_total": "retracted_output_tokens_total",
}
# Tokenizer-side counters: no rank labels; summed over is_streaming / cache_source / custom labels.
_GLOBAL_COUNTERS: dict[str, str] = {
    "sglang:num_requests_total": "requests_total",
    "sglang:num_aborted_requests_total": "aborted_requests_total",
    "sglang:prompt_tokens_total": "prompt_tokens_total",
    "sglang:generation_tokens_total": "generation_tokens_total",
    "sglang:cached_tokens_total": "cached_tokens_total",
}
# Gauges split by a `phase` label (metrics_collector.py `emit_constants`): summed over phases per rank.
_PHASE_GAUGES: dict[str, str] = {"sglang:graph_memory_usage_gb": "graph_memory_gb"}
_HISTOGRAMS: dict[str, str] = {
    "sglang:prompt_tokens_histogram": "prompt_tokens_histogram",
    "sglang:generation_tokens_histogram": "generation_tokens_histogram",
    "sglang:queue_time_seconds": "queue_time_histogram",
}
# The families the parser reads, by how a store's rows of them are aggregated (advisor.sources.fleet_queries):
# scheduler-side per DP rank (written alike on every TP rank), per rank and phase, tokenizer-side counters,
# histograms. Read-only views of the tables above: the one source of truth for both readers.
RANK_FAMILIES: Mapping[str, str] = MappingProxyType({**_RANK_GAUGES, **_RANK_COUNTERS})
PHASE_FAMILIES: Mapping[str, str] = MappingProxyType(dict(_PHASE_GAUGES))
TOKENIZER_COUNTERS: Mapping[str, str] = MappingProxyType(dict(_GLOBAL_COUNTERS))
HISTOGRAM_FAMILIES: Mapping[str, str] = MappingProxyType(dict(_HISTOGRAMS))
_INTEGER_FIELDS = frozenset(
    {
        "running_requests",
        "queued_requests",
        "kv_capacity_tokens",
        "kv_used_tokens",
        "kv_available_tokens",
        "kv_evictable_tokens",
        "state_slots_used",
        "state_slots_available",
        "state_slots_evictable",
        "decode_sum_seq_lens",
        "page_size",
        "context_len",
        "spec_num_draft_tokens",
        "last_retracted_requests",
        "paused_requests",
    }
)

_KIND_GAUGE, _KIND_RANK_COUNTER, _KIND_GLOBAL_COUNTER, _KIND_BUCKET, _KIND_HSUM, _KIND_HCOUNT, _KIND_PHASE = range(7)
_SAMPLE_KIND: dict[str, tuple[int, str, str]] = {}  # sample name -> (kind, family, field)
for _name, _field in _RANK_GAUGES.items():
    _SAMPLE_KIND[_name] = (_KIND_GAUGE, _name, _field)
for _name, _field in _RANK_COUNTERS.items():
    _SAMPLE_KIND[_name] = (_KIND_RANK_COUNTER, _name, _field)
for _name, _field in _GLOBAL_COUNTERS.items():
    _SAMPLE_KIND[_name] = (_KIND_GLOBAL_COUNTER, _name, _field)
for _name, _field in _PHASE_GAUGES.items():
    _SAMPLE_KIND[_name] = (_KIND_PHASE, _name, _field)
for _name, _field in _HISTOGRAMS.items():
    _SAMPLE_KIND[_name + "_bucket"] = (_KIND_BUCKET, _name, _field)
    _SAMPLE_KIND[_name + "_sum"] = (_KIND_HSUM, _name, _field)
    _SAMPLE_KIND[_name + "_count"] = (_KIND_HCOUNT, _name, _field)
# str.startswith with a tuple runs in C: the cheap gate before any per-line work.
_WANTED_PREFIXES = tuple(sorted({name for _, name, _ in _SAMPLE_KIND.values()}))

_LABELS_BLOCK = re.compile(r"(?:\s*[a-zA-Z_][a-zA-Z0-9_]*=\"(?:[^\"\\\n]|\\.)*\"\s*,?)*\s*")
_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)=\"((?:[^\"\\\n]|\\.)*)\"")
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")

# (pp_rank, tp_rank, moe_ep_rank): orders the scheduler series within one DP rank; lowest = stats rank.
_RankKey = tuple[int, int, int]


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return value.replace("\\\\", "\0").replace('\\"', '"').replace("\\n", "\n").replace("\0", "\\")


def _int_label(labels: dict[str, str], name: str, line_number: int) -> int | None:
    raw = labels.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise MetricsParseError(
            f"metrics line {line_number}: label {name}={raw!r} is not an integer"
        ) from None


class _Accumulator:
    """Collects the samples of the families we read, keyed so the selection rules can run at the end."""

    def __init__(self) -> None:
        # (field, dp_rank) -> (rank key, value): the lowest scheduler rank wins (stats-logging rank).
        self.rank_values: dict[tuple[str, int | None], tuple[_RankKey, float]] = {}
        # counter field -> dp_rank -> rank key (None: tokenizer side) -> sum over the other labels
        self.global_counters: dict[str, dict[int | None, dict[_RankKey | None, float]]] = {}
        # histogram field -> dp_rank -> rank key -> [buckets{le: count}, sum, count]
        self.histograms: dict[str, dict[int | None, dict[_RankKey | None, list]]] = {}
        self.dp_ranks: set[int | None] = set()
        self.model_name: str | None = None
        # (field, dp_rank) -> rank key -> sum over the phase label
        self.phase_sums: dict[tuple[str, int | None], dict[_RankKey, float]] = {}

    def add_rank_value(self, field_name: str, dp_rank: int | None, rank_key: _RankKey, value: float) -> None:
        key = (field_name, dp_rank)
        current = self.rank_values.get(key)
        if current is None or rank_key < current[0]:
            self.rank_values[key] = (rank_key, value)
        elif rank_key == current[0] and value > current[1]:
            # Same rank twice: only the pid-labelled gauges do this (a restarted process leaves its old
            # series behind); take the max as the reference advises.
            self.rank_values[key] = (rank_key, value)


def parse_metrics(text: str, limits: MetricsLimits = DEFAULT_LIMITS) -> MetricsObservation:
    """Parse one `/metrics` body. Raises MetricsParseError naming the line for anything unreadable, and
    MetricsLimitExceeded for a line, a label set or a series count beyond `limits`."""
    if not text.strip():
        raise MetricsParseError("metrics exposition is empty (is the server started with --enable-metrics?)")
    lines = text.split("\n")
    if lines[-1] != "":
        raise MetricsParseError(
            f"metrics line {len(lines)}: exposition cut mid-line (no newline after {lines[-1][:60]!r})"
        )
    acc = _Accumulator()
    families: set[str] = set()
    wanted = _WANTED_PREFIXES
    sample_kind = _SAMPLE_KIND
    name_start = _NAME_START
    max_line = limits.max_line_bytes
    max_labels = limits.max_labels_per_series
    series_left = limits.max_series
    for index, line in enumerate(lines):
        if len(line) > max_line:
            raise MetricsLimitExceeded(
                f"metrics line {index + 1}: {len(line)} characters, more than max_line_bytes={max_line}"
            )
        if line.startswith(wanted):
            series_left -= 1
            if series_left < 0:
                raise MetricsLimitExceeded(
                    f"metrics line {index + 1}: more than max_series={limits.max_series} samples of the families read"
                )
            _read_sample(line, index + 1, sample_kind, acc, families, max_labels)
        elif line.startswith("sglang:") or not line:
            continue  # another SGLang family, a blank line
        elif line[0] == "#":
            if line.startswith("# TYPE "):
                families.add(line[7:].partition(" ")[0])
        else:
            # A foreign family (python_gc_*, process_*): check only that it looks like a sample line.
            brace = line.rfind("}")
            tail = line[brace + 1 :].split() if brace >= 0 else line.split()[1:]
            if line[0] not in name_start or not 1 <= len(tail) <= 2 or not _is_number(tail[0]):
                if line.isspace():
                    continue
                raise MetricsParseError(f"metrics line {index + 1}: not a Prometheus sample: {line[:60]!r}")
    return _build(acc, families)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _split_labels(label_text: str, line: str, line_number: int) -> dict[str, str]:
    """`a="x",b="y"` -> dict. Plain split when no value holds an escape (the usual case), else the regex."""
    if not label_text:
        return {}
    if "\\" not in label_text:
        body = label_text.rstrip(",")
        if not body.endswith('"'):
            raise MetricsParseError(f"metrics line {line_number}: malformed labels: {line[:80]!r}")
        labels = {}
        for pair in body[:-1].split('",'):
            key, sep, value = pair.partition('="')
            if not sep or not key:
                raise MetricsParseError(f"metrics line {line_number}: malformed labels: {line[:80]!r}")
            labels[key.strip()] = value
        return labels
    if _LABELS_BLOCK.fullmatch(label_text) is None:
        raise MetricsParseError(f"metrics line {line_number}: malformed labels: {line[:80]!r}")
    return {key: _unescape(value) for key, value in _LABEL.findall(label_text)}


class _SeriesInfo(NamedTuple):
    """What the selection rules need from one label set (cached: every scrape repeats the same sets)."""

    dp_rank: int | None
    rank_key: _RankKey | None  # None on the tokenizer side (no tp_rank label)
    skip: bool  # a per-priority breakdown of a scheduler metric
    le: float | None
    model_name: str | None
    label_count: int


# Every scrape repeats the same label sets, so their parse is cached. Bounded by entries AND characters: a
# target whose label sets change every scrape (or are huge) churns the cache but cannot grow it.
_SERIES_CACHE: dict[str, _SeriesInfo] = {}
_SERIES_CACHE_LIMIT = 8192
_SERIES_CACHE_MAX_KEY = 1024  # longer label sets are parsed every time, never kept
_SERIES_CACHE_MAX_CHARS = 2 << 20
_series_cache_chars = 0


def _series_info(label_text: str, line: str, line_number: int) -> _SeriesInfo:
    global _series_cache_chars
    info = _SERIES_CACHE.get(label_text)
    if info is not None:
        return info
    labels = _split_labels(label_text, line, line_number)
    tp_rank = _int_label(labels, "tp_rank", line_number)
    rank_key: _RankKey | None = None
    if tp_rank is not None:
        rank_key = (
            _int_label(labels, "pp_rank", line_number) or 0,
            tp_rank,
            _int_label(labels, "moe_ep_rank", line_number) or 0,
        )
    le: float | None = None
    raw_le = labels.get("le")
    if raw_le is not None:
        try:
            le = float(raw_le)
        except ValueError:
            raise MetricsParseError(f"metrics line {line_number}: le={raw_le!r} is not a number") from None
    info = _SeriesInfo(
        dp_rank=_int_label(labels, "dp_rank", line_number),
        rank_key=rank_key,
        # Scheduler metrics with --enable-priority-scheduling: the total is priority="" and per-priority
        # breakdowns are priority="<int>" (metrics_collector.py _log_gauge_queue_count); read the total.
        # Tokenizer metrics label each request with its own priority (tokenizer_manager.py collect_metrics),
        # so those series are disjoint and are summed.
        skip=rank_key is not None and bool(labels.get("priority")),
        le=le,
        model_name=labels.get("model_name"),
        label_count=len(labels),
    )
    if len(label_text) > _SERIES_CACHE_MAX_KEY:
        return info
    if len(_SERIES_CACHE) >= _SERIES_CACHE_LIMIT or _series_cache_chars > _SERIES_CACHE_MAX_CHARS:
        _SERIES_CACHE.clear()
        _series_cache_chars = 0
    _SERIES_CACHE[label_text] = info
    _series_cache_chars += len(label_text)
    return info


def _read_sample(
    line: str,
    line_number: int,
    sample_kind: dict[str, tuple[int, str, str]],
    acc: _Accumulator,
    families: set[str],
    max_labels: int,
) -> None:
    brace = line.find("{")
    if brace >= 0:
        name = line[:brace]
        close = line.rfind("}")
        if close < brace:
            raise MetricsParseError(
                f"metrics line {line_number}: malformed sample (unclosed labels): {line[:80]!r}"
            )
        label_text = line[brace + 1 : close]
        tail = line[close + 1 :].split()
    else:
        name, _, rest = line.partition(" ")
        label_text = ""
        tail = rest.split()
    spec = sample_kind.get(name)
    if spec is None:  # a longer name sharing a prefix with one we read
        return
    if not 1 <= len(tail) <= 2:
        raise MetricsParseError(f"metrics line {line_number}: malformed sample: {line[:80]!r}")
    kind, family, field_name = spec
    try:
        value = float(tail[0])
    except ValueError:
        raise MetricsParseError(
            f"metrics line {line_number}: value {tail[0]!r} of {name} is not a number"
        ) from None
    info = _series_info(label_text, line, line_number)
    if info.label_count > max_labels:
        raise MetricsLimitExceeded(
            f"metrics line {line_number}: {info.label_count} labels on {name}, more than "
            f"max_labels_per_series={max_labels}"
        )
    families.add(family)
    if acc.model_name is None:
        acc.model_name = info.model_name
    if info.skip:
        return
    dp_rank = info.dp_rank
    rank_key = info.rank_key
    if kind == _KIND_GAUGE or kind == _KIND_RANK_COUNTER:
        # A layout without rank labels (older or foreign exporter) counts as one rank.
        acc.dp_ranks.add(dp_rank)
        acc.add_rank_value(field_name, dp_rank, rank_key or (0, 0, 0), value)
        return
    if kind == _KIND_PHASE:
        acc.dp_ranks.add(dp_rank)
        per_rank = acc.phase_sums.setdefault((field_name, dp_rank), {})
        key = rank_key or (0, 0, 0)
        per_rank[key] = per_rank.get(key, 0.0) + value
        return
    if rank_key is not None:
        acc.dp_ranks.add(dp_rank)
    if kind == _KIND_GLOBAL_COUNTER:
        by_rank = acc.global_counters.setdefault(field_name, {}).setdefault(dp_rank, {})
        by_rank[rank_key] = by_rank.get(rank_key, 0.0) + value
        return
    per_dp = acc.histograms.setdefault(field_name, {}).setdefault(dp_rank, {})
    slot = per_dp.get(rank_key)
    if slot is None:
        slot = per_dp[rank_key] = [{}, 0.0, 0.0]
    if kind == _KIND_BUCKET:
        bound = info.le
        if bound is None:
            raise MetricsParseError(f"metrics line {line_number}: {name} without an le label")
        buckets = slot[0]
        buckets[bound] = buckets.get(bound, 0.0) + value
    elif kind == _KIND_HSUM:
        slot[1] += value
    else:
        slot[2] += value


def _as_number(field_name: str, value: float) -> float | int:
    if field_name in _INTEGER_FIELDS and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _lowest_rank(by_rank: dict):
    """The tokenizer-side series (no rank), else the lowest scheduler rank's: one copy per DP rank."""
    if None in by_rank:
        return by_rank[None]
    return by_rank[min(by_rank)]


def _sum_counter(per_dp: dict[int | None, dict[_RankKey | None, float]]) -> float:
    return sum(_lowest_rank(by_rank) for by_rank in per_dp.values())


def _merge_histogram(field_name: str, per_dp: dict[int | None, dict[_RankKey | None, list]]) -> Histogram:
    merged: dict[float, float] = {}
    total_sum = 0.0
    total_count = 0.0
    for by_rank in per_dp.values():
        # Scheduler histograms (queue time) may be observed on every TP rank: keep the lowest rank only.
        buckets, hist_sum, hist_count = _lowest_rank(by_rank)
        for bound, count in buckets.items():
            merged[bound] = merged.get(bound, 0.0) + count
        total_sum += hist_sum
        total_count += hist_count
    if math.inf not in merged:
        raise MetricsParseError(f"metrics: histogram {field_name} has no +Inf bucket (exposition truncated?)")
    bounds = tuple(sorted(merged))
    counts = tuple(merged[bound] for bound in bounds)
    for earlier, later in zip(counts, counts[1:], strict=False):
        if later < earlier:
            raise MetricsParseError(
                f"metrics: histogram {field_name} has decreasing cumulative bucket counts"
            )
    return Histogram(upper_bounds=bounds, cumulative_counts=counts, sum=total_sum, count=total_count)


def _build(acc: _Accumulator, families: set[str]) -> MetricsObservation:
    by_rank: dict[int | None, dict[str, float]] = {dp: {} for dp in acc.dp_ranks}
    for (field_name, dp_rank), (_, value) in acc.rank_values.items():
        by_rank.setdefault(dp_rank, {})[field_name] = value
    for (field_name, dp_rank), per_rank in acc.phase_sums.items():
        by_rank.setdefault(dp_rank, {})[field_name] = per_rank[min(per_rank)]
    return build_observation(
        by_rank,
        counters={name: _sum_counter(per_dp) for name, per_dp in acc.global_counters.items()},
        histograms={name: _merge_histogram(name, per_dp) for name, per_dp in acc.histograms.items()},
        model_name=acc.model_name,
        families_seen=families,
    )


def build_observation(
    ranks: Mapping[int | None, Mapping[str, float]],
    *,
    counters: Mapping[str, float],
    histograms: Mapping[str, Histogram | None],
    model_name: str | None,
    families_seen: Iterable[str],
) -> MetricsObservation:
    """The one way to make a `MetricsObservation`, from values already read per DP rank (RankMetrics field ->
    value), tokenizer counters (field -> total) and histograms (field -> Histogram): a scrape's parser and a
    store's rows (advisor.sources.fleet_queries) both end here, so both give the same observation."""
    built = []
    for dp_rank in sorted(ranks, key=lambda dp: -1 if dp is None else dp):
        values: dict[str, float | int] = {name: _as_number(name, value) for name, value in ranks[dp_rank].items()}
        slots = [values.get(name) for name in ("state_slots_used", "state_slots_available", "state_slots_evictable")]
        if all(slot is not None for slot in slots):
            values["state_pool_slots"] = _as_number("state_slots_used", float(sum(slots)))  # type: ignore[arg-type]
        built.append(RankMetrics(dp_rank=dp_rank, **values))  # type: ignore[arg-type]
    return MetricsObservation(
        ranks=built,
        model_name=model_name,
        requests_total=counters.get("requests_total"),
        aborted_requests_total=counters.get("aborted_requests_total"),
        prompt_tokens_total=counters.get("prompt_tokens_total"),
        generation_tokens_total=counters.get("generation_tokens_total"),
        cached_tokens_total=counters.get("cached_tokens_total"),
        prompt_tokens_histogram=histograms.get("prompt_tokens_histogram"),
        generation_tokens_histogram=histograms.get("generation_tokens_histogram"),
        queue_time_histogram=histograms.get("queue_time_histogram"),
        families_seen=frozenset(families_seen),
    )
