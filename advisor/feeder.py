"""The feeder: turns what the sources returned (a metrics observation and its deltas, /server_info, a boot
log) into the inputs of the pure rooms (the estimator's ScrapeSample, the recommender's ServerModel).
Pure: plain dataclasses in, plain dataclasses out. The daemon and `inspect` both go through it."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from advisor.errors import InputError
from advisor.estimate.deltas import ObservationDelta
from advisor.estimate.steptime import StepSample
from advisor.estimate.traffic import ExactRequest, TrafficEstimator
from advisor.estimate.workload import ScrapeSample
from advisor.model.advice import MemoryFacts
from advisor.model.inversion import StagePools, invert_pools
from advisor.model.memory import free_memory_from_gauges
from advisor.model.pools import GIB, ByteConstants
from advisor.model.serving import ServingConfig
from advisor.recommend.engine import ServerModel
from advisor.scheduler.costmodel import CostModel
from advisor.scheduler.server import SchedulerServerConfig
from advisor.sources.bootlog import BootInfo
from advisor.sources.loglines import DecodeInterval, RequestRecord
from advisor.sources.metrics import MetricsObservation
from advisor.sources.server_info import ServerInfo

# SGLang's default context length for the hybrid models we advise on, used only when the server has not said.
DEFAULT_MODEL_CONTEXT_LEN = 262144


@dataclass(frozen=True)
class ByteOverrides:
    """Operator-given constants (the daemon config's per-target keys); each wins over what was observed."""

    state_bytes_per_slot: float | None = None
    kv_bytes_per_token: float | None = None
    rest_gib: float | None = None


def constants_from_server_info(
    info: ServerInfo, *, draft_kv_fraction: float | None = None, ring_bytes_per_request: float | None = None,
) -> tuple[ByteConstants, float] | None:
    """Invert SGLang's split from /server_info (`advisor.model.inversion`): the KV bytes and token count give
    bytes per token; the ratio, max_mamba_cache_size and the KV pool give the slot size by the same joint
    solve the pool model uses (draft states reserved under EAGLE/MTP, rings under ReplaySSM; ratio-based pools
    only). /server_info does not carry the draft model's KV pool: `draft_kv_fraction` (draft / target KV per
    token, from the model config) puts it back; without it counts and token_equiv stay right and the bytes are
    low by that fraction. Returns the constants and the bytes both pools share, or None when the body cannot
    give them."""
    serving = info.serving
    if serving.max_mamba_cache_size is not None or not info.shards:
        return None
    shard = info.shards[0]
    # Under DCP /server_info's token_capacity is logical (physical rows x dcp); the bytes hold physical rows.
    physical_tokens = shard.kv_capacity_physical_tokens or shard.kv_capacity_tokens
    if not (shard.kv_cache_gb and physical_tokens and shard.max_mamba_cache_size):
        return None
    stage = StagePools(
        max_mamba_cache_size=shard.max_mamba_cache_size, kv_tokens=physical_tokens, kv_pool_bytes=shard.kv_cache_gb * GIB,
    )
    inverted = invert_pools([stage], serving, draft_kv_fraction=draft_kv_fraction,
                            ring_bytes_per_request=ring_bytes_per_request)
    if inverted.constants is None or inverted.rest_bytes is None:
        return None
    return inverted.constants, inverted.rest_bytes


def observed_clamp(server_info: ServerInfo | None, boot: BootInfo | None, dp_ranks: int) -> float | None:
    """The server's own concurrency clamp summed over DP workers: /server_info's per-shard caps when every
    shard reports one, else the boot log's per-worker clamp times the DP ranks seen in /metrics."""
    if server_info is not None and server_info.shards:
        caps = [shard.effective_max_running_requests for shard in server_info.shards]
        if all(cap is not None for cap in caps):
            return float(sum(cap for cap in caps if cap is not None))
    if boot is not None and boot.max_running_requests is not None:
        return float(boot.max_running_requests * max(1, dp_ranks))
    return None


def scrape_sample(
    observation: MetricsObservation,
    delta: ObservationDelta,
    *,
    clamp: float | None,
    log_retractions: int,
    baseline: bool,
) -> ScrapeSample:
    """One scrape as the estimator sees it: gauges summed over DP ranks, counters as deltas since the last
    scrape. `baseline` marks a scrape whose counters were seen before (first after start or restore): its
    retractions are not new. Retractions come from /metrics when SGLang exports them, else from the logs."""

    def total(name: str) -> float | None:
        values = [getattr(rank, name) for rank in observation.ranks if getattr(rank, name) is not None]
        return float(sum(values)) if values else None

    retracted = delta.retracted_requests
    retracted_tokens = 0.0
    for rank in delta.ranks:
        retracted_tokens += (rank.retracted_input_tokens or 0.0) + (rank.retracted_output_tokens or 0.0)
    if retracted is None:
        retracted = float(log_retractions)
    return ScrapeSample(
        running_requests=total("running_requests") or 0.0,
        queued_requests=total("queued_requests") or 0.0,
        max_running_requests=clamp,
        decode_sum_seq_lens=total("decode_sum_seq_lens"),
        kv_used_tokens=total("kv_used_tokens"),
        kv_capacity_tokens=total("kv_capacity_tokens"),
        state_slots_used=total("state_slots_used"),
        state_pool_slots=total("state_pool_slots"),
        retracted_requests=0.0 if baseline else retracted,
        retracted_tokens=0.0 if baseline else retracted_tokens,
    )


def serving_config_of(server_info: ServerInfo | None, boot: BootInfo | None) -> ServingConfig:
    """The live serving config: /server_info's, else the boot log's `server_args` (SGLang's defaults where
    it is silent), else SGLang's defaults. Raises InputError naming the field when the boot log's args are bad."""
    if server_info is not None:
        return server_info.serving
    if boot is not None and boot.effective_server_args:
        # what the log implies where server_args is silent (TP from the ranks, the release's `auto`, the model
        # class, the S its capped warning names)
        return boot.serving_config()
    return ServingConfig()


class ServerInfoConstants:
    """`constants_from_server_info` of the last /server_info asked, kept while the same (frozen) answer is
    asked again: a server's answer stands for many cycles, and the inversion costs more than the rest of its
    model."""

    def __init__(self) -> None:
        self.info: ServerInfo | None = None
        self.found: tuple[ByteConstants, float] | None = None

    def __call__(self, info: ServerInfo) -> tuple[ByteConstants, float] | None:
        if info is not self.info:
            self.info, self.found = info, constants_from_server_info(info)
        return self.found


def server_model(
    serving: ServingConfig,
    server_info: ServerInfo | None,
    boot: BootInfo | None,
    metrics: MetricsObservation | None,
    overrides: ByteOverrides = ByteOverrides(),
    constants_of: Callable[[ServerInfo], tuple[ByteConstants, float] | None] = constants_from_server_info,
) -> ServerModel:
    """What is known of one server's pools, given its serving config (`serving_config_of`). Byte constants,
    in order of trust: the operator's, the boot log's (exact), inverted from /server_info (by `constants_of`,
    a `ServerInfoConstants` to reuse it). The clamp comes from /server_info's shards, else the boot log."""
    constants: ByteConstants | None = None
    rest: float | None = None
    if overrides.state_bytes_per_slot and overrides.kv_bytes_per_token:
        constants = ByteConstants(overrides.state_bytes_per_slot, overrides.kv_bytes_per_token)
    if constants is None and boot is not None:
        try:
            pools = boot.pools()  # inverted with the config the boot ran with
        except InputError:  # server_args SGLang would refuse: the caller's config is all there is
            pools = boot.pools(serving)
        constants, rest = pools.constants, pools.rest_bytes
    if constants is None and server_info is not None:
        # no boot log, or one whose state line rounds to 0.00 GB (a tiny model): invert /server_info instead
        inverted = constants_of(server_info)
        if inverted is not None:
            constants, rest = inverted
    if overrides.rest_gib:
        rest = overrides.rest_gib * GIB
    clamp = cache = kv_tokens = None
    if server_info is not None and server_info.shards:
        shard = server_info.shards[0]
        clamp, cache = shard.effective_max_running_requests, shard.max_mamba_cache_size
        kv_tokens = shard.kv_capacity_physical_tokens or shard.kv_capacity_tokens
    if boot is not None:
        clamp = clamp or boot.max_running_requests
    memory = memory_facts(serving, boot, metrics, rest)
    context_len = DEFAULT_MODEL_CONTEXT_LEN
    if metrics is not None and metrics.ranks and metrics.ranks[0].context_len:
        context_len = int(metrics.ranks[0].context_len)
    return ServerModel(
        serving=serving, constants=constants, rest_bytes=rest, observed_max_running_requests=clamp,
        observed_max_mamba_cache_size=cache, kv_capacity_tokens=kv_tokens,
        model_context_len=context_len, memory=memory,
    )


def memory_facts(
    serving: ServingConfig, boot: BootInfo | None, metrics: MetricsObservation | None, rest_bytes: float | None
) -> MemoryFacts:
    """Memory outside the two pools, for the free lever: the boot log's lines when one is followed, else
    SGLang's start-up gauges (weights, graphs, idle memory after both; the memory SGLang sized from is
    rebuilt as idle + graphs + pools + weights, see `advisor.model.memory`)."""
    if boot is not None:
        return MemoryFacts(
            card_available_gib=boot.avail_before_weights_gib,
            idle_after_pools_gib=boot.memory_pool_end_avail_gib,
            idle_after_graphs_gib=boot.available_gpu_mem_gib,
            mem_fraction_static=serving.mem_fraction_static,
        )
    rank = metrics.ranks[0] if metrics is not None and metrics.ranks else None
    unknown = MemoryFacts(mem_fraction_static=serving.mem_fraction_static)
    if (
        rank is None or rest_bytes is None or serving.mem_fraction_static is None
        or rank.startup_available_memory_gb is None or rank.weight_memory_gb is None or rank.graph_memory_gb is None
    ):
        return unknown
    try:
        gauges = free_memory_from_gauges(
            startup_available_gib=rank.startup_available_memory_gb, weight_gib=rank.weight_memory_gb,
            graph_gib=rank.graph_memory_gb, mem_fraction_static=serving.mem_fraction_static, pool_bytes=rest_bytes,
        )
    except InputError:
        return unknown  # a gauge out of range says nothing usable about idle memory
    return MemoryFacts(
        card_available_gib=gauges.card_available_gib,
        idle_after_graphs_gib=gauges.idle_gib,
        mem_fraction_static=serving.mem_fraction_static,
    )


def model_name_of(server_info: ServerInfo | None, metrics: MetricsObservation | None) -> str:
    """SGLang's `model_name`: /server_info's served name, else the label on /metrics."""
    if server_info is not None and server_info.model_name:
        return server_info.model_name
    if metrics is not None and metrics.model_name:
        return metrics.model_name
    return ""


# SGLang prints a decode line every `--decode-log-interval` decode steps (server_args default 40).
DEFAULT_DECODE_LOG_INTERVAL = 40


def step_samples_from_log(intervals: Iterable[DecodeInterval], steps: int = DEFAULT_DECODE_LOG_INTERVAL) -> list[StepSample]:
    """Decode lines (with the prefills between them) as step-time samples. An interval in which the server sat
    idle (a prefill from an empty batch) is left out: SGLang's `gen throughput` divides by the wall time since
    the previous decode line, idle time included, which would read as slow steps."""
    out = []
    for interval in intervals:
        line = interval.line
        if line.gen_throughput is None or line.running_requests <= 0 or interval.idle_before:
            continue
        batch, kv_tokens = float(line.running_requests), float(line.kv_used_tokens or 0)
        if interval.previous_running is not None:
            batch = (batch + interval.previous_running) / 2.0
        if interval.previous_kv_tokens is not None and line.kv_used_tokens is not None:
            kv_tokens = (kv_tokens + interval.previous_kv_tokens) / 2.0
        out.append(StepSample(
            batch=batch, kv_tokens=kv_tokens,
            gen_throughput=float(line.gen_throughput), steps=float(steps),
            prefill_batches=float(interval.prefill_batches), prefill_tokens=float(interval.prefill_tokens),
            accept_length=float(line.accept_length or 1.0),
        ))
    return out


def step_samples_from_metrics(observation: MetricsObservation, delta: ObservationDelta,
                              previous: MetricsObservation | None,
                              steps: int = DEFAULT_DECODE_LOG_INTERVAL) -> list[StepSample]:
    """The running / KV / gen-throughput gauges of each DP rank as step-time samples. SGLang's gen throughput
    divides the tokens decoded by the wall time since the previous decode line, prefill batches run between them
    included; without the prefill lines, the scrape interval stands for what ran per decode step: a rank admitted
    its share of the requests that finished plus its running batch's growth since the `previous` scrape, each
    with the interval's mean prompt less the cached tokens, over the decode steps its share of the generated
    tokens took at its batch (never over the step time the gauge implies: a feature made of the measured time
    would fit the time itself). A scrape with no interval behind it (the first, a restart) gives no sample: its
    prefills are unknown and would read as decode time. Where the counters are not shown, a sample has no
    prefill features and its step time holds the prefills."""
    if previous is None or delta.since_start or delta.restarted or not delta.interval_seconds:
        return []
    ranks = len(observation.ranks)
    finished, generated = delta.requests or 0.0, delta.generation_tokens or 0.0
    per_request = None  # prefill tokens an admission brings
    if finished > 0 and generated > 0 and delta.prompt_tokens is not None:
        per_request = max(0.0, delta.prompt_tokens - (delta.cached_tokens or 0.0)) / finished
    before = {rank.dp_rank: rank.running_requests for rank in previous.ranks}
    out = []
    for rank in observation.ranks:
        if not rank.gen_throughput or not rank.running_requests:
            continue
        accept = float(rank.spec_accept_length or 1.0)
        prefill_batches = prefill_tokens = 0.0
        was = before.get(rank.dp_rank)
        if per_request is not None and was is not None:
            admitted = max(0.0, finished / ranks + rank.running_requests - was)
            decode_steps = generated / ranks / (rank.running_requests * accept)
            prefill_batches = admitted / decode_steps * steps
            prefill_tokens = prefill_batches * per_request
        out.append(StepSample(batch=float(rank.running_requests), kv_tokens=float(rank.kv_used_tokens or 0),
                              gen_throughput=float(rank.gen_throughput), steps=float(steps),
                              prefill_batches=prefill_batches, prefill_tokens=prefill_tokens, accept_length=accept,
                              prefill_read=False))
    return out


_STOPPED = {"stop": True, "length": False}  # a finish reason's type: stopped on its own, or at its cap


def exact_requests(records: Iterable[RequestRecord], time_scale: float = 1.0) -> list[ExactRequest]:
    """Finished requests with a time and an e2e latency, as arrivals on the server's clock (log stamps are wall
    time; `time_scale` > 1 only for an emulated server running faster than the wall clock), with the client's
    max_new_tokens where the log shows it (admission reserves up to it, clipped, for each running request)."""
    out = []
    for record in records:
        if record.time is None or record.e2e_latency is None:
            continue
        finish = record.time * time_scale
        out.append(ExactRequest(arrival=finish - record.e2e_latency, input_tokens=record.prompt_tokens,
                                output_tokens=record.completion_tokens, max_new_tokens=record.max_new_tokens,
                                finish=finish, cached_tokens=record.cached_tokens,
                                stopped=_STOPPED.get(record.finish_reason or "")))
    return out


def observe_traffic_interval(traffic: TrafficEstimator, now: float, delta: ObservationDelta,
                             sample: ScrapeSample, *, baseline_only: bool = False) -> None:
    """One scrape interval into the traffic picture: finished requests (the prompt histogram's count delta, else
    the request counter's), running + queued, and the interval's token and queue-time histograms. A scrape whose
    deltas are lifetime totals (the server's first, a restart, or `baseline_only`: the first after the daemon's checkpoint
    restore, whose totals were seen before) only sets the baseline count of requests in flight and its time."""
    in_system = sample.running_requests + sample.queued_requests
    if baseline_only or delta.since_start or delta.restarted:
        # the server process's lifetime count dates when it began serving (not after the daemon's own restore)
        traffic.baseline(in_system, sample.queued_requests, now,
                         lifetime_requests=None if baseline_only else delta.requests)
        return
    seconds = delta.interval_seconds
    prompt, generation = delta.prompt_tokens_histogram, delta.generation_tokens_histogram
    queue = delta.queue_time_histogram
    finished = prompt.count if prompt is not None else delta.requests
    if seconds is None or finished is None:
        return
    traffic.observe_interval(
        now, seconds, finished=finished, in_system=in_system,
        prompt_bounds=prompt.upper_bounds if prompt else (), prompt_counts=prompt.bucket_counts() if prompt else (),
        prompt_sum=prompt.sum if prompt else 0.0,
        generation_bounds=generation.upper_bounds if generation else (),
        generation_counts=generation.bucket_counts() if generation else (),
        generation_sum=generation.sum if generation else 0.0, queued=sample.queued_requests,
        live_seq_tokens=sample.decode_sum_seq_lens, live_running=sample.running_requests,
        queue_bounds=queue.upper_bounds if queue else (), queue_counts=queue.bucket_counts() if queue else (),
    )


def chunked_prefill_size_of(info: ServerInfo | None, boot: BootInfo | None) -> int | None:
    """Where the server cuts a long prompt (0: chunking off), as /server_info (the live server's) or else the
    boot log shows it; None when neither does."""
    if info is not None and info.chunked_prefill_size is not None:
        return info.chunked_prefill_size
    return boot.chunked_prefill_size if boot is not None else None


def decode_log_interval_of(info: ServerInfo | None, boot: BootInfo | None) -> int:
    """Decode steps between two `Decode batch` lines: --decode-log-interval as /server_info or the boot log's
    server args show it, else SGLang's default."""
    if info is not None and info.decode_log_interval:
        return info.decode_log_interval
    value = boot.server_args.get("decode_log_interval") if boot is not None else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return DEFAULT_DECODE_LOG_INTERVAL


def scheduler_server(model: ServerModel, boot: BootInfo | None, cost: CostModel,
                     info: ServerInfo | None = None) -> SchedulerServerConfig | None:
    """The scheduler model's view of this server (per DP worker), when its pools are known. Its admission knobs
    come from /server_info (the live server's), else the boot log's server args, else SGLang's defaults: an
    advisor that attached after the boot has no boot block to read them from."""
    if model.constants is None or model.rest_bytes is None:
        return None
    args = boot.server_args if boot is not None else {}
    shown = chunked_prefill_size_of(info, boot)
    # --chunked-prefill-size -1 turns chunking off: a prompt is prefilled whole, as one chunk of the context
    chunk = 8192 if shown is None else shown if shown > 0 else model.model_context_len
    max_prefill = (info.max_prefill_tokens if info is not None else None) or _positive_number(
        args.get("max_prefill_tokens"))
    conservativeness = (info.schedule_conservativeness if info is not None else None) or _positive_number(
        args.get("schedule_conservativeness"))
    # The radix cache is on unless the server says --disable-radix-cache (the serving config carries that):
    # the replay then re-decides, at each candidate ratio, which conversation prefixes stay cached.
    return SchedulerServerConfig(
        serving=model.serving, constants=model.constants, rest_bytes=model.rest_bytes,
        model_context_len=model.model_context_len, chunked_prefill_size=chunk,
        max_prefill_tokens=int(max_prefill) if max_prefill else max(16384, chunk),
        schedule_conservativeness=conservativeness or 1.0, enable_radix_prefix_reuse=True, cost=cost,
    )


def _positive_number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value > 0 and math.isfinite(value) else None
