"""The scheduler model: a discrete-event model of one SGLang 0.5.23 scheduler (one DP worker) serving a hybrid model
under the two pools, and `simulate` / `sweep` / `best_result` on top of it. Decode steps between
events are advanced in closed form, never per token per request.
"""

# What it models, checked line by line against SGLang 0.5.23 (paths under `sglang/srt/`):
# - arrival (`managers/tokenizer_manager.py` 1333-1378, `managers/scheduler.py` 2693-2736 and 3231,
#   `managers/tp_worker.py` 568-572, `mem_cache/allocator/base.py` 88-105): an input of >= context_length
#   tokens is refused; so is a client-set max_new_tokens with input + max_new > context_length (the
#   default --allow-auto-truncate off raises, it does not truncate); the scheduler refuses inputs of
#   >= max_req_len - 5, max_req_len = min(context_length - 1, KV capacity - 1). A client without max_tokens
#   sends None (`entrypoints/openai/protocol.py` 1214), read as 1 << 30; every max_new_tokens is then
#   clipped to max_req_len - input - 1 and to the empty pool (capacity - paged input - page - 1), and that
#   clipped value is what the reservation and the ratio after a retraction use.
# - admission (`managers/schedule_policy.py` PrefillAdder 607-692, 785-799, 874-893, 895-940, add_chunked_req
#   1140-1225, add_one_req 1395-1411, _select_prefill_admission 1592-1683; `mem_cache/prefill_budget.py`
#   99-168): rem_total_tokens = available + evictable - total_offset, where total_offset starts at
#   sum over running requests of min(max_new - output, CLIP) x new_token_ratio (CLIP =
#   SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION 4096, `environ.py` 650) and each admitted request adds its paged
#   extend + a page + min(max_new, CLIP) (0 for a truncated chunk); a request is admitted when
#   extend + min(max_new - output, CLIP) + page < rem_total_tokens, its matched prefix pinned out of the
#   evictable part (_lock_node); a pass stops at budget exhaustion (rem_chunk = chunked_prefill_size,
#   rem_input = max_prefill_tokens) or at the first request that does not fit (fcfs, the default policy
#   `arg_groups/fields/schedule.py` 86-102, does not sort: `schedule_policy.py` 231-235). A chunked
#   request continues first with min(rem_chunk, rem_total_tokens) tokens (prefill_budget.py 142-145).
# - the state clamp and batch_is_full (`managers/scheduler.py` 4027-4050, 4093-4126, 4225-4235, 4279-4284):
#   a request slot must be free (max_running_requests, which the state pool sets); a request that finds
#   no slot or no KV sets batch_is_full, which only a leaving request (or an empty batch) clears.
# - a prefill batch, when one forms, runs before decode (no mixed chunk by default), so a chunked long
#   prompt stalls decode until its last chunk.
# - decode and retraction (`managers/scheduler.py` update_running_batch 4459-4545, `managers/schedule_batch.py`
#   check_decode_mem 3432-3449, retract_decode 3451-3540, _get_decode_retraction_order 3542-3580): each step
#   needs one token per running request (pages: one per request at a page boundary); when it cannot,
#   requests are retracted fewest-output-first, then longest-input-first, at least one, until the step
#   fits; the last one is aborted if even it cannot fit. The retracted lose their KV without entering the
#   radix cache (release_req 2360-2392), keep their output and are appended to the waiting queue
#   (`scheduler.py` _add_request_to_queue 3480-3495), to be prefilled again from input + output.
# - new_token_ratio (`managers/scheduler_components/new_token_ratio_tracker.py` 21-49, `environ.py` 646-649):
#   init = min(0.7 x schedule_conservativeness, 1), floor = init x 0.14, decay (init - floor) / 600 per
#   decode step without retraction (scheduler.py 4542); after a retraction it is set to
#   min(1, (sum of output + 20 x requests) / (sum of clipped max_new + 1)) over the requests kept
#   (scheduler.py 4513; it may fall below the floor until the next decay); reset to init when the
#   scheduler finds no batch to run (scheduler.py 2050-2053, on_idle 5318).
# - radix prefix reuse (when enabled): a group's cached prefix is matched by later requests of the group;
#   a finished conversation turn (RequestSpec.extends_prefix) leaves its whole sequence cached for the next
#   turn; unlocked prefixes are evicted LRU-first when the KV pool needs room, or when the state slots the
#   running requests leave free cannot hold one recurrent state per cached prefix.
# Simplifications: one token per page of accounting (page_size only rounds the pool), no overlap
# scheduler lookahead, speculative decoding as `spec_accept_length` tokens per verify step with
# the draft tokens held in KV, DCP as a KV pool of kv_tokens x dcp_size logical tokens, a cached prefix
# matched whole or not at all, and a request that cannot fit even an empty pool is aborted (SGLang would
# keep it waiting).

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from advisor.model.pools import optimal_ratio_for
from advisor.model.serving import slots_per_request, spec_enabled
from advisor.scheduler.server import SchedulerServerConfig
from advisor.scheduler.types import (
    DecodeTick,
    PrefillBatch,
    RequestFinished,
    RequestSpec,
    Retraction,
    SimEvent,
    SimSnapshot,
    TrafficSource,
)

# environ.py (SGLang 0.5.23): SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
# SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS, SGLANG_RETRACT_DECODE_STEPS, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
# A request whose client set no max_tokens: the scheduler reads max_new_tokens=None as 1 << 30
# (`managers/scheduler.py` init_req_max_new_tokens, 2695-2699) before clipping it.
UNSET_MAX_NEW_TOKENS = 1 << 30
# Goodput counts the output tokens of requests whose total queue time (first wait plus every wait after a
# retraction) stays within this bound: a state-bound server pays for the queue it builds, a KV-bound one for
# its retractions (recomputation and requeueing), and neither earns credit for work its users gave up on.
DEFAULT_QUEUE_TIME_BOUND = 10.0
# `sglang:gen_throughput` decays to 0 after this long without decode stats (metrics_reporter.py).
GEN_THROUGHPUT_STALE_SECONDS = 30.0


# A request that left, as a goodput run records it: (time, prompt tokens, completion tokens, queue time,
# e2e latency, aborted).
FinishedRecord = tuple[float, int, int, float, float, bool]


def _event_time(event: SimEvent) -> float:
    return event.time


class _Req:
    """A request inside the simulated scheduler."""

    __slots__ = (
        "index",
        "rid",
        "arrival",
        "input_tokens",
        "target",
        "max_new",
        "group",
        "prefix_tokens",
        "generated",
        "queue_enter",
        "queue_time",
        "retractions",
        "cached_tokens",
        "prefix_len",
        "computed",
        "kv_own",
        "holds_group",
        "extends_prefix",
        "shared",
        "slot",
        "finish_step",
    )

    def __init__(self, index: int, rid: str | None, spec: RequestSpec, max_new: int) -> None:
        self.index = index
        self.rid = rid  # None: the worker's own numbering, spelt out when the request leaves
        self.arrival = spec.time
        tokens = spec.input_tokens
        self.input_tokens = tokens = tokens if tokens > 1 else 1
        self.max_new = max_new = max_new if max_new > 1 else 1
        target = spec.output_tokens if spec.output_tokens < max_new else max_new
        self.target = target if target > 1 else 1
        group = spec.prefix_group
        self.group = group
        self.prefix_tokens = min(spec.prefix_tokens, tokens - 1) if group else 0
        self.queue_enter = spec.time
        self.queue_time = 0.0
        # prefix_len: the matched (cached) prefix of the current admission; computed: fill tokens already
        # prefilled in the current admission (beyond the prefix); kv_own: KV tokens this request holds outside a
        # shared prefix (while not decoding); shared: tokens of the group prefix this request locks (counted
        # once, in the cache)
        self.generated = self.retractions = self.cached_tokens = self.prefix_len = self.computed = 0
        self.kv_own = self.shared = 0
        self.holds_group = False
        self.extends_prefix = spec.extends_prefix and group is not None
        self.slot = self.finish_step = -1

    @property
    def fill_len(self) -> int:
        return self.input_tokens + self.generated


