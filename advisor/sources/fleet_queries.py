"""What to ask a Prometheus store about a fleet of SGLang servers, and how to read the answers back into the
same `MetricsObservation` a direct `/metrics` scrape gives (`build_observation`, the parser's own builder);
no I/O here: PromQL strings out, result rows in (the client is `advisor.sources.prometheus_store`).

A fixed handful of queries covers every server at once, whatever the fleet size: each aggregates away the
TP-rank copies in PromQL (`max by (<server labels>, dp_rank)` for the scheduler's per-rank gauges and
retraction counters, which every TP rank of a DP rank writes alike; `sum by (<server labels>, le)` for the
tokenizer's histograms and counters, summed over `is_streaming` and custom labels as a direct scrape does,
see `advisor.sources.metrics`). Rows are grouped by the labels that identify a server (default `instance`)
and by timestamp, so a range query replays history as if the advisor had scraped every `step` seconds.
Byte constants without `/server_info` come from the pool gauges (`max_total_num_tokens`,
`kv_cache_memory_usage_gb`, the three `mamba_*_tokens`; SGLang 0.5.23 `observability/metrics_collector.py`
`emit_constants` and `pool_stats_observer.py`), with the live ratio assumed, since no gauge carries it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from advisor.model.serving import ServingConfig, slots_per_request
from advisor.scrub import NAME_CHARS, scrub_text
from advisor.sources.metrics import (
    HISTOGRAM_FAMILIES,
    PHASE_FAMILIES,
    RANK_FAMILIES,
    TOKENIZER_COUNTERS,
    Histogram,
    MetricsObservation,
    build_observation,
)
from advisor.sources.prometheus_store import ScannedVector
from advisor.sources.server_info import ServerInfo, ServerShard

# The families a direct scrape reads, from the parser's own tables (one source of truth: the store path reads
# exactly what `parse_metrics` reads). Scheduler-side (RANK_FAMILIES), one value per DP rank: the gauges come
# from the stats rank, the constants and the retraction counters from every TP rank alike, so `max` keeps one
# copy. Gauges split by `phase` (PHASE_FAMILIES, graph memory) are summed over phases per DP rank, as the
# parser does; tokenizer-side counters (TOKENIZER_COUNTERS, no rank labels) over every other label.
# Histograms: the tokenizer's token histograms carry no rank and are summed; the scheduler's queue-time histogram
# (SCHEDULER_HISTOGRAMS) may be observed on every TP rank of a DP rank alike, so one copy is kept per DP rank
# (`max`, as the parser keeps the lowest rank's) and the DP ranks are summed. Of its 41 buckets only the edges the
# replay's queue check reads are asked for (QUEUE_TIME_EDGES, the queue bound, plus +Inf, _sum and _count): the
# share that waited beyond the bound is the same from them as from all 41, at a tenth of a fleet's rows.
SCHEDULER_HISTOGRAMS = frozenset({"sglang:queue_time_seconds"})
QUEUE_TIME_EDGES: tuple[float, ...] = (10.0,)  # advisor.scheduler.engine.DEFAULT_QUEUE_TIME_BOUND, an SGLang edge


def _le_matcher(edges: Sequence[float]) -> str:
    """A label matcher for the `le` values `edges` take as prometheus_client writes them ("10.0", or "10" as
    other exporters do), plus "+Inf" and no `le` at all (the _sum and _count rows); bracket classes, not
    backslashes, keep "." and "+" literal."""
    written = [f"{int(edge)}([.]0)?" if float(edge).is_integer() else repr(float(edge)).replace(".", "[.]")
               for edge in edges]
    return 'le=~"|' + "|".join([*written, "[+]Inf"]) + '"'
DEFAULT_SERVER_LABELS: tuple[str, ...] = ("instance",)


@dataclass(frozen=True)
class FleetQuery:
    """One PromQL expression of the fixed set, and how its rows are read (`rank`, `counter`, `histogram`)."""

    name: str
    kind: str
    expr: str


def _alternation(names: Iterable[str]) -> str:
    return "|".join(name.removeprefix("sglang:") for name in names)


def fleet_queries(matchers: str = "", server_labels: Sequence[str] = DEFAULT_SERVER_LABELS) -> list[FleetQuery]:
    """The fixed query set for every server matching `matchers` (the inside of a `{...}` selector)."""
    extra = f", {matchers}" if matchers else ""
    by = ", ".join(server_labels)
    # priority="" also matches series without the label: the per-priority breakdowns of a scheduler gauge
    # (--enable-priority-scheduling) are left out, their total kept (metrics_collector.py).
    rank = (
        f'max by (__name__, {by}, dp_rank, phase) '
        f'({{__name__=~"sglang:({_alternation({**RANK_FAMILIES, **PHASE_FAMILIES})})", priority=""{extra}}})'
    )
    counters = (
        f'sum by (__name__, {by}, model_name) ({{__name__=~"sglang:({_alternation(TOKENIZER_COUNTERS)})"{extra}}})'
    )
    queries = [FleetQuery("rank", "rank", rank), FleetQuery("counters", "counter", counters)]
    for family in HISTOGRAM_FAMILIES:
        short = family.removeprefix("sglang:")
        series = f'{{__name__=~"sglang:{short}_(bucket|sum|count)"{extra}}}'
        if family in SCHEDULER_HISTOGRAMS:
            series = (f'max by (__name__, {by}, dp_rank, le) ({{__name__=~"sglang:{short}_(bucket|sum|count)", '
                      f'{_le_matcher(QUEUE_TIME_EDGES)}{extra}}})')
        queries.append(FleetQuery(short, "histogram", f"sum by (__name__, {by}, le) ({series})"))
    return queries


def replay_step(history_seconds: float, *, max_points: int = 240, min_step_seconds: float = 60.0) -> float:
    """The range-query step that replays `history_seconds` in at most `max_points` scrapes, never below
    `min_step_seconds` (a step shorter than the store's scrape interval repeats samples and adds nothing)."""
    if not history_seconds > 0 or max_points < 1:
        raise ValueError("history must be > 0 and max_points >= 1")
    return max(min_step_seconds, math.ceil(history_seconds / max_points))


# Prometheus' relabel `separator` default: `hashmod` hashes the source label values joined by it.
HASHMOD_SEPARATOR = ";"


def shard_of(label_values: Sequence[str], total: int) -> int:
    """Which of `total` shards a server belongs to, the way Prometheus' `hashmod` relabel action computes it
    (model/relabel/relabel.go: md5 of the source label values joined by ";", the digest's last 8 bytes read
    as a big-endian uint64, modulo `total`). A server whose labels are [instance] = ["10.0.0.1:30000"] lands
    where `relabel_configs: [{source_labels: [instance], modulus: total, target_label: shard, action:
    hashmod}]` puts it, so advisor shards can line up with Prometheus' own hashmod sharding."""
    digest = hashlib.md5(HASHMOD_SEPARATOR.join(label_values).encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % total


class _Sample:
    """The rows of one server at one timestamp, as they arrive from the queries (one map per kind of row)."""

    __slots__ = ("maps", "model_name")
    RANK, COUNTER, BUCKET, SUM, COUNT = range(5)

    def __init__(self) -> None:
        # rank: (dp_rank, field) -> value; counter: field -> sum; bucket: histogram -> {le: value};
        # sum/count: histogram -> value
        self.maps: tuple[dict[Any, Any], ...] = ({}, {}, {}, {}, {})
        self.model_name: str | None = None


_MISSING: Any = object()
_OTHER_SHARD: Any = object()  # a row of a server another shard owns
# Rows' places in a sample, (map index, key, bucket bound, adds up, model name): one object for all rows alike.
_WHERES: dict[tuple[Any, ...], tuple[Any, ...]] = {}
# Where a row's values go, by (query kind, family, dp_rank, le): a fleet's million rows a cycle share a few
# hundred of these, so each is worked out once (and a histogram's bounds are the same float objects in every
# server's observation).
_SLOTS: dict[tuple[str, str, str | None, str | None], tuple[int, Any, Any, bool] | None] = {}
_MAX_SLOTS = 4096
_SLOT_LABELS = ("__name__", "dp_rank", "le")  # all `_slot` reads of a row
# Histogram bound tuples, one object per distinct layout (every server of a fleet usually shares one or two).
_BOUNDS: dict[tuple[float, ...], tuple[float, ...]] = {}


class KnownRows:
    """One query's last vector answer as resolved (`FleetFrame.add_texts`): the digest of its labels and each
    row's target, and the label values of its servers; kept across cycles by whoever asks the query."""

    def __init__(self) -> None:
        self.digest: bytes | None = None
        self.servers: list[Any] = []  # each row's server (None or `_OTHER_SHARD`: skipped)
        self.wheres: list[Any] = []  # each row's place in its server's sample (`FleetFrame._resolve`)
        self.server_labels: dict[str, dict[str, str]] = {}


class FleetFrame:
    """Result rows of the fleet queries, grouped per server and timestamp; `observations()` reads them back."""

    def __init__(self, server_labels: Sequence[str] = DEFAULT_SERVER_LABELS,
                 shard: tuple[int, int] | None = None) -> None:
        """`shard` (index, total) keeps only the servers `shard_of` puts in shard `index`; the rows of the
        others are counted in `other_shard_rows`, not kept."""
        self.server_labels = tuple(server_labels)
        self.shard = shard
        self.samples: dict[str, dict[float, _Sample]] = {}
        self.server_label_values: dict[str, dict[str, str]] = {}
        self.other_shards: set[str] = set()  # servers seen that belong to another shard
        self.skipped_rows = 0
        self.other_shard_rows = 0
        self.values_added = 0
        self._server_by_values: dict[tuple[str, ...], str | None] = {}

    def server_of(self, labels: Mapping[str, Any]) -> str | None:
        """The server a row belongs to, or None when it names none or belongs to another shard (its label
        values scrubbed here: rows may come as the store sent them)."""
        values = [scrub_text(labels.get(name, ""), NAME_CHARS) for name in self.server_labels]
        if not any(values):
            return None
        name = "/".join(values)
        if name in self.server_label_values:
            return name
        if name in self.other_shards:
            return None
        if self.shard is not None and shard_of(values, self.shard[1]) != self.shard[0]:
            self.other_shards.add(name)
            return None
        self.server_label_values[name] = dict(zip(self.server_labels, values, strict=True))
        return name

    def add(self, query: FleetQuery, rows: Iterable[tuple[Mapping[str, Any], Sequence[tuple[float, float]]]]) -> None:
        """Rows as (labels, [(unix seconds, value)]) from one query of `fleet_queries`, the labels scrubbed or
        as the store sent them (what is kept of them is scrubbed here). Each row is resolved to its server and
        slot once (both looked up, not worked out, after their first row); its points (one for an instant
        query, many for a range) then only store values. A label value that is not a string or number (a
        malformed answer) raises TypeError."""
        kind = query.kind
        added = 0
        for labels, points in rows:
            server, where = self._resolve(kind, labels)
            if where is None:
                self._skip(server)
                continue
            added += self._store(server, where, points)
        self.values_added += added

    def add_texts(self, query: FleetQuery, scanned: ScannedVector, known: KnownRows) -> int:
        """A vector answer read as texts (`advisor.sources.prometheus_store.scan_vector`: values at one
        timestamp, and each row's labels unless they were `known`'s), the same as `add` gives for it decoded.
        Where the answer's labels are byte for byte those of the query's last answer (`known`: their digest),
        each row's server and slot are taken from it, not worked out again from its labels: a fleet's labels
        rarely change between cycles. Returns the samples left out as not finite."""
        if scanned.rows is not None:
            kind = query.kind
            servers, wheres = [], []
            for row in scanned.rows:
                labels = json.loads(row[0])
                if not isinstance(labels, dict):
                    raise TypeError("metric labels are not an object")
                server, where = self._resolve(kind, labels)
                servers.append(server)
                wheres.append(where)
            known.digest, known.servers, known.wheres = scanned.digest, servers, wheres
            known.server_labels = dict(self.server_label_values)
        elif scanned.digest != known.digest:
            raise ValueError("the answer's labels are not those resolved before")
        labels_of = self.server_label_values
        known_labels = known.server_labels
        samples = self.samples
        isfinite = math.isfinite
        skipped = added = 0
        values = scanned.values
        t = float(scanned.stamp) if values else 0.0
        if not isfinite(t):
            return len(values)
        for server, where, text in zip(known.servers, known.wheres, values, strict=True):
            value = float(text)
            if not isfinite(value):
                skipped += 1
                continue
            if where is None:
                self._skip(server)
                continue
            per_time = samples.get(server)
            if per_time is None:
                per_time = samples[server] = {}
                if server not in labels_of:
                    labels_of[server] = known_labels[server]
            _place(per_time, t, value, where)
            added += 1
        self.values_added += added
        return skipped

    def _skip(self, server: Any) -> None:
        if server is _OTHER_SHARD:
            self.other_shard_rows += 1
        else:
            self.skipped_rows += 1

    def _resolve(self, kind: str, labels: Mapping[str, Any]) -> tuple[Any, Any]:
        """Where a row's values go: (server, (map index, key, bucket bound, whether rows add up, model name)),
        the second shared by every row alike; (None or `_OTHER_SHARD`, None) for a row skipped."""
        values = tuple([labels.get(name, "") for name in self.server_labels])
        server = self._server_by_values.get(values, _MISSING)
        if server is _MISSING:
            server = self._server_by_values[values] = self.server_of(labels)
        if server is None:
            return (_OTHER_SHARD if labels and self._in_other_shard(labels) else None), None
        key = (kind, labels.get("__name__", ""), labels.get("dp_rank"), labels.get("le"))
        slot = _SLOTS.get(key, _MISSING)
        if slot is _MISSING:
            slot = _slot(kind, {k: scrub_text(labels[k], NAME_CHARS) for k in _SLOT_LABELS if k in labels})
            if len(_SLOTS) >= _MAX_SLOTS:
                _SLOTS.clear()
            _SLOTS[key] = slot
        if slot is None:
            return None, None
        index, outer, inner, accumulate = slot
        model_name = labels.get("model_name") if index == _Sample.COUNTER else None
        if model_name:
            model_name = scrub_text(model_name, NAME_CHARS)
        where = (index, outer, inner, accumulate, model_name or None)
        shared = _WHERES.get(where)
        if shared is None:
            if len(_WHERES) >= _MAX_SLOTS:
                _WHERES.clear()
            shared = _WHERES[where] = where
        return server, shared

    def _store(self, server: str, where: tuple[int, Any, Any, bool, str | None],
               points: Iterable[tuple[float, float]]) -> int:
        """A resolved row's points into its server's samples; the count stored."""
        per_time = self.samples.get(server)
        if per_time is None:
            per_time = self.samples[server] = {}
        added = 0
        for t, value in points:
            if value != value:  # NaN: no sample
                continue
            _place(per_time, t, value, where)
            added += 1
        return added

    def _in_other_shard(self, labels: Mapping[str, Any]) -> bool:
        return "/".join(scrub_text(labels.get(name, ""), NAME_CHARS) for name in self.server_labels) in self.other_shards

    def servers(self) -> list[str]:
        return sorted(self.samples)

    def observations(self, server: str) -> list[tuple[float, MetricsObservation]]:
        """The server's observations in time order (timestamps where only part of the families answered
        still give one: a family absent there reads as absent, as in a direct scrape)."""
        per_time = self.samples.get(server, {})
        return [(t, observation_of(per_time[t])) for t in sorted(per_time)]

    def pop_observations(self, server: str) -> list[tuple[float, MetricsObservation]]:
        """`observations(server)`, dropping the rows (keeps a large fleet's memory to one server's worth)."""
        found = self.observations(server)
        self.samples.pop(server, None)
        return found


def _slot(kind: str, labels: Mapping[str, str]) -> tuple[int, Any, Any, bool] | None:
    """Where a row's values go in a `_Sample`: (map index, key, bucket bound or None, whether rows add up),
    or None to skip it. Reads only the family, `dp_rank` and `le` (the `_SLOTS` key)."""
    family = labels.get("__name__", "")
    if kind == "rank":
        name = RANK_FAMILIES.get(family)
        phased = name is None  # graph memory: one row per phase, summed
        name = name or PHASE_FAMILIES.get(family)
        raw = labels.get("dp_rank")
        if name is None or (raw and not raw.isdigit()):
            return None
        return _Sample.RANK, (int(raw) if raw else None, name), None, phased
    if kind == "counter":
        name = TOKENIZER_COUNTERS.get(family)
        return None if name is None else (_Sample.COUNTER, name, None, True)
    for base, name in HISTOGRAM_FAMILIES.items():
        if not family.startswith(base):
            continue
        suffix = family[len(base):]
        if suffix == "_bucket":
            try:
                return _Sample.BUCKET, name, float(labels.get("le", "")), False
            except ValueError:
                return None
        if suffix in ("_sum", "_count"):
            return (_Sample.SUM if suffix == "_sum" else _Sample.COUNT), name, None, False
    return None


def _histogram(name: str, sample: _Sample) -> Histogram | None:
    buckets = sample.maps[_Sample.BUCKET].get(name)
    if not buckets or math.inf not in buckets:
        return None
    bounds = tuple(sorted(buckets))
    shared = _BOUNDS.get(bounds)
    if shared is None:
        if len(_BOUNDS) >= 64:
            _BOUNDS.clear()
        shared = _BOUNDS[bounds] = bounds
    counts = tuple([buckets[b] for b in shared])
    previous = -math.inf
    for count in counts:
        if count < previous:
            return None
        previous = count
    total = sample.maps[_Sample.COUNT].get(name, counts[-1])
    return Histogram(upper_bounds=shared, cumulative_counts=counts, sum=sample.maps[_Sample.SUM].get(name, 0.0),
                     count=total)


_FAMILY_OF_FIELD = {v: k for k, v in {**RANK_FAMILIES, **PHASE_FAMILIES}.items()}
_FAMILY_OF_COUNTER = {v: k for k, v in TOKENIZER_COUNTERS.items()}


def observation_of(sample: _Sample) -> MetricsObservation:
    """One server at one timestamp as a `MetricsObservation` (what `parse_metrics` gives for a scrape)."""
    per_rank: dict[int | None, dict[str, float]] = {}
    families: set[str] = set()
    for (dp_rank, name), value in sample.maps[_Sample.RANK].items():
        values = per_rank.get(dp_rank)
        if values is None:
            values = per_rank[dp_rank] = {}
        values[name] = value
        families.add(_FAMILY_OF_FIELD[name])
    counters = sample.maps[_Sample.COUNTER]
    families.update(_FAMILY_OF_COUNTER[name] for name in counters)
    histograms = {}
    for family, name in HISTOGRAM_FAMILIES.items():
        histograms[name] = _histogram(name, sample)
        if histograms[name] is not None:
            families.add(family)
    return build_observation(per_rank, counters=counters, histograms=histograms, model_name=sample.model_name,
                             families_seen=families)


def server_info_from_gauges(
    observation: MetricsObservation, *, assumed_ratio: float = 0.9, serving: ServingConfig | None = None,
) -> ServerInfo | None:
    """A stand-in `/server_info` from the pool gauges, for a server the advisor cannot reach: per DP shard
    the KV pool's GiB and token capacity and the state pool's slots (used + available + evictable =
    `max_mamba_cache_size`, observables reference §4); the clamp as SGLang caps it, slots // S. No gauge
    carries the ratio, so `assumed_ratio` (SGLang's fallback 0.9 unless told) stands in for it. None when
    the gauges are missing (SGLang before 0.5.16 has no `mamba_*_tokens` / `kv_cache_memory_usage_gb`)."""
    base = serving or ServingConfig()
    shards = []
    for index, rank in enumerate(observation.ranks):
        if not (rank.state_pool_slots and rank.kv_capacity_tokens and rank.kv_cache_memory_gb):
            return None
        shards.append(ServerShard(
            dp_rank=rank.dp_rank if rank.dp_rank is not None else index,
            max_mamba_cache_size=int(rank.state_pool_slots),
            effective_max_running_requests=None,
            kv_capacity_tokens=int(rank.kv_capacity_tokens),
            kv_cache_gb=float(rank.kv_cache_memory_gb),
            weight_gb=None,
            startup_available_gb=None,
            # max_total_num_tokens is logical under DCP (managers/tp_worker.py ~574-576); the bytes hold rows
            kv_capacity_physical_tokens=int(rank.kv_capacity_tokens) // base.dcp_size,
        ))
    if not shards:
        return None
    page = observation.ranks[0].page_size
    serving_fields = {
        **base.to_dict(),
        "mamba_full_memory_ratio": assumed_ratio,
        "max_mamba_cache_size": None,
        "dp_size": max(base.dp_size, len(shards)),
    }
    if page:
        serving_fields["page_size"] = int(page)
    filled = ServingConfig(**serving_fields)
    slots = slots_per_request(filled)
    shards = [
        ServerShard(s.dp_rank, s.max_mamba_cache_size, (s.max_mamba_cache_size or 0) // slots, s.kv_capacity_tokens,
                    s.kv_cache_gb, s.weight_gb, s.startup_available_gb, s.kv_capacity_physical_tokens)
        for s in shards
    ]
    return ServerInfo(serving=filled, version=None, model_name=observation.model_name, shards=shards)


def _place(per_time: dict[float, Any], t: float, value: float, where: tuple[int, Any, Any, bool, str | None]) -> None:
    """One resolved point into its server's sample at `t` (both the range and the text-scanned instant paths)."""
    index, outer, inner, accumulate, model_name = where
    sample = per_time.get(t)
    if sample is None:
        sample = per_time[t] = _Sample()
    found = sample.maps[index]
    if inner is not None:  # a bucket: histogram -> {le: value}
        found = found.get(outer) or found.setdefault(outer, {})
        found[inner] = value
    elif accumulate:
        found[outer] = found.get(outer, 0.0) + value
    else:
        found[outer] = value
    if model_name and sample.model_name is None:
        sample.model_name = model_name


__all__ = [
    "DEFAULT_SERVER_LABELS", "HISTOGRAM_FAMILIES", "PHASE_FAMILIES", "RANK_FAMILIES", "TOKENIZER_COUNTERS",
    "HASHMOD_SEPARATOR", "FleetFrame", "FleetQuery", "fleet_queries", "observation_of", "replay_step",
    "server_info_from_gauges", "shard_of",
]

