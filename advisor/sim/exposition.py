"""Render an emulated SGLang server's `/metrics` body exactly as SGLang exposes it in Prometheus
multiprocess mode: family names, HELP texts, buckets, label sets and which scheduler rank writes what.

Pure: takes plain per-worker views and tokenizer accumulators, returns text. No clock, no socket.
Facts come from SGLang 0.5.23 `observability/metrics_collector.py` and the genuine fixtures
`fixtures/metrics/sglang-0.5.23-*.prom`; the 0.5.10 profile follows reference §1.4.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from advisor.model.serving import ServingConfig
from advisor.scheduler.types import RequestFinished, SimSnapshot

PROFILES = ("0.5.23", "0.5.10")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# `default_bucket_prompt_tokens` of 0.5.23 (metrics_collector.py:1871-1907); also the generation default.
TOKEN_BUCKETS = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000,
    12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000,
    100000, 200000, 300000, 400000, 600000, 800000, 1000000, 1100000,
)  # fmt: skip
# The older 30-value list (0.5.5 .. 0.5.10, only with --collect-tokens-histogram).
TOKEN_BUCKETS_OLD = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000,
    12000, 15000, 20000, 22000, 25000, 30000, 35000, 40000, 66000, 99000, 132000, 300000,
    600000, 900000, 1100000,
)  # fmt: skip
E2E_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400,
)  # fmt: skip
QUEUE_TIME_BUCKETS = (
    0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60,
    70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000,
    2500, 3000,
)  # fmt: skip
QUEUE_TIME_BUCKETS_OLD = (0.0, 0.1, 0.2, 0.5) + QUEUE_TIME_BUCKETS[8:]
NUM_RETRACTIONS_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 75, 100)
DP_IMBALANCE_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
DP_SYNC_WAIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
ROUTING_KEY_BOUNDS = (1, 2, 3, 5, 7, 10, 20, 50, 100, 200)
SCHEDULER_STAGES = (
    "other", "recv_requests", "process_input_requests", "get_next_batch_to_run", "process_queue",
    "run_batch", "process_batch_result", "sanity_check_cache", "idle",
)  # fmt: skip

# Share of finished requests labelled is_streaming="true" (stable per rid, like a real client mix).
STREAMING_PER_MILLE = 700

# Families SGLang creates only when first observed (multiprocess mode writes a label set on the first
# `.labels()` call); the fixtures were made without them, a live server under traffic has them.
OBSERVED_ONLY_FAMILIES = frozenset(
    {"sglang:queue_time_seconds", "sglang:num_aborted_requests", "sglang:num_retractions"}
)


class Histogram:
    """Fixed-bucket histogram accumulator: counts per bucket, sum and count; memory is flat."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # last one is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        index = len(self.bounds)
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                index = i
                break
        self.counts[index] += 1
        self.total += float(value)
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        running = 0
        out = []
        for bound, count in zip(self.bounds + (math.inf,), self.counts, strict=True):
            running += count
            out.append((floatToGoString(bound), float(running)))
        return out


def is_streaming_request(rid: str) -> bool:
    return zlib.crc32(rid.encode()) % 1000 < STREAMING_PER_MILLE