class _Prefill:
    """A prefill batch under way (a plain slotted class: one is built per batch)."""

    __slots__ = ("start", "end", "parts")

    def __init__(self, start: float, end: float, parts: list[tuple[_Req, int]]) -> None:
        self.start = start
        self.end = end
        self.parts = parts  # (request, tokens prefilled this batch)


class _Decode:
    """A planned run of decode steps at a constant batch (a plain slotted class: one is built per run)."""

    __slots__ = ("t0", "s0", "n", "a", "b", "k_plan", "k_done", "ratio0", "decay_first", "mean_ctx0", "blocked",
                 "queue_since")

    def __init__(self, t0: float, s0: int, n: int, a: float, b: float, k_plan: int, ratio0: float,
                 decay_first: bool, mean_ctx0: float, blocked: str | None, queue_since: float) -> None:
        self.t0 = t0  # clock at the segment start
        self.s0 = s0  # decode-step counter at the segment start
        self.n = n
        self.a = a  # step j takes a + b*j seconds
        self.b = b
        self.k_plan = k_plan
        self.k_done = 0
        self.ratio0 = ratio0
        self.decay_first = decay_first  # False right after a retraction: that step did not decay the ratio
        self.mean_ctx0 = mean_ctx0  # mean live context (per running request) at step 0
        self.blocked = blocked  # 'state' / 'kv' when admission is blocked by that pool for the segment
        self.queue_since = queue_since  # from when the queue is non-empty (inf if it stays empty)


@dataclass
class SimAccumulators:
    """Cumulative integrals and counters of one worker (time-weighted stats need them)."""

    clock: float = 0.0
    running_seconds: float = 0.0  # integral of running requests dt
    busy_seconds: float = 0.0  # time with at least one running request
    live_context_seconds: float = 0.0  # integral of (decode_sum_seq_lens / running) dt while busy
    state_bound_seconds: float = 0.0
    kv_bound_seconds: float = 0.0
    arrived: int = 0
    retraction_events: int = 0
    retracted_requests: int = 0
    wasted_tokens: int = 0
    # First forwards begun (one a request; a retracted request's later prefill is not one), and those whose wait
    # before it exceeded the worker's first_wait_bound: what SGLang's sglang:queue_time_seconds histogram counts.
    first_forwards: int = 0
    first_waits_over_bound: int = 0