class TokenizerStats:
    """What SGLang's TokenizerMetricsCollector accumulates from finished requests."""

    def __init__(self, profile: str = "0.5.23", collect_tokens_histogram: bool = False) -> None:
        check_profile(profile)
        self.profile = profile
        old = profile == "0.5.10"
        self.has_token_histograms = collect_tokens_histogram or not old
        token_buckets = TOKEN_BUCKETS_OLD if old else TOKEN_BUCKETS
        self.by_stream: dict[str, dict[str, float]] = {}
        self.e2e: dict[str, Histogram] = {}
        self.prompt_hist = Histogram(token_buckets)
        self.uncached_prompt_hist = Histogram(token_buckets)
        self.generation_hist = Histogram(token_buckets)
        self.retractions_hist = Histogram(NUM_RETRACTIONS_BUCKETS)
        self.cached_tokens = 0
        self.aborted = 0
        self.requests = 0

    def observe(self, event: RequestFinished) -> None:
        # 0.5.10 has no is_streaming label: everything goes under one key.
        stream = "true" if is_streaming_request(event.rid) else "false"
        key = "" if self.profile == "0.5.10" else stream
        row = self.by_stream.setdefault(key, {"requests": 0, "prompt": 0, "generation": 0})
        row["requests"] += 1
        row["prompt"] += event.prompt_tokens
        row["generation"] += event.completion_tokens
        self.e2e.setdefault(key, Histogram(E2E_BUCKETS)).observe(event.e2e_latency)
        self.prompt_hist.observe(event.prompt_tokens)
        self.uncached_prompt_hist.observe(max(event.prompt_tokens - event.cached_tokens, 0))
        self.generation_hist.observe(event.completion_tokens)
        self.retractions_hist.observe(event.num_retractions)
        self.cached_tokens += event.cached_tokens
        self.requests += 1
        if event.aborted:
            self.aborted += 1


@dataclass
class WorkerView:
    """What one DP worker (one scheduler replica) shows: live counters and the last periodic gauges."""

    live: SimSnapshot  # counters are real time in SGLang (retractions, effective prefill tokens)
    gauges: SimSnapshot  # periodic gauges: the state at the last prefill/decode log tick
    last_retracted_reqs: int = 0  # `sglang:num_retracted_reqs`: latest retraction size before the last tick
    last_tick_was_decode: bool = False
    queue_time: Histogram | None = None  # observed on every TP rank of this worker


@dataclass(frozen=True)
class ServerConstants:
    """Startup constants every scheduler rank emits (emit_constants); GiB values."""

    context_len: int
    kv_cache_memory_gb: float
    weight_memory_gb: float
    startup_available_gb: float
    graph_decode_gb: float
    graph_prefill_gb: float
    draft_tokens: int = 0
    # speculative decoding (0 without): mean tokens per verify step and accepted / proposed drafts
    spec_accept_length: float = 0.0
    spec_accept_rate: float = 0.0


@dataclass(frozen=True)
class SchedulerRank:
    """One scheduler process: its labels and whether it is the stats-logging rank of its worker."""

    worker: int  # index of the DP worker (the Simulator) it belongs to
    dp_rank: int | None
    tp_rank: int
    pp_rank: int
    is_stats_rank: bool
    pid: int


@dataclass(frozen=True)
class Layout:
    """The label-relevant shape of the server."""

    model_name: str
    ranks: tuple[SchedulerRank, ...]
    engine_type: str = "unified"
    priority_scheduling: bool = False
    profile: str = "0.5.23"
    extra_labels: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def num_workers(self) -> int:
        return 1 + max(rank.worker for rank in self.ranks)


def check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"unknown version profile {profile!r}; expected one of {', '.join(PROFILES)}")


def worker_count(serving: ServingConfig) -> int:
    """How many schedulers replicas (DP workers, one pool pair each) the server runs."""
    return serving.attn_dp_size if serving.attn_dp_size > 1 else serving.dp_size


def scheduler_ranks(serving: ServingConfig, base_pid: int = 4000) -> tuple[SchedulerRank, ...]:
    """Every scheduler process of the server, in launch order.

    Plain DP: `dp_size` replicas of `tp_size` TP ranks (tp_rank restarts at 0). DP attention:
    `tp_size` ranks in total, `tp_size // attn_dp_size` per DP rank. The stats-logging rank is
    attn_tp_rank 0 (metrics_collector.py `init_new`); `dp_rank` exists only with a DP controller.
    """
    ranks = []
    pid = base_pid
    if serving.attn_dp_size > 1:
        attn_tp = max(serving.tp_size // serving.attn_dp_size, 1)
        for pp in range(serving.pp_size):
            for tp in range(serving.tp_size):
                worker = min(tp // attn_tp, serving.attn_dp_size - 1)
                ranks.append(SchedulerRank(worker, worker, tp, pp, tp % attn_tp == 0, pid))
                pid += 1
        return tuple(ranks)
    has_dp = serving.dp_size > 1
    for worker in range(serving.dp_size):
        for pp in range(serving.pp_size):
            for tp in range(serving.tp_size):
                ranks.append(SchedulerRank(worker, worker if has_dp else None, tp, pp, tp == 0, pid))
                pid += 1
    return tuple(ranks)


# ---------------------------------------------------------------------------------------------
# Family specs. Scope: "tok" tokenizer (no rank labels), "all" every scheduler rank, "stats" the
# stats-logging rank only, "pid" stats rank with the extra `pid` label (gauges with no
# multiprocess_mode fall back to "all" mode).

ValueFn = Callable[[WorkerView, ServerConstants], float]


@dataclass(frozen=True)
class _Family:
    name: str
    kind: str
    help: str
    scope: str
    value: ValueFn | None = None
    variants: tuple[tuple[tuple[str, str], ...], ...] = ((),)
    profiles: tuple[str, ...] = PROFILES


def _usage(used: int, capacity: int) -> float:
    return used / capacity if capacity > 0 else 0.0


def _full_usage(snap: SimSnapshot) -> float:
    return _usage(snap.kv_used_tokens, snap.kv_capacity_tokens)


def _mamba_usage(snap: SimSnapshot) -> float:
    return _usage(snap.mamba_used_slots, snap.max_mamba_cache_size)


def _zero(_w: WorkerView, _c: ServerConstants) -> float:
    return 0.0


NEW = ("0.5.23",)
BOTH = PROFILES
OLD = ("0.5.10",)

_ROUTING_EDGES = ("0",) + tuple(str(b) for b in ROUTING_KEY_BOUNDS) + ("+Inf",)
_ROUTING_VARIANTS = tuple((("gt", lo), ("le", hi)) for lo, hi in zip(_ROUTING_EDGES[:-1], _ROUTING_EDGES[1:], strict=True))

_SCHEDULER_FAMILIES: tuple[_Family, ...] = (
    _Family("sglang:num_retracted_reqs", "gauge", "The number of retracted requests.", "pid",
            lambda w, c: w.last_retracted_reqs),
    _Family("sglang:num_paused_reqs", "gauge", "The number of paused requests by async weight sync.", "pid", _zero),
    _Family("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.", "all",
            lambda w, c: w.live.kv_capacity_tokens, profiles=NEW),
    _Family("sglang:weight_memory_usage_gb", "gauge", "Memory used by model weights in GB.", "all",
            lambda w, c: c.weight_memory_gb, profiles=NEW),
    _Family("sglang:kv_cache_memory_usage_gb", "gauge", "Memory used by the KV cache pools in GB.", "all",
            lambda w, c: c.kv_cache_memory_gb, profiles=NEW),
    _Family("sglang:graph_memory_usage_gb", "gauge", "Memory used by captured device graphs in GB.", "all",
            None, ((("phase", "decode"),), (("phase", "prefill"),)), NEW),
    _Family("sglang:page_size", "gauge", "KV cache page size in tokens.", "all",
            lambda w, c: w.live.page_size, profiles=NEW),
    _Family("sglang:num_pages", "gauge", "Number of KV cache pages.", "all",
            lambda w, c: w.live.kv_capacity_tokens // max(w.live.page_size, 1), profiles=NEW),
    _Family("sglang:context_len", "gauge", "Maximum context length.", "all", lambda w, c: c.context_len, profiles=NEW),
    _Family("sglang:startup_available_gpu_memory_gb", "gauge", "Available GPU memory in GB at startup.", "all",
            lambda w, c: c.startup_available_gb, profiles=NEW),
    _Family("sglang:num_running_reqs", "gauge", "The number of running requests.", "stats",
            lambda w, c: w.gauges.running_requests),
    _Family("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", "stats",
            lambda w, c: w.gauges.queued_requests),
    _Family("sglang:num_grammar_queue_reqs", "gauge", "The number of requests in the grammar waiting queue.",
            "stats", _zero),
    _Family("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", "stats",
            lambda w, c: w.gauges.gen_throughput),
    _Family("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", "stats",
            lambda w, c: w.gauges.cache_hit_rate),
    _Family("sglang:decode_sum_seq_lens", "gauge", "The sum of all sequence lengths in decode.", "stats",
            lambda w, c: w.gauges.decode_sum_seq_lens),
    _Family("sglang:token_usage", "gauge", "The token usage.", "stats",
            lambda w, c: round(max(_full_usage(w.gauges), _mamba_usage(w.gauges)), 2)),
    _Family("sglang:full_token_usage", "gauge", "The token usage for full attention layers.", "stats",
            lambda w, c: _full_usage(w.gauges)),
    _Family("sglang:swa_token_usage", "gauge", "The token usage for SWA layers.", "stats", _zero),
    _Family("sglang:mamba_usage", "gauge", "The token usage for Mamba layers.", "stats",
            lambda w, c: _mamba_usage(w.gauges)),
    _Family("sglang:num_used_tokens", "gauge", "The number of used tokens.", "stats",
            lambda w, c: w.gauges.kv_used_tokens),
    _Family("sglang:kv_available_tokens", "gauge", "Number of free token slots in the KV cache pool.", "stats",
            lambda w, c: max(w.gauges.kv_capacity_tokens - w.gauges.kv_used_tokens - w.gauges.kv_evictable_tokens, 0),
            profiles=NEW),
    _Family("sglang:kv_evictable_tokens", "gauge",
            "Number of evictable (radix-cached) token slots in the KV cache pool.", "stats",
            lambda w, c: w.gauges.kv_evictable_tokens, profiles=NEW),
    _Family("sglang:kv_used_tokens", "gauge", "Number of actively used token slots in the KV cache pool.", "stats",
            lambda w, c: w.gauges.kv_used_tokens, profiles=NEW),
    _Family("sglang:swa_available_tokens", "gauge",
            "Number of free token slots in the SWA pool (hybrid-SWA only).", "stats", _zero, profiles=NEW),
    _Family("sglang:swa_evictable_tokens", "gauge",
            "Number of evictable (radix-cached) token slots in the SWA pool.", "stats", _zero, profiles=NEW),
    _Family("sglang:swa_used_tokens", "gauge", "Number of actively used token slots in the SWA pool.", "stats",
            _zero, profiles=NEW),
    _Family("sglang:mamba_available_tokens", "gauge",
            "Number of free state slots in the mamba SSM pool (hybrid-SSM only).", "stats",
            lambda w, c: max(w.gauges.max_mamba_cache_size - w.gauges.mamba_used_slots - w.gauges.mamba_evictable_slots, 0),
            profiles=NEW),
    _Family("sglang:mamba_evictable_tokens", "gauge",
            "Number of evictable (radix-cached) state slots in the mamba SSM pool.", "stats",
            lambda w, c: w.gauges.mamba_evictable_slots, profiles=NEW),
    _Family("sglang:mamba_used_tokens", "gauge", "Number of actively used state slots in the mamba SSM pool.",
            "stats", lambda w, c: w.gauges.mamba_used_slots, profiles=NEW),
    _Family("sglang:spec_accept_length", "gauge",
            "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
            "stats", lambda w, c: c.spec_accept_length, profiles=NEW),
    _Family("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
            "stats", lambda w, c: c.spec_accept_length, profiles=OLD),
    _Family("sglang:spec_accept_rate", "gauge",
            "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).", "stats",
            lambda w, c: c.spec_accept_rate, profiles=NEW),
    _Family("sglang:spec_accept_rate", "gauge",
            "The average acceptance rate of speculative decoding (`accepted tokens / total draft tokens` in batch).",
            "stats", lambda w, c: c.spec_accept_rate, profiles=OLD),
    _Family("sglang:spec_cap_length", "gauge",
            "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot (0 when no cap is scheduled).",
            "stats", _zero, profiles=NEW),
    _Family("sglang:spec_block_accept_length", "gauge",
            "Mean uncapped full-block accept length per verify step (accept + cap-trimmed drafts; exact only in DSpark cap-accept mode).",
            "stats", _zero, profiles=NEW),
    _Family("sglang:spec_num_steps", "gauge", "Currently active speculative_num_steps.", "stats",
            lambda w, c: max(c.draft_tokens - 1, 0), profiles=NEW),
    _Family("sglang:spec_num_draft_tokens", "gauge",
            "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).", "stats",
            lambda w, c: c.draft_tokens, profiles=NEW),
    _Family("sglang:num_prefill_bootstrap_queue_reqs", "gauge",
            "The number of requests in the prefill bootstrap queue.", "stats", _zero, profiles=NEW),
    _Family("sglang:num_prefill_inflight_queue_reqs", "gauge", "The number of requests in the prefill inflight queue.",
            "stats", _zero),
    _Family("sglang:num_decode_prealloc_queue_reqs", "gauge", "The number of requests in the decode prealloc queue.",
            "stats", _zero),
    _Family("sglang:num_decode_transfer_queue_reqs", "gauge", "The number of requests in the decode transfer queue.",
            "stats", _zero),
    _Family("sglang:num_decode_host_receive_queue_reqs", "gauge",
            "Requests in the decode transfer queue receiving into host memory or waiting for device admission.",
            "stats", _zero, profiles=NEW),
    _Family("sglang:num_decode_deferred_kv_release_reqs", "gauge",
            "The number of failed decode requests whose KV allocations are held pending transfer drain acknowledgement or timeout.",
            "stats", _zero, profiles=NEW),
    _Family("sglang:pending_prealloc_token_usage", "gauge",
            "The token usage for pending preallocated tokens (not preallocated yet).", "stats", _zero),
    _Family("sglang:prealloc_full_token_usage", "gauge",
            "Share of the full-attention KV pool held by decode requests whose KV transfer is pending (preallocated, not yet running); same capacity basis as sglang:full_token_usage.",
            "stats", _zero, profiles=NEW),
    _Family("sglang:prealloc_swa_token_usage", "gauge",
            "Share of the SWA KV pool held by decode requests whose KV transfer is pending; same capacity basis as sglang:swa_token_usage.",
            "stats", _zero, profiles=NEW),
    _Family("sglang:utilization", "gauge", "The utilization.", "stats", _zero),
    _Family("sglang:fwd_occupancy", "gauge", "Forward pass GPU occupancy percentage.", "stats",
            lambda w, c: math.nan, profiles=NEW),
    _Family("sglang:new_token_ratio", "gauge", "The new token ratio.", "stats",
            lambda w, c: w.gauges.new_token_ratio),
    _Family("sglang:is_cuda_graph", "gauge", "Whether the batch is using CUDA graph.", "stats",
            lambda w, c: 1.0 if w.last_tick_was_decode else 0.0),
    _Family("sglang:num_unique_running_routing_keys", "gauge", "Number of unique routing keys in running batch.",
            "stats", _zero),
    _Family("sglang:routing_key_running_req_count", "gauge",
            "Distribution of routing keys by running request count (gt < count <= le).", "stats", _zero,
            _ROUTING_VARIANTS),
    _Family("sglang:routing_key_all_req_count", "gauge",
            "Distribution of routing keys by running+waiting request count (gt < count <= le).", "stats", _zero,
            _ROUTING_VARIANTS),
    # 0.5.10 wrote max_total_num_tokens from log_stats (stats rank), 0.5.23 from emit_constants (every rank).
    _Family("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.", "stats",
            lambda w, c: w.live.kv_capacity_tokens, profiles=OLD),
    _Family("sglang:realtime_tokens", "counter",
            "Total number of tokens processed (updated on each log interval). mode: prefill_compute, prefill_cache, decode.",
            "stats", None,
            ((("mode", "prefill_compute"),), (("mode", "prefill_cache"),), (("mode", "decode"),)), OLD),
    _Family("sglang:prefill_effective_tokens", "counter",
            "Effective prefill tokens with retracted-request re-counts excluded, updated on each log interval. mode: device_hit, host_hit, storage_hit, input. Windowed prefix cache hit rate = rate(sum of *_hit) / rate(sum of all modes); per-tier rate uses a single *_hit mode in the numerator.",
            "all", None,
            ((("mode", "input"),), (("mode", "device_hit"),), (("mode", "host_hit"),), (("mode", "storage_hit"),)),
            NEW),
    _Family("sglang:scheduler_idle_seconds", "counter",
            "Total wall time while the scheduler has no runnable or queued work.", "all", _zero, profiles=NEW),
    _Family("sglang:scheduler_process_cpu_seconds", "counter",
            "Total CPU time consumed by the scheduler process across all threads.", "all", _zero, profiles=NEW),
    _Family("sglang:scheduler_stage_seconds", "counter",
            "Total scheduler-loop wall time exclusively attributed to each stage. forward_overlap (full, partial, none): full=both endpoints active, partial=one, none=no observed overlap (including unavailable timing). Not exact overlapped/exposed seconds.",
            "all", _zero, tuple((("category", s), ("forward_overlap", "none")) for s in SCHEDULER_STAGES), NEW),
    _Family("sglang:dp_attention_tokens", "counter",
            "Tokens of MLP-sync steps on this DP rank. kind=scheduled: tokens this rank ran; kind=imbalance: tokens the busiest rank ran beyond this rank, i.e. capacity lost to DP imbalance on this rank. On speculative-decode steps the unit is batch rows (requests).",
            "all", _zero, ((("kind", "scheduled"),), (("kind", "imbalance"),)), NEW),
    _Family("sglang:dp_attention_steps", "counter",
            "MLP-sync steps on this DP rank. rank_state=idle: this rank had no tokens and only ran to keep the DP collectives in lockstep.",
            "all", _zero, ((("rank_state", "active"),), (("rank_state", "idle"),)), NEW),
    _Family("sglang:dp_attention_pairs", "counter",
            "Causal (query, key) pairs attended by MLP-sync steps on this DP rank, pricing every layer as full attention: a decode row reads its sequence, a prefill chunk its prefix plus the pairs within the chunk. kind=scheduled: this rank; kind=imbalance: the busiest rank's excess over this rank. The context-length counterpart of sglang:dp_attention_tokens_total; like it, speculative-decode steps count one query per row. Sliding-window layers execute fewer pairs than counted, so on hybrid-SWA models long rows are overstated.",
            "all", _zero, ((("kind", "scheduled"),), (("kind", "imbalance"),)), NEW),
    _Family("sglang:num_retracted_requests", "counter", "Total number of retracted requests.", "all",
            lambda w, c: w.live.retracted_requests_total),
    _Family("sglang:num_retracted_input_tokens", "counter", "Total number of retracted input tokens.", "all",
            lambda w, c: w.live.retracted_input_tokens_total),
    _Family("sglang:num_retracted_output_tokens", "counter", "Total number of retracted output tokens.", "all",
            lambda w, c: w.live.retracted_output_tokens_total),
    _Family("sglang:dp_attention_token_imbalance_ratio", "histogram",
            "Per MLP-sync step, max tokens over mean tokens across the DP ranks (1.0 = balanced, num_dp_ranks = one busy rank). Reported once per engine, by the scheduler of DP rank 0.",
            "all", None, profiles=NEW),
    _Family("sglang:dp_attention_sync_wait_seconds", "histogram",
            "Wall time of this DP rank's scheduler MLP-sync all-gather per step. On the gloo path (the default with overlap scheduling) this is waiting for the slowest rank; on the device-group paths it also includes the gather's stream sync.",
            "all", None, profiles=NEW),
    _Family("sglang:queue_time_seconds", "histogram", "Histogram of queueing time in seconds.", "all", None),
)  # fmt: skip

_EMPTY_HISTOGRAMS = {
    "sglang:dp_attention_token_imbalance_ratio": DP_IMBALANCE_BUCKETS,
    "sglang:dp_attention_sync_wait_seconds": DP_SYNC_WAIT_BUCKETS,
}


def _graph_gb(variant: dict[str, str], consts: ServerConstants) -> float:
    return consts.graph_decode_gb if variant.get("phase") == "decode" else consts.graph_prefill_gb


def _scheduler_counter_by_mode(view: WorkerView, mode: str) -> float:
    live = view.live
    return float(
        {
            "input": live.prefill_compute_tokens_total,
            "device_hit": live.cached_tokens_total,
            "prefill_compute": live.prefill_compute_tokens_total,
            "prefill_cache": live.cached_tokens_total,
            "decode": live.decode_tokens_total,
        }.get(mode, 0)
    )


def _sorted(labels: dict[str, str]) -> dict[str, str]:
    # Multiprocess mode keys each sample by its JSON-sorted label dict: labels come out sorted.
    return dict(sorted(labels.items()))


def _histogram_samples(
    metric: Metric, name: str, labels: dict[str, str], hist: Histogram | None, bounds: Sequence[float]
) -> None:
    if hist is None:
        hist = Histogram(bounds)
    metric.add_sample(name + "_sum", _sorted(labels), hist.total)
    for le, count in hist.cumulative():
        metric.add_sample(name + "_bucket", _sorted({**labels, "le": le}), count)
    metric.add_sample(name + "_count", _sorted(labels), float(hist.count))


def _scheduler_labels(layout: Layout, rank: SchedulerRank) -> dict[str, str]:
    labels = {
        "model_name": layout.model_name,
        "engine_type": layout.engine_type,
        "tp_rank": str(rank.tp_rank),
        "pp_rank": str(rank.pp_rank),
        "moe_ep_rank": "0",
    }
    if layout.priority_scheduling:
        labels["priority"] = ""
    if rank.dp_rank is not None:
        labels["dp_rank"] = str(rank.dp_rank)
    labels.update(dict(layout.extra_labels))
    return labels


def tokenizer_labels(layout: Layout) -> dict[str, str]:
    labels = {"model_name": layout.model_name}
    if layout.profile != "0.5.10":
        labels["engine_type"] = layout.engine_type
    if layout.priority_scheduling:
        labels["priority"] = ""
    labels.update(dict(layout.extra_labels))
    return labels


def _scheduler_metrics(layout: Layout, workers: Sequence[WorkerView], consts: ServerConstants) -> list[Metric]:
    out = []
    for fam in _SCHEDULER_FAMILIES:
        if layout.profile not in fam.profiles:
            continue
        if fam.name == "sglang:queue_time_seconds" and not any(
            w.queue_time is not None and w.queue_time.count > 0 for w in workers
        ):
            continue
        metric = Metric(fam.name, fam.help, fam.kind)
        for rank in layout.ranks:
            if fam.scope in ("stats", "pid") and not rank.is_stats_rank:
                continue
            view = workers[rank.worker]
            base = _scheduler_labels(layout, rank)
            if fam.scope == "pid":
                base["pid"] = str(rank.pid)
            if fam.kind == "histogram":
                if fam.name == "sglang:queue_time_seconds":
                    bounds = QUEUE_TIME_BUCKETS if layout.profile == "0.5.23" else QUEUE_TIME_BUCKETS_OLD
                    _histogram_samples(metric, fam.name, base, view.queue_time, bounds)
                else:
                    _histogram_samples(metric, fam.name, base, None, _EMPTY_HISTOGRAMS[fam.name])
                continue
            sample_name = fam.name + ("_total" if fam.kind == "counter" else "")
            for variant in fam.variants:
                extra = dict(variant)
                if fam.value is not None:
                    value = float(fam.value(view, consts))
                elif "phase" in extra:
                    value = _graph_gb(extra, consts)
                else:
                    value = _scheduler_counter_by_mode(view, extra.get("mode", ""))
                metric.add_sample(sample_name, _sorted({**base, **extra}), value)
        out.append(metric)
    return out


def _tokenizer_metrics(layout: Layout, stats: TokenizerStats) -> list[Metric]:
    if stats.requests == 0:
        return []  # every tokenizer family is created on the first finished request
    base = tokenizer_labels(layout)
    new = layout.profile == "0.5.23"
    out = []

    def stream_labels(key: str) -> dict[str, str]:
        return {**base, "is_streaming": key} if key else dict(base)

    def counter(name: str, help_text: str, field_name: str) -> Metric:
        metric = Metric(name, help_text, "counter")
        for key, row in sorted(stats.by_stream.items(), reverse=True):
            metric.add_sample(name + "_total", _sorted(stream_labels(key)), float(row[field_name]))
        return metric

    e2e = Metric("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", "histogram")
    for key, hist in sorted(stats.e2e.items(), reverse=True):  # "true" before "false", as in the fixtures
        _histogram_samples(e2e, e2e.name, stream_labels(key), hist, E2E_BUCKETS)
    out.append(e2e)
    if stats.has_token_histograms:
        token_hists = [
            ("sglang:prompt_tokens_histogram", "Histogram of prompt token length.", stats.prompt_hist),
            ("sglang:uncached_prompt_tokens_histogram", "Histogram of uncached (compute) prompt token length.",
             stats.uncached_prompt_hist),
            ("sglang:generation_tokens_histogram", "Histogram of generation token length.", stats.generation_hist),
        ]  # fmt: skip
        for name, help_text, hist in token_hists:
            if name == "sglang:uncached_prompt_tokens_histogram" and not new:
                continue
            metric = Metric(name, help_text, "histogram")
            _histogram_samples(metric, name, base, hist, hist.bounds)
            out.append(metric)
    out.append(counter("sglang:prompt_tokens", "Number of prefill tokens processed.", "prompt"))
    out.append(counter("sglang:generation_tokens", "Number of generation tokens processed.", "generation"))
    if stats.cached_tokens > 0:
        if new:
            cached = Metric("sglang:cached_tokens", "Number of cached prompt tokens by source (device/host/storage).", "counter")
            cached.add_sample("sglang:cached_tokens_total", _sorted({**base, "cache_source": "total"}), float(stats.cached_tokens))
        else:
            cached = Metric("sglang:cached_tokens", "Number of cached prompt tokens.", "counter")
            cached.add_sample("sglang:cached_tokens_total", _sorted(base), float(stats.cached_tokens))
        out.append(cached)
    out.append(counter("sglang:num_requests", "Number of requests processed.", "requests"))
    if stats.aborted > 0:
        aborted = Metric("sglang:num_aborted_requests", "Number of requests aborted.", "counter")
        aborted.add_sample("sglang:num_aborted_requests_total", _sorted(base), float(stats.aborted))
        out.append(aborted)
    if not new:
        retractions = Metric("sglang:num_retractions", "Histogram of retraction counts per request.", "histogram")
        _histogram_samples(retractions, retractions.name, base, stats.retractions_hist, NUM_RETRACTIONS_BUCKETS)
        out.append(retractions)
    return out


class _StaticCollector:
    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> list[Metric]:
        return self._metrics


def render_metrics(
    layout: Layout,
    workers: Sequence[WorkerView],
    tokenizer: TokenizerStats,
    consts: ServerConstants,
) -> str:
    """The whole `/metrics` body (text format 0.0.4), tokenizer families first as SGLang's merge does."""
    check_profile(layout.profile)
    if len(workers) != layout.num_workers:
        raise ValueError(f"layout has {layout.num_workers} DP workers but {len(workers)} views were given")
    # The order SGLang's multiprocess merge produced in the fixtures: tokenizer histograms, scheduler
    # gauges and counters, tokenizer counters, scheduler histograms.
    tokenizer_metrics = _tokenizer_metrics(layout, tokenizer)
    scheduler_metrics = _scheduler_metrics(layout, workers, consts)
    metrics = (
        [m for m in tokenizer_metrics if m.type == "histogram"]
        + [m for m in scheduler_metrics if m.type != "histogram"]
        + [m for m in tokenizer_metrics if m.type != "histogram"]
        + [m for m in scheduler_metrics if m.type == "histogram"]
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StaticCollector(metrics))  # type: ignore[arg-type]
    return generate_latest(registry).decode("utf-8")