class Simulator:
    """One DP worker of an SGLang server under a workload. `advance(until)` runs simulated time."""

    def __init__(
        self,
        server: SchedulerServerConfig,
        workload: TrafficSource,
        *,
        seed: int = 0,
        dp_rank: int = 0,
        dp_size: int = 1,
        arrivals: Iterable[RequestSpec] | None = None,
        log_lines: bool = True,
    ) -> None:
        """`log_lines=False` builds no PrefillBatch / DecodeTick events (what SGLang logs and the emulator prints):
        a goodput run reads only finished requests and the accumulators, and skips their cost."""
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank must be in [0, dp_size), got dp_rank={dp_rank}, dp_size={dp_size}")
        self.server = server
        self.workload = workload
        self.log_lines = log_lines
        self.seed = seed
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        split = server.split()
        self.split = split
        serving = server.serving
        self.slots_per_request = slots_per_request(serving)
        self.clamp = max(1, split.max_running_requests)
        self.dcp = serving.dcp_size
        self.page = serving.page_size
        self.kv_capacity_physical = split.kv_capacity_tokens
        # DCP: the allocator's virtual locations span kv_tokens * dcp_size
        # (mem_cache/kv_cache_configurator.py), one logical token per sequence position.
        self.capacity = split.kv_capacity_tokens * self.dcp
        self._context_len = server.model_context_len
        self._max_req_len = min(self._context_len - 1, self.capacity - 1)
        self._chunked_prefill_size = server.chunked_prefill_size
        self._max_prefill_tokens = server.max_prefill_tokens
        self.draft = serving.draft_tokens if spec_enabled(serving) else 0
        self.draft_kv = self.draft  # KV each running request holds for its drafts
        self.cost = server.cost
        self.radix = server.enable_radix_prefix_reuse and not serving.disable_radix_cache
        init = min(INIT_NEW_TOKEN_RATIO * server.schedule_conservativeness, 1.0)
        self.ratio_init = init
        self.ratio_min = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (init - self.ratio_min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.ratio = init

        # arrivals
        source: Iterable[RequestSpec]
        source = (
            arrivals
            if arrivals is not None
            else workload.arrivals(np.random.default_rng(seed), 0.0, math.inf)
        )
        self._source: Iterator[RequestSpec] = iter(source)
        self._arrival_index = 0  # index over the whole server's stream (round-robin DP)
        self._peek: RequestSpec | None = None
        self._peek_time = math.inf  # the time of `_peek`, inf without one
        self._injected: list[tuple[float, int, RequestSpec, str]] = []
        self._inject_seq = 0
        self._issued = 0
        self._advance_source()

        # scheduler state
        self.clock = 0.0
        self._horizon = 0.0
        self.step = 0  # decode steps done
        self.queue: deque[_Req] = deque()
        # the waiting requests' whole sequences (prompt and any output a retraction sent back with them), summed as
        # they join and leave: a `Prefill batch` line's `#pending-token` (load_inquirer.py `_get_num_pending_tokens`)
        self.queued_tokens = 0
        self.chunked: _Req | None = None
        self.batch_full = False
        self.limit: str | None = None
        self._activity: _Prefill | _Decode | None = None
        self._staged_kv = 0  # KV held by requests being prefilled (not yet decoding)
        self._staged_seqs = 0

        capacity = self.clamp
        # per slot of the decode batch: its request's generated - step at joining (stale when free)
        self._gen_base = [0] * capacity
        self._slot_req: list[_Req | None] = [None] * capacity
        self._free_slots = list(range(capacity - 1, -1, -1))
        self._kv_own_base = 0  # sum over running of (own KV - step)
        self._seq_base = 0  # sum over running of (sequence length - step)
        self.n = 0
        self._finish_heap: list[tuple[int, int, int]] = []
        # The running requests' reservation, sum of min(max_new - generated, CLIP) at step s, kept as it
        # changes rather than summed per admission pass: a running request's remaining = max_new - gen_base
        # - s falls by one per step, so its term is CLIP while remaining >= CLIP and remaining after. Those at
        # the clip sit in a heap by max_new - gen_base (stale entries skipped by their join number).
        self._clip_heap: list[tuple[int, int, int]] = []
        self._clip_count = 0
        self._below_count = 0  # requests below the clip
        self._below_sum = 0  # sum of max_new - gen_base over those
        self._slot_band = [0] * capacity  # 1 at the clip, 2 below it, 0 free
        self._slot_join = [0] * capacity
        self._joins = 0

        # radix prefix reuse: group -> prefix tokens (LRU order), and lock counts
        self._cached: OrderedDict[str, int] = OrderedDict()
        self._refs: dict[str, int] = {}
        self._locked_prefix = 0
        self._evictable = 0

        # counters
        self.acc = SimAccumulators()
        self.requests_total = 0
        self.aborted_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.cached_tokens_total = 0
        self.retracted_input_total = 0
        self.retracted_output_total = 0
        self.decode_tokens_total = 0
        self.prefill_compute_total = 0
        self._last_tick_time = 0.0
        self._last_tick_tokens = 0
        self._gen_throughput = 0.0
        # When a list: requests that leave are appended to it as FinishedRecord tuples instead of being
        # reported as RequestFinished events (a goodput run needs only these few fields of each).
        self._finished_records: list[FinishedRecord] | None = None
        # SGLang observes `sglang:queue_time_seconds` once a request, on the wait before its first forward, as that
        # forward begins (observability/req_time_stats.py set_forward_entry_time; a retracted request's second wait
        # is not observed): the accumulators count first forwards and those that waited longer than this bound.
        self.first_wait_bound = DEFAULT_QUEUE_TIME_BOUND

    # ------------------------------------------------------------------ arrivals

    def _advance_source(self) -> None:
        """Load the next arrival of this DP rank into `_peek`."""
        self._peek = None
        self._peek_time = math.inf
        if self.dp_size == 1:
            spec = next(self._source, None)
            if spec is not None:
                self._arrival_index += 1
                self._peek = spec
                self._peek_time = spec.time
            return
        for spec in self._source:
            index = self._arrival_index
            self._arrival_index += 1
            if index % self.dp_size == self.dp_rank:
                self._peek = spec
                self._peek_time = spec.time
                return

    def _next_arrival_time(self) -> float:
        best = self._peek_time
        if self._injected and self._injected[0][0] < best:
            best = self._injected[0][0]
        return best

    def submit(self, spec: RequestSpec) -> str:
        """Inject one request (e.g. from an emulated HTTP client) arriving at max(spec.time, now).

        Returns its rid. Extension beyond the shared interface.
        """
        time = max(spec.time, self._horizon, self.clock)
        spec = replace(spec, time=time)
        rid = f"{self.dp_rank:04x}f{self._inject_seq:027x}"
        heapq.heappush(self._injected, (time, self._inject_seq, spec, rid))
        self._inject_seq += 1
        act = self._activity
        if isinstance(act, _Decode) and not self.batch_full:
            # The planned run of decode steps must stop at the first step boundary after it.
            k = self._steps_reaching(act.a, act.b, time - act.t0)
            act.k_plan = max(act.k_done, min(act.k_plan, k))
        return rid

    def _rid(self, index: int) -> str:
        return f"{self.dp_rank:04x}{index:028x}"

    def _pull_arrivals(self, until: float, events: list[SimEvent]) -> None:
        """Move every arrival with time <= until into the waiting queue; inputs at or over the
        context length are refused (aborted) at their arrival, as the tokenizer does.

        Pulling early never changes a decision (the queue is read only when the scheduler decides,
        and a planned decode run already stops at the first arrival that could be admitted), so
        `advance` and the log ticks pull eagerly to report the queue as of their time."""
        injected = self._injected
        while True:
            # an injected request first when it is strictly earlier than the source's next
            rid: str | None = None
            if injected and injected[0][0] < self._peek_time:
                if injected[0][0] > until:
                    return
                _time, _seq, spec, rid = heapq.heappop(injected)
            else:
                if self._peek_time > until:
                    return
                peeked = self._peek
                assert peeked is not None
                spec = peeked
                self._advance_source()
            refused, max_new = self._admit_limits(spec)
            req = _Req(self._issued, rid, spec, max_new)
            self._issued += 1
            self.acc.arrived += 1
            if refused:
                self._finish(req, spec.time, aborted=True, events=events)
                continue
            self.queue.append(req)
            self.queued_tokens += req.input_tokens

    def _admit_limits(self, spec: RequestSpec) -> tuple[bool, int]:
        """(refused, max_new_tokens as the scheduler keeps it) for an arriving request.

        SGLang 0.5.23: the tokenizer refuses an input of >= context_length tokens, and (with
        --allow-auto-truncate off, the default) a client-set max_new_tokens with input + max_new over
        the context (`managers/tokenizer_manager.py` 1338-1378); the scheduler refuses inputs of
        >= max_req_input_len = max_req_len - 5 (`managers/scheduler.py` 3231, `tp_worker.py` 568-572),
        where max_req_len = min(context_length - 1, KV capacity - 1), then clips max_new_tokens (None,
        i.e. a client without max_tokens, reads as 1 << 30) to max_req_len - input - 1 and to the
        empty pool, capacity - paged input - page - 1 (`scheduler.py` init_req_max_new_tokens
        2693-2736, `mem_cache/allocator/base.py` max_new_tokens_for_memory 88-105)."""
        context = self._context_len
        tokens = spec.input_tokens
        if tokens < 1:
            tokens = 1
        requested = spec.max_new_tokens
        max_req_len = self._max_req_len
        page = self.page
        paged = -(-tokens // page) * page
        max_new = min(requested, max_req_len - tokens - 1, self.capacity - paged - page - 1)
        refused = (
            tokens >= context
            or (requested < UNSET_MAX_NEW_TOKENS and tokens + requested > context)  # a client-set cap
            or tokens >= max_req_len - 5
        )
        return refused, max_new if max_new > 1 else 1

    # ------------------------------------------------------------------ pool accounting

    def _running_kv(self, step: int) -> int:
        return self._kv_own_base + self.n * step

    def _used(self, step: int) -> int:
        """KV tokens locked (not evictable): running, prefilling, locked prefixes, drafts."""
        return self._kv_own_base + self.n * (step + self.draft_kv) + self._staged_kv + self._locked_prefix

    def _evict(self, needed: int, step: int) -> None:
        """Evict unlocked cached prefixes (LRU first) until `needed` tokens are free."""
        free = self.capacity - self._used(step) - self._evictable
        if free >= needed or not self._evictable:
            return
        for group in list(self._cached):
            if free >= needed:
                break
            if self._refs.get(group, 0) == 0:
                tokens = self._cached.pop(group)
                self._evictable -= tokens
                free += tokens

    def _lock_group(self, req: _Req) -> None:
        group = req.group
        assert group is not None
        refs = self._refs.get(group, 0)
        if refs == 0:
            self._evictable -= self._cached[group]
            self._locked_prefix += self._cached[group]
        self._refs[group] = refs + 1
        self._cached.move_to_end(group)
        req.holds_group = True
        req.shared = self._cached[group]

    def _unlock_group(self, req: _Req) -> None:
        if not req.holds_group:
            return
        group = req.group
        assert group is not None
        req.holds_group = False
        req.shared = 0
        refs = self._refs[group] - 1
        self._refs[group] = refs
        if refs == 0:
            tokens = self._cached[group]
            self._locked_prefix -= tokens
            self._evictable += tokens

    # ------------------------------------------------------------------ public API

    @property
    def now(self) -> float:
        return max(self._horizon, self.clock)

    def advance(self, until: float) -> list[SimEvent]:
        """Run the scheduler up to simulated time `until`; return the events in time order."""
        events: list[SimEvent] = []
        if until < self.now:
            return events
        while True:
            act = self._activity
            if act is None:
                if self._decide(events, until):
                    continue
                act = self._activity
                if act is None:
                    # idle: wait for the next arrival
                    next_arrival = self._next_arrival_time()
                    if next_arrival > until:
                        break
                    self.clock = max(self.clock, next_arrival)
                    continue
            if isinstance(act, _Prefill):
                if act.end > until:
                    break
                self._complete_prefill(act.start, act.end, act.parts, events)
            elif not self._run_decode(act, until, events):
                break
        self._pull_arrivals(until, events)
        self._horizon = max(self._horizon, until)
        events.sort(key=_event_time)  # aborts at arrival may precede events of the same slice
        return events

    def snapshot(self) -> SimSnapshot:
        step = self.step
        used_logical = self._used(step)
        running = self.n
        mamba_used = (running + self._staged_seqs) * self.slots_per_request
        mamba_size = max(1, self.split.max_mamba_cache_size)
        cached_groups = sum(1 for g in self._cached if self._refs.get(g, 0) == 0)
        mamba_evictable = min(cached_groups, max(mamba_size - mamba_used, 0))
        prompt = self.cached_tokens_total + self.prefill_compute_total
        throughput = (
            self._gen_throughput if self.now - self._last_tick_time <= GEN_THROUGHPUT_STALE_SECONDS else 0.0
        )
        return SimSnapshot(
            time=self.now,
            kv_capacity_tokens=self.kv_capacity_physical,
            max_mamba_cache_size=self.split.max_mamba_cache_size,
            max_running_requests=self.clamp,
            page_size=self.page,
            running_requests=running,
            queued_requests=len(self.queue),
            kv_used_tokens=self._per_rank(used_logical),
            kv_evictable_tokens=self._per_rank(self._evictable),
            mamba_used_slots=mamba_used,
            mamba_evictable_slots=mamba_evictable,
            decode_sum_seq_lens=self._seq_base + running * step,
            new_token_ratio=self._current_ratio(),
            gen_throughput=throughput,
            cache_hit_rate=self.cached_tokens_total / prompt if prompt else 0.0,
            requests_total=self.requests_total,
            aborted_requests_total=self.aborted_total,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            cached_tokens_total=self.cached_tokens_total,
            retracted_requests_total=self.acc.retracted_requests,
            retracted_input_tokens_total=self.retracted_input_total,
            retracted_output_tokens_total=self.retracted_output_total,
            decode_tokens_total=self.decode_tokens_total,
            prefill_compute_tokens_total=self.prefill_compute_total,
        )

    def accumulators(self) -> SimAccumulators:
        """A copy of the cumulative integrals (for time-weighted statistics)."""
        copy = SimAccumulators(**asdict(self.acc))
        copy.clock = self.clock
        return copy

    def in_system(self) -> int:
        """Requests arrived and not finished: queued, being prefilled or decoding."""
        return len(self.queue) + self.n + self._staged_seqs

    def in_flight_output(self, queue_time_bound: float) -> tuple[int, int]:
        """Output tokens the requests still in the system have decoded so far, all and those of requests queued
        within `queue_time_bound` (a retracted request waiting again counts its wait so far)."""
        step = self.step
        total = within = 0
        for slot, req in enumerate(self._slot_req):
            if req is not None:
                generated = self._gen_base[slot] + step
                total += generated
                within += generated if req.queue_time <= queue_time_bound else 0
        for req in self.queue:
            total += req.generated
            waited = req.queue_time + max(0.0, self.clock - req.queue_enter)
            within += req.generated if waited <= queue_time_bound else 0
        return total, within

    # ------------------------------------------------------------------ helpers

    def _per_rank(self, logical_tokens: int) -> int:
        return -(-logical_tokens // self.dcp) if self.dcp > 1 else logical_tokens

    def _current_ratio(self) -> float:
        act = self._activity
        if isinstance(act, _Decode):
            return self._ratio_after(act, act.k_done)
        return self.ratio

    def _ratio_after(self, act: _Decode, steps: int) -> float:
        decayed = steps if act.decay_first else max(steps - 1, 0)
        return max(act.ratio0 - self.ratio_decay * decayed, self.ratio_min) if decayed else act.ratio0

    @staticmethod
    def _elapsed(a: float, b: float, k: int) -> float:
        return k * a + b * k * (k - 1) / 2

    def _steps_reaching(self, a: float, b: float, delta: float) -> int:
        """Smallest k >= 1 with elapsed(k) >= delta."""
        if delta <= a:
            return 1
        half = a - b / 2
        k = (
            int(math.ceil(2 * delta / (half + math.sqrt(half * half + 2 * b * delta))))
            if b > 0
            else int(math.ceil(delta / a))
        )
        if k < 1:
            k = 1
        # the estimate's rounding corrected against _elapsed itself (spelt out: this runs once per decode run)
        while k > 1 and (k - 1) * a + b * (k - 1) * (k - 2) / 2 >= delta:
            k -= 1
        while k * a + b * k * (k - 1) / 2 < delta:
            k += 1
        return k

    def _steps_within(self, a: float, b: float, t0: float, until: float, k_max: int) -> int:
        """Largest k <= k_max with t0 + elapsed(k) <= until."""
        if t0 + self._elapsed(a, b, k_max) <= until:
            return k_max
        if t0 + a > until:
            return 0
        k = self._steps_reaching(a, b, until - t0)
        while k > 0 and t0 + self._elapsed(a, b, k) > until:
            k -= 1
        return min(k, k_max)

    # ------------------------------------------------------------------ scheduling

    def _decide(self, events: list[SimEvent], until: float) -> bool:
        """One scheduler iteration at `clock`: a prefill batch if one forms, else decode. True when a decode run
        already ran to its end (see _plan_decode)."""
        while True:
            if self._peek_time <= self.clock or self._injected:
                self._pull_arrivals(self.clock, events)
            if self.n == 0 and not self.queue and self.chunked is None:
                # fully idle: scheduler.py on_idle resets the ratio
                self.ratio = self.ratio_init
                self.limit = None
                self.batch_full = False
                return False
            if self.chunked is None and (not self.queue or (self.batch_full and self.n)):
                batch = []  # what _form_prefill returns here, without touching any state
            else:
                batch = self._form_prefill(events)
            if batch:
                start = self.clock
                end = self._start_prefill(batch, events)
                if end <= until:
                    # It completes by `until` (as advance would find next): complete it now, then decide again.
                    self._complete_prefill(start, end, batch, events)
                    continue
                self._activity = _Prefill(start, end, batch)
                return False
            if self.n == 0:
                if self.queue and self.chunked is None:
                    # Nothing runs and the head cannot be admitted even into an empty pool.
                    head = self.queue.popleft()
                    self.queued_tokens -= head.fill_len
                    head.queue_time += self.clock - head.queue_enter
                    self._finish(head, self.clock, aborted=True, events=events)
                    continue
                if self.chunked is not None:
                    raise RuntimeError("simulator invariant: a chunked prefill formed no batch")
                return False
            decay_first = True
            if self._used(self.step) + self.n > self.capacity:
                self._retract(events)
                decay_first = False
                if self.n == 0:
                    continue
            return self._plan_decode(decay_first, until, events)

    def _form_prefill(self, events: list[SimEvent]) -> list[tuple[_Req, int]]:
        """PrefillAdder: the chunked request first, then the waiting queue in fcfs order."""
        n = self.n
        queue = self.queue
        if n == 0:
            self.batch_full = False
        if (self.batch_full or not queue) and self.chunked is None:
            return []
        held = 1 if self.chunked is not None else 0
        allocatable = self.clamp - n - held
        if allocatable <= 0 and self.chunked is None:
            self.batch_full = True
            self.limit = "state"
            return []
        step = self.step
        ratio = self.ratio
        offset = 0.0
        if n:
            offset = float(self._reserved(step)) * ratio
        current_offset = 0.0
        room = self.capacity - self._used(step)  # available + evictable
        rem_chunk = self._chunked_prefill_size
        rem_input = self._max_prefill_tokens
        page = self.page
        batch: list[tuple[_Req, int]] = []
        admitted = 0
        new_chunked: _Req | None = None
        self.limit = None

        chunked = self.chunked
        if chunked is not None:
            remaining_total = room - offset
            limit = min(rem_chunk, int(remaining_total)) if remaining_total > 0 else rem_chunk
            left = chunked.fill_len - chunked.prefix_len - chunked.computed
            take = min(left, limit, max(room, 0))
            if take <= 0:
                # Decode filled the pool under a chunked prefill: give its KV back and requeue it.
                self._retract_chunked(events)
                chunked = None
            else:
                truncated = take < left
                max_new = 0 if truncated else min(chunked.max_new, CLIP_MAX_NEW_TOKENS)
                offset += take + page + max_new
                current_offset += take + page
                rem_chunk -= take
                rem_input -= take
                batch.append((chunked, take))
                if truncated:
                    new_chunked = chunked

        radix = self.radix
        clock = self.clock
        while queue:
            if rem_chunk <= 0 or rem_input <= 0:
                break
            if admitted >= allocatable:
                self.batch_full = True
                self.limit = "state"
                break
            req = queue[0]
            prefix = 0
            pinned = 0
            group = req.group
            if radix and group is not None and self._cached.get(group, req.prefix_tokens + 1) <= req.prefix_tokens:
                prefix = self._cached[group]
                if self._refs.get(group, 0) == 0:
                    pinned = prefix  # _lock_node: a matched prefix is not evictable during selection
            generated = req.generated
            extend = req.input_tokens + generated - prefix  # fill_len - prefix
            max_new_left = req.max_new - generated  # clipped to [0, CLIP]
            if max_new_left > CLIP_MAX_NEW_TOKENS:
                max_new_left = CLIP_MAX_NEW_TOKENS
            elif max_new_left < 0:
                max_new_left = 0
            total_tokens = extend + max_new_left + page
            if total_tokens >= room - pinned - offset:
                self.batch_full = bool(batch) or n > 0
                self.limit = "kv"
                break
            queue.popleft()
            self.queued_tokens -= extend + prefix
            req.queue_time += clock - req.queue_enter
            req.prefix_len = prefix
            req.computed = 0
            req.kv_own = 0
            if prefix:
                self._lock_group(req)
                req.cached_tokens += prefix
                self.cached_tokens_total += prefix
            if extend > rem_chunk:
                take = rem_chunk // page * page or rem_chunk
                offset += take + page
                new_chunked = req
            else:
                take = extend
                offset += take + page + (req.max_new if req.max_new < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS)
            current_offset += take + page
            rem_chunk -= take
            rem_input -= take
            batch.append((req, take))
            admitted += 1
            if not (room - offset > 0 and room - current_offset > 0):
                self.batch_full = True
                self.limit = "kv"
                break
            if new_chunked is req:
                break
        if not queue:
            self.limit = None
        elif self.limit is None and n + len(batch) >= self.clamp:
            self.limit = "state"
        self.chunked = new_chunked
        return batch

    def _start_prefill(self, batch: list[tuple[_Req, int]], events: list[SimEvent]) -> float:
        """Stage `batch` for prefill; the time it completes."""
        tokens = 0
        attention = 0.0
        cached = 0
        first_waits: list[float] = []
        log_lines = self.log_lines
        acc = self.acc
        for req, take in batch:
            done_before = req.prefix_len + req.computed
            attention += take * (done_before + take / 2)
            tokens += take
            if req.computed == 0:
                cached += req.prefix_len
                if req.retractions == 0:  # its first forward: the wait so far is its first
                    acc.first_forwards += 1
                    if req.queue_time > self.first_wait_bound:
                        acc.first_waits_over_bound += 1
                    if log_lines:
                        first_waits.append(req.queue_time)
            req.computed += take
            req.kv_own += take
        self._staged_kv += tokens
        self._staged_seqs = len(batch)  # a request is in a batch once
        if self._evictable:
            self._evict(0, self.step)
        if self._cached:
            self._fit_cached_states()
        duration = self.cost.prefill_seconds(tokens, attention)
        self.prefill_compute_total += tokens
        if self.log_lines:
            used = self._used(self.step)
            events.append(
                PrefillBatch(
                    time=self.clock,
                    new_seqs=len(batch),
                    new_tokens=tokens,
                    cached_tokens=cached,
                    running_requests=self.n,
                    queued_requests=len(self.queue),
                    pending_tokens=self.queued_tokens + (self.chunked.fill_len - self.chunked.prefix_len
                                                         - self.chunked.computed if self.chunked is not None else 0),
                    full_token_usage=self._per_rank(used) / self.kv_capacity_physical,
                    mamba_usage=(self.n + self._staged_seqs)
                    * self.slots_per_request
                    / max(1, self.split.max_mamba_cache_size),
                    input_throughput=tokens / duration,
                    first_waits=tuple(first_waits),
                )
            )
        return self.clock + duration

    def _complete_prefill(self, start: float, end: float, parts: list[tuple[_Req, int]],
                          events: list[SimEvent]) -> None:
        """The prefill batch `parts` (a _Prefill's fields) completes at `end`."""
        duration = end - start
        self._integrate_flat(duration, start)
        self.clock = end
        chunked = self.chunked
        radix = self.radix
        for req, _take in parts:
            if req is chunked:
                continue
            # last chunk done: the forward samples the first (next) token
            self._staged_kv -= req.kv_own
            req.generated += 1
            if radix and req.group is not None and not req.holds_group and req.prefix_tokens > 0:
                if req.group not in self._cached and req.kv_own >= req.prefix_tokens:
                    # insert the prefix into the radix cache, shared from now on
                    self._cached[req.group] = req.prefix_tokens
                    self._refs[req.group] = 0
                    self._evictable += req.prefix_tokens
                    req.kv_own -= req.prefix_tokens
                    self._lock_group(req)
                    self._fit_cached_states()
            if req.generated >= req.target:
                self._release_kv(req)
                self._cache_finished(req)
                self._finish(req, self.clock, aborted=False, events=events)
            else:
                self._join_running(req)
        self._staged_seqs = 1 if self.chunked is not None else 0
        self._activity = None

    def _release_kv(self, req: _Req) -> None:
        req.kv_own = 0
        self._unlock_group(req)

    def _cache_finished(self, req: _Req) -> None:
        """A finished conversation turn leaves its sequence in the radix cache as its session's prefix
        (`mem_cache` cache_finished_req inserts the finished request; retracted requests are released
        without inserting, `managers/schedule_batch.py` release_req). Its KV was just freed, so the
        grown prefix is evictable; a prefix other running turns still lock is left as it is."""
        if not (self.radix and req.extends_prefix):
            return
        group = req.group
        assert group is not None
        tokens = req.fill_len - 1  # the last sampled token has no KV yet
        cached = self._cached.get(group)
        if self._refs.get(group, 0) > 0 or (cached is not None and cached >= tokens):
            return
        self._evictable += tokens - (cached or 0)
        self._cached[group] = tokens
        self._refs[group] = 0
        self._cached.move_to_end(group)
        self._fit_cached_states()

    def _fit_cached_states(self) -> None:
        """A cached prefix is only matchable with the recurrent state at its end, one state slot each, and
        those slots are what running and admitted requests leave free: allocating a request's slots evicts
        cached states first, LRU (`mem_cache/allocation.py` 339-341 ensure_mamba_capacity,
        `mem_cache/unified_radix_cache.py` 727-776). A prefix whose state is gone is dropped here with its KV
        (SGLang keeps that KV evictable but can no longer match it)."""
        room = self.split.max_mamba_cache_size - (self.n + self._staged_seqs) * self.slots_per_request
        excess = len(self._cached) - max(room, 0)
        if excess <= 0:
            return
        for group in list(self._cached):
            if excess <= 0:
                break
            if self._refs.get(group, 0) == 0:
                self._evictable -= self._cached.pop(group)
                self._refs.pop(group, None)
                excess -= 1

    def _reserved(self, step: int) -> int:
        """Sum over the running requests of min(max_new - generated, CLIP) at `step` (a running request never
        passes its max_new: it leaves at its target, which is at most max_new)."""
        heap = self._clip_heap
        limit = step + CLIP_MAX_NEW_TOKENS
        band, join = self._slot_band, self._slot_join
        while heap and heap[0][0] < limit:
            remaining_at_zero, joined, slot = heapq.heappop(heap)
            if join[slot] == joined and band[slot] == 1:
                band[slot] = 2
                self._clip_count -= 1
                self._below_count += 1
                self._below_sum += remaining_at_zero
        return CLIP_MAX_NEW_TOKENS * self._clip_count + self._below_sum - step * self._below_count

    def _join_running(self, req: _Req) -> None:
        slot = self._free_slots.pop()
        step = self.step
        self._slot_req[slot] = req
        gen_base = req.generated - step
        self._gen_base[slot] = gen_base
        remaining_at_zero = req.max_new - gen_base
        self._joins += 1
        self._slot_join[slot] = self._joins
        if remaining_at_zero - step >= CLIP_MAX_NEW_TOKENS:
            self._slot_band[slot] = 1
            self._clip_count += 1
            # The reservation is read only while the request runs, when its remaining output exceeds
            # max_new - target: one whose max_new passes its target by the clip stays at the clip.
            if req.max_new - req.target < CLIP_MAX_NEW_TOKENS:
                heapq.heappush(self._clip_heap, (remaining_at_zero, self._joins, slot))
        else:
            self._slot_band[slot] = 2
            self._below_count += 1
            self._below_sum += remaining_at_zero
        self._kv_own_base += req.kv_own - step
        self._seq_base += req.input_tokens + req.generated - 1 - step  # fill_len - 1 - step
        req.slot = slot
        req.finish_step = req.target - req.generated + step
        heapq.heappush(self._finish_heap, (req.finish_step, req.index, slot))
        self.n += 1

    def _leave_running(self, req: _Req) -> None:
        """Take a request out of the decode batch at the current step; sync its counters."""
        slot = req.slot
        step = self.step
        req.generated = self._gen_base[slot] + step
        sequence = req.input_tokens + req.generated - 1  # fill_len - 1
        self._kv_own_base -= sequence - req.shared - step
        self._seq_base -= sequence - step
        band = self._slot_band[slot]
        if band == 1:
            self._clip_count -= 1
        elif band == 2:
            self._below_count -= 1
            self._below_sum -= req.max_new - self._gen_base[slot]
        self._slot_band[slot] = 0
        self._slot_req[slot] = None
        self._free_slots.append(slot)
        req.slot = -1
        req.finish_step = -1
        self.n -= 1
        self.batch_full = False

    def _finish(self, req: _Req, time: float, *, aborted: bool, events: list[SimEvent]) -> None:
        self.requests_total += 1
        self.prompt_tokens_total += req.input_tokens
        if aborted:
            self.aborted_total += 1
        else:
            self.generation_tokens_total += req.generated
        records = self._finished_records
        if records is not None:
            records.append((time, req.input_tokens, req.generated, req.queue_time, time - req.arrival, aborted))
        else:
            events.append(
                RequestFinished(
                    time=time,
                    rid=req.rid if req.rid is not None else self._rid(req.index),
                    prompt_tokens=req.input_tokens,
                    completion_tokens=req.generated,
                    cached_tokens=req.cached_tokens,
                    num_retractions=req.retractions,
                    queue_time=req.queue_time,
                    e2e_latency=time - req.arrival,
                    max_new_tokens=req.max_new,
                    aborted=aborted,
                )
            )

    # ------------------------------------------------------------------ retraction

    def _retract(self, events: list[SimEvent]) -> None:
        """retract_decode: pop requests (fewest output, then longest input) until the step fits."""
        step = self.step
        running = [(slot, req) for slot, req in enumerate(self._slot_req) if req is not None]
        slots = np.array([slot for slot, _ in running], dtype=np.int64)
        generated = np.array([self._gen_base[slot] + step for slot, _ in running], dtype=np.int64)
        inputs = np.array([req.input_tokens for _, req in running], dtype=np.int64)
        order = slots[np.lexsort((-inputs, generated))]  # retract-first order
        before_available = self.capacity - self._used(step) - self._evictable
        ratio_before = self.ratio
        retracted: list[_Req] = []
        aborted: list[_Req] = []
        position = 0
        while True:
            if self.n == 1:
                if self._used(step) + 1 > self.capacity:
                    last = self._slot_req[int(order[position])]
                    assert last is not None
                    self._leave_running(last)
                    self._release_kv(last)
                    aborted.append(last)
                break
            req = self._slot_req[int(order[position])]
            position += 1
            assert req is not None
            self._leave_running(req)
            self._release_kv(req)
            retracted.append(req)
            if self._used(step) + self.n <= self.capacity:
                break
        kept = [(slot, req) for slot, req in enumerate(self._slot_req) if req is not None]
        kept_generated = sum(self._gen_base[slot] + step for slot, _ in kept)
        kept_max_new = sum(req.max_new for _, req in kept)
        self.ratio = min(1.0, (kept_generated + RETRACT_DECODE_STEPS * len(kept)) / (kept_max_new + 1))
        input_tokens = sum(r.input_tokens for r in retracted)
        output_tokens = sum(r.generated for r in retracted)
        for req in retracted:
            self._requeue(req)
        after_available = self.capacity - self._used(step) - self._evictable
        self.acc.retraction_events += 1
        self.acc.retracted_requests += len(retracted)
        self.acc.wasted_tokens += sum(r.fill_len - 1 for r in retracted)
        self.retracted_input_total += input_tokens
        self.retracted_output_total += output_tokens
        self.limit = "kv"
        events.append(
            Retraction(
                time=self.clock,
                retracted_requests=len(retracted),
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                new_tokens_gained=after_available - before_available,
                mamba_slots_gained=(len(retracted) + len(aborted)) * self.slots_per_request,
                new_token_ratio_before=ratio_before,
                new_token_ratio_after=self.ratio,
            )
        )
        for req in aborted:
            self._finish(req, self.clock, aborted=True, events=events)

    def _requeue(self, req: _Req) -> None:
        req.retractions += 1
        req.prefix_len = 0
        req.computed = 0
        req.kv_own = 0
        req.queue_enter = self.clock
        self.queued_tokens += req.fill_len
        if self.server.retract_to_front:
            self.queue.appendleft(req)
        else:
            self.queue.append(req)

    def _retract_chunked(self, events: list[SimEvent]) -> None:
        req = self.chunked
        assert req is not None
        self.chunked = None
        self._staged_kv -= req.kv_own
        self._staged_seqs = 0
        gained = req.kv_own
        self._release_kv(req)
        wasted = req.prefix_len + req.computed
        self.acc.retraction_events += 1
        self.acc.retracted_requests += 1
        self.acc.wasted_tokens += wasted
        self.retracted_input_total += req.input_tokens
        self.retracted_output_total += req.generated
        self._requeue(req)
        self.limit = "kv"
        events.append(
            Retraction(
                time=self.clock,
                retracted_requests=1,
                input_tokens=req.input_tokens,
                output_tokens=req.generated,
                new_tokens_gained=gained,
                mamba_slots_gained=self.slots_per_request,
                new_token_ratio_before=self.ratio,
                new_token_ratio_after=self.ratio,
            )
        )

    # ------------------------------------------------------------------ decode

    def _next_finish_step(self) -> int:
        heap = self._finish_heap
        while heap:
            finish_step, _index, slot = heap[0]
            req = self._slot_req[slot]
            if req is not None and req.finish_step == finish_step and req.index == _index:
                return finish_step
            heapq.heappop(heap)
        return 1 << 62

    def _plan_decode(self, decay_first: bool, until: float, events: list[SimEvent]) -> bool:
        """Plan the next run of decode steps; True when it ran to its end at once (it ends by `until`), False
        when it is left as the activity."""
        n = self.n
        step = self.step
        free = self.capacity - self._used(step)
        k_kv = free // n
        heap = self._finish_heap
        head = self._slot_req[heap[0][2]] if heap else None
        if head is not None and head.finish_step == heap[0][0] and head.index == heap[0][1]:
            k_finish = heap[0][0] - step  # _next_finish_step() when the heap's head is current
        else:
            k_finish = self._next_finish_step() - step
        sequences = self._seq_base + n * step
        mean_ctx0 = sequences / n + 1
        kv_first = (sequences + n + n * self.draft_kv) / self.dcp
        a, b = self.cost.decode_linear(n, kv_first, n / self.dcp, self.draft)
        k_plan = k_kv if k_kv < k_finish else k_finish
        if not self.batch_full:
            if self.queue:
                k_plan = 1  # a prefill pass comes first after this step
            else:
                next_arrival = self._next_arrival_time()
                if next_arrival < math.inf:
                    k_plan = min(k_plan, self._steps_reaching(a, b, next_arrival - self.clock))
        if k_plan < 1:
            k_plan = 1
        if self._evictable:
            self._evict(n * k_plan, step)
        blocked = self.limit if self.batch_full else None
        if self.queue:
            queue_since = self.clock
        else:
            queue_since = self._peek_time  # _next_arrival_time()
            if self._injected and self._injected[0][0] < queue_since:
                queue_since = self._injected[0][0]
        t0 = self.clock
        end = t0 + (k_plan * a + b * k_plan * (k_plan - 1) / 2)  # t0 + _elapsed(a, b, k_plan)
        if end <= until:
            # The whole run ends by `until` (as _run_decode would find next): run it now, without a _Decode.
            self._decode_progress(t0, step, n, a, b, mean_ctx0, blocked, queue_since, 0, k_plan, events)
            self.step = step + k_plan
            self.clock = end
            self._end_decode(self.ratio, decay_first, k_plan, events)
            return True
        self._activity = _Decode(t0, step, n, a, b, k_plan, self.ratio, decay_first, mean_ctx0, blocked,
                                 queue_since)
        return False

    def _run_decode(self, act: _Decode, until: float, events: list[SimEvent]) -> bool:
        """Advance the planned decode run up to `until`; True when it completed."""
        k_plan = act.k_plan
        a, b = act.a, act.b
        end = act.t0 + (k_plan * a + b * k_plan * (k_plan - 1) / 2)  # t0 + _elapsed(a, b, k_plan)
        k_new = k_plan if end <= until else self._steps_within(a, b, act.t0, until, k_plan)
        if k_new > act.k_done:
            self._decode_progress(act.t0, act.s0, act.n, a, b, act.mean_ctx0, act.blocked, act.queue_since,
                                  act.k_done, k_new, events)
            act.k_done = k_new
            self.step = act.s0 + k_new
        if act.k_done < k_plan:
            return False
        self.clock = end
        self._activity = None
        self._end_decode(act.ratio0, act.decay_first, k_plan, events)
        return True

    def _end_decode(self, ratio0: float, decay_first: bool, steps: int, events: list[SimEvent]) -> None:
        """A decode run of `steps` (>= 1) steps is done: the ratio decays (as _ratio_after), finished requests
        leave."""
        decayed = steps if decay_first else steps - 1
        if decayed:
            ratio = ratio0 - self.ratio_decay * decayed
            self.ratio = ratio if ratio >= self.ratio_min else self.ratio_min
        else:
            self.ratio = ratio0
        self._finish_due(events)

    def _decode_progress(self, t0: float, s0: int, n: int, a: float, b: float, mean_ctx0: float,
                         blocked_by: str | None, queue_since: float, j1: int, j2: int,
                         events: list[SimEvent]) -> None:
        """Steps j1..j2 of the decode run planned at (t0, s0) (a _Decode's fields, passed one by one: a run that
        fits before `until` runs without one)."""
        t_start = t0 + (j1 * a + b * j1 * (j1 - 1) / 2)  # t0 + _elapsed(a, b, j1)
        t_end = t0 + (j2 * a + b * j2 * (j2 - 1) / 2)
        dt = t_end - t_start
        count = j2 - j1
        sum_j = (j2 * (j2 - 1) - j1 * (j1 - 1)) // 2
        sum_j2 = ((j2 - 1) * j2 * (2 * j2 - 1) - (j1 - 1) * j1 * (2 * j1 - 1)) // 6
        acc = self.acc
        acc.running_seconds += n * dt
        acc.busy_seconds += dt
        acc.live_context_seconds += a * mean_ctx0 * count + (a + b * mean_ctx0) * sum_j + b * sum_j2
        if blocked_by is not None:
            blocked = t_end - (queue_since if queue_since > t_start else t_start)
            if blocked <= 0.0:  # max(0.0, ...)
                blocked = 0.0
            if blocked_by == "state":
                acc.state_bound_seconds += blocked
            else:
                acc.kv_bound_seconds += blocked
        # SGLang prints a decode line every decode_log_interval forward passes; with speculative decoding one pass
        # verifies the drafts and yields spec_accept_length tokens per request (one simulated step each).
        if not self.log_lines:
            self.decode_tokens_total += n * count
            return
        interval = self.server.decode_log_interval
        if self.draft:
            interval = max(1, round(interval * self.cost.spec_accept_length))
        first_tick = (s0 + j1) // interval + 1
        last_tick = (s0 + j2) // interval
        for tick in range(first_tick, last_tick + 1):
            j = tick * interval - s0
            tick_time = t0 + self._elapsed(a, b, j)
            tokens = self.decode_tokens_total + n * (j - j1)
            self._pull_arrivals(tick_time, events)
            gap = tick_time - self._last_tick_time
            self._gen_throughput = (tokens - self._last_tick_tokens) / gap if gap > 0 else 0.0
            self._last_tick_time = tick_time
            self._last_tick_tokens = tokens
            used = self._used(tick * interval)
            mamba_used = (n + self._staged_seqs) * self.slots_per_request
            events.append(
                DecodeTick(
                    time=tick_time,
                    running_requests=n,
                    queued_requests=len(self.queue),
                    kv_used_tokens=self._per_rank(used),
                    full_token_usage=self._per_rank(used) / self.kv_capacity_physical,
                    mamba_used_slots=mamba_used,
                    mamba_usage=mamba_used / max(1, self.split.max_mamba_cache_size),
                    gen_throughput=self._gen_throughput,
                )
            )
        self.decode_tokens_total += n * count

    def _finish_due(self, events: list[SimEvent]) -> None:
        step = self.step
        heap = self._finish_heap
        while heap and heap[0][0] <= step:
            finish_step, index, slot = heapq.heappop(heap)
            req = self._slot_req[slot]
            if req is None or req.index != index or req.finish_step != finish_step:
                continue
            self._leave_running(req)
            req.kv_own = 0  # _release_kv
            if req.holds_group:
                self._unlock_group(req)
            if req.extends_prefix:
                self._cache_finished(req)
            self._finish(req, self.clock, aborted=False, events=events)

    def _integrate_flat(self, duration: float, start: float) -> None:
        """Stats over a stretch where nothing decodes (a prefill batch)."""
        acc = self.acc
        n = self.n
        acc.running_seconds += n * duration
        if n:
            acc.busy_seconds += duration
            acc.live_context_seconds += duration * ((self._seq_base + n * self.step) / n)
        if self.queue and self.limit is not None:
            if self.limit == "state":
                acc.state_bound_seconds += duration
            else:
                acc.kv_bound_seconds += duration


# ---------------------------------------------------------------------- results


@dataclass
class SimResult:
    """What one simulated run at one ratio achieved (after warmup)."""

    ratio: float | None
    max_running_requests: int
    kv_capacity_tokens: int
    max_mamba_cache_size: int
    completed_requests: int
    goodput_requests_per_second: float
    goodput_tokens_per_second: float  # completed output tokens / s (raw: every completed request)
    slo_goodput_tokens_per_second: float  # output tokens / s of completed requests queued <= queue_time_bound
    queue_time_bound: float
    retractions: int  # retraction events
    retracted_requests: int
    wasted_tokens: int  # KV recomputed because of retraction
    queue_time_p50: float
    queue_time_p90: float
    queue_time_p99: float
    mean_running_requests: float  # time-weighted, per DP worker
    state_bound_fraction: float  # share of time a waiting request was held back by the slot clamp
    kv_bound_fraction: float  # ... by the KV pool (admission reservation or retraction)
    mean_live_context: float  # time-weighted decode_sum_seq_lens / running
    mean_busy_running_requests: float  # time-weighted running requests while any run, per DP worker (the gauge's)
    mean_request_context: float  # mean prompt + completion tokens of completed requests
    # extensions
    server: str = ""
    workload: str = ""
    seed: int = 0
    duration: float = 0.0
    warmup: float = 0.0
    dp_size: int = 1
    slots_per_request: int = 0
    token_equiv: float = 0.0
    formula_ratio: float | None = None  # r* = (S + D) token_equiv dcp / mean_request_context
    arrived_requests: int = 0
    aborted_requests: int = 0
    in_system_at_end: int = 0
    mean_e2e_latency: float = 0.0
    # Output tokens / s decoded by the requests still in the system at the end (all; those queued within the bound):
    # where a few long requests finish just before or just after the end, the completed figures jump by one request
    # between two close ratios; these do not.
    in_flight_tokens_per_second: float = 0.0
    in_flight_slo_tokens_per_second: float = 0.0
    # Requests whose first forward began in the measured period, and those of them whose wait before it exceeded
    # queue_time_bound: what a server's queue-time histogram counts (one observation a request, its first wait).
    admitted_requests: int = 0
    admitted_over_bound_requests: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _run_worker(
    server: SchedulerServerConfig,
    workload: TrafficSource,
    *,
    duration: float,
    warmup: float,
    seed: int,
    dp_rank: int,
    dp_size: int,
    arrivals: Iterable[RequestSpec] | None,
    chunk_seconds: float = 60.0,
    first_wait_bound: float = DEFAULT_QUEUE_TIME_BOUND,
) -> tuple[Simulator, SimAccumulators, SimAccumulators, list[FinishedRecord]]:
    sim = Simulator(server, workload, seed=seed, dp_rank=dp_rank, dp_size=dp_size, arrivals=arrivals,
                    log_lines=False)
    records: list[FinishedRecord] = []
    sim._finished_records = records
    sim.first_wait_bound = first_wait_bound
    start_acc = sim.accumulators()
    t = 0.0
    marks = sorted({warmup, duration})
    while t < duration:
        nxt = min(t + chunk_seconds, duration)
        for mark in marks:
            if t < mark < nxt:
                nxt = mark
        sim.advance(nxt)
        t = nxt
        if t == warmup and warmup > 0:
            start_acc = sim.accumulators()
    end_acc = sim.accumulators()
    # Completed requests leave at the (monotonic) clock, so their records are in time order as the events'.
    return sim, start_acc, end_acc, [record for record in records if record[0] >= warmup]


def simulate(
    server: SchedulerServerConfig,
    workload: TrafficSource,
    *,
    duration: float,
    seed: int = 0,
    warmup: float = 0.0,
    arrivals: Sequence[RequestSpec] | None = None,
    queue_time_bound: float = DEFAULT_QUEUE_TIME_BOUND,
) -> SimResult:
    """Run `workload` on `server` for `duration` simulated seconds; statistics after `warmup`.

    With `serving.dp_size` > 1 the traffic is split round-robin over that many workers and the
    counts and goodput are summed; time-weighted means are per worker.
    """
    if not duration > 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration}")
    if not 0 <= warmup < duration:
        raise ValueError(f"warmup must be in [0, duration), got {warmup}")
    dp_size = max(1, server.serving.dp_size)
    workers = [
        _run_worker(
            server,
            workload,
            duration=duration,
            warmup=warmup,
            seed=seed,
            dp_rank=rank,
            dp_size=dp_size,
            arrivals=arrivals,
            first_wait_bound=queue_time_bound,
        )
        for rank in range(dp_size)
    ]
    first = workers[0][0]
    measured = duration - warmup
    finished = [record for w in workers for record in w[3]]
    # (time, prompt tokens, completion tokens, queue time, e2e latency) of the completed
    completed = [record[:5] for record in finished if not record[5]]
    queue_times = [queue_time for _, _, _, queue_time, _ in completed]
    span = sum(max(end.clock - start.clock, 1e-12) for _, start, end, _ in workers)

    def delta(name: str) -> float:
        return float(sum(getattr(end, name) - getattr(start, name) for _, start, end, _ in workers))

    busy = delta("busy_seconds")
    output_tokens = sum(completion for _, _, completion, _, _ in completed)
    slo_tokens = sum(completion for _, _, completion, queue_time, _ in completed if queue_time <= queue_time_bound)
    mean_context = (
        float(np.mean([prompt + completion for _, prompt, completion, _, _ in completed])) if completed else 0.0
    )
    formula = None
    if mean_context > 0:
        formula = optimal_ratio_for(server.serving, server.constants, mean_context)
    in_flight = [w[0].in_flight_output(queue_time_bound) for w in workers]
    return SimResult(
        ratio=server.ratio,
        max_running_requests=first.clamp,
        kv_capacity_tokens=first.kv_capacity_physical,
        max_mamba_cache_size=first.split.max_mamba_cache_size,
        completed_requests=len(completed),
        goodput_requests_per_second=len(completed) / measured,
        goodput_tokens_per_second=output_tokens / measured,
        slo_goodput_tokens_per_second=slo_tokens / measured,
        queue_time_bound=queue_time_bound,
        admitted_requests=int(delta("first_forwards")),
        admitted_over_bound_requests=int(delta("first_waits_over_bound")),
        retractions=int(delta("retraction_events")),
        retracted_requests=int(delta("retracted_requests")),
        wasted_tokens=int(delta("wasted_tokens")),
        queue_time_p50=_percentile(queue_times, 50),
        queue_time_p90=_percentile(queue_times, 90),
        queue_time_p99=_percentile(queue_times, 99),
        mean_running_requests=delta("running_seconds") / span,
        state_bound_fraction=delta("state_bound_seconds") / span,
        kv_bound_fraction=delta("kv_bound_seconds") / span,
        mean_live_context=delta("live_context_seconds") / busy if busy > 0 else 0.0,
        mean_busy_running_requests=delta("running_seconds") / busy if busy > 0 else 0.0,
        mean_request_context=mean_context,
        server=server.name,
        workload=workload.name,
        seed=seed,
        duration=duration,
        warmup=warmup,
        dp_size=dp_size,
        slots_per_request=first.slots_per_request,
        token_equiv=server.constants.token_equiv,
        formula_ratio=formula,
        arrived_requests=int(sum(w[2].arrived for w in workers)),
        aborted_requests=len(finished) - len(completed),
        in_system_at_end=sum(w[0].in_system() for w in workers),
        mean_e2e_latency=float(np.mean([e2e for _, _, _, _, e2e in completed])) if completed else 0.0,
        in_flight_tokens_per_second=sum(total for total, _ in in_flight) / measured,
        in_flight_slo_tokens_per_second=sum(within for _, within in in_flight) / measured,
    )


def sweep(
    server: SchedulerServerConfig,
    workload: TrafficSource,
    ratios: Sequence[float],
    *,
    duration: float,
    seed: int = 0,
    warmup: float = 0.0,
    queue_time_bound: float = DEFAULT_QUEUE_TIME_BOUND,
) -> list[SimResult]:
    """simulate() at every ratio, on the very same arrivals (generated once under `seed`)."""
    arrivals = workload.requests(seed, duration)
    return [
        simulate(
            server.with_ratio(r), workload, duration=duration, seed=seed, warmup=warmup, arrivals=arrivals,
            queue_time_bound=queue_time_bound,
        )
        for r in ratios
    ]


def best_result(results: Sequence[SimResult], tolerance: float = 0.005) -> SimResult:
    """The oracle pick of a sweep: the highest goodput (tokens/s); among results within
    `tolerance` of it, the lowest p90 queue time, then the fewest retractions."""
    if not results:
        raise ValueError("no results to choose from")
    top = max(r.goodput_tokens_per_second for r in results)
    close = [r for r in results if r.goodput_tokens_per_second >= top * (1 - tolerance)]
    return min(close, key=lambda r: (r.queue_time_p90, r.retractions, -r.goodput_tokens_per_second))
