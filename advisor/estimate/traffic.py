"""The observed traffic as a replayable picture (pure; `now` is passed in): when requests arrived and how long
they were over the recent window, so the scheduler model can answer "what would this traffic have done at r?".

Two ways in. With request logs followed, every finished request is known exactly (arrival = finish time -
e2e latency, prompt and completion tokens, `max_new_tokens` when the log shows sampling params): the replay is
those requests. Without them, each scrape interval is a bin: how many requests arrived (finished + the change
in running + queued) and the interval's deltas of SGLang's prompt and generation token histograms with their
exact sums; a replay draws that many requests in the bin, each with lengths from the marginals of the interval
it finished in (fcfs: the n-th in is the n-th out), so bursts of long requests stay where they came in time,
not where their queue let them finish. The backlog running or queued when the window opens is replayed as
arriving at its start.

A request whose `max_new_tokens` is unknown is replayed as SGLang treats one its client left unset: capped by the
context (`managers/scheduler.py` init_req_max_new_tokens: max_req_len - input - 1), which admission then clips to
SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION for its reservation.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from array import array
from collections import Counter, deque
from collections.abc import Collection, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from advisor.scheduler.types import RequestSpec

CHECKPOINT_VERSION = 1
UNSET_MAX_NEW_TOKENS = 1 << 30  # the scheduler model caps it at the context, as SGLang does
# How far below a finished turn's sequence length a later match may fall and still be that turn's prefix
# (page rounding, the last sampled token; a larger share of very long sequences).
PREFIX_MATCH_SLACK = 256
# The longest gap between a matched prefix and an earlier prompt still read as that turn's output
# (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION's default, managers/schedule_policy.py).
TURN_OUTPUT_CAP = 4096
# How the age of an earlier turn weighs against it as the previous turn of a conversation: a minute old costs as
# much as a gap one e-fold less likely (a session's next turn follows its previous one's end by the client's
# think or tool time).
TURN_GAP_SECONDS = 60.0
# The requests a request-log picture copies the server's held ones from (`_past_the_cut`): the latest this many
# before its cut at least.
TAIL_POOL_MIN = 30
# A held request's output is drawn from the known requests of the nearest prompts: at most this many, and only
# those within this share of its prompt (or as near as the nearest).
TAIL_NEAR_PROMPTS = 8
TAIL_NEAR_SHARE = 0.2
# A finished request gives the window's output rate (`_output_rate`) when it made at least this many tokens.
TAIL_RATE_MIN_OUTPUT = 16
# A prompt bucket's outputs are rescaled by its mean residence only when this many of its requests finished.
MIN_BUCKET_FINISHES = 5
# How strongly an output may follow its prompt: the calibration tries weights from -PAIRING_STRENGTH to
# +PAIRING_STRENGTH (standard deviations of log output per standard deviation of log prompt) in PAIRING_STEPS.
PAIRING_STRENGTH = 3.0
PAIRING_STEPS = 25
PAIRING_BISECTIONS = 12  # halvings of a grid step of beta where the band lies between two grid values
# The shown batch length is a time-sampled gauge while the picture's is step-weighted: where step times swing
# with the batch (bursts of long prompts) the two part even with the pairing right (the scheduler model on its
# own arrivals: 0-3% on steady, reasoning, diurnal and overload traffic, 9% bursty-mixed, 23% doc-bursts). The
# drawn pairing stands while it comes within this share of the target; beyond, beta moves only as far as that
# band's edge.
PAIRING_TOLERANCE = 0.1
# Scrapes that must have shown a running batch before its mean length pairs the outputs (30 min of 15 s scrapes
# give 120; fewer than this and the stays pair them, as without the gauge).
MIN_LIVE_SAMPLES = 20
# The pairing axis reads the prompts as a mixture of two kinds when a two-normal fit in log tokens beats one
# normal by this many nats per log n (three more parameters; BIC asks 1.5), from this many requests, starting
# EM with the split at these quantiles (a small kind, a burst of documents among chat, needs a high start).
MIXTURE_EVIDENCE = 5.0
MIXTURE_MIN_REQUESTS = 50
MIXTURE_STARTS = (0.5, 0.8, 0.95, 0.99)
MIXTURE_ITERATIONS = 40
MIXTURE_MIN_SD = 0.05  # log tokens: a kind of one repeated length does not collapse the fit
MIXTURE_FIT_POINTS = 2000
# The share of finished outputs below the tail whose stay dates when a new server's finishes hold its traffic.
MATURE_TAIL = 0.99
# Inside a histogram's bucket lengths are drawn from a density proportional to x**a, with a in
# [-BUCKET_EXPONENT_LIMIT, BUCKET_EXPONENT_LIMIT] found by this many bisections (log-uniform is a = -1).
BUCKET_EXPONENT_LIMIT = 20.0
BUCKET_EXPONENT_BISECTIONS = 24
# A batch shared by several prompts is split by the best of this many draws from the window's prompt histogram.
SPLIT_DRAWS = 64
# ... drawn once per picture, this many
SPLIT_POOL = 4096


@dataclass(frozen=True)
class TrafficSettings:
    window_seconds: float = 1800.0  # how much recent traffic a replay covers
    max_bins: int = 360
    max_requests: int = 30000
    # exact request records stand in for the bins once they cover this share of the window, or hold this many
    # requests over this many seconds: real lengths, paired per request, beat lengths drawn from histograms even
    # over a shorter span (under a long queue the completely known arrivals cover only part of the window)
    exact_coverage: float = 0.5
    exact_min_requests: int = 1000
    exact_min_seconds: float = 300.0
    # A replay's cost grows with its requests: a busy server's picture keeps its most recent this many.
    max_replay_requests: int = 8000

    def __post_init__(self) -> None:
        if not self.window_seconds > 0:
            raise ValueError(f"window_seconds must be > 0, got {self.window_seconds}")
        if self.max_bins < 2 or self.max_requests < 1 or self.max_replay_requests < 2:
            raise ValueError("max_bins must be >= 2, max_requests >= 1 and max_replay_requests >= 2")
        if not 0 < self.exact_coverage <= 1:
            raise ValueError(f"exact_coverage must be in (0, 1], got {self.exact_coverage}")
        if self.exact_min_requests < 2 or not self.exact_min_seconds >= 0:
            raise ValueError("exact_min_requests must be >= 2 and exact_min_seconds >= 0")


# Bucket-bound tuples, one object per distinct layout: every bin of every server usually has the same bounds.
_SHARED_BOUNDS: dict[tuple[float, ...], tuple[float, ...]] = {}


def _shared_bounds(bounds: Sequence[float]) -> tuple[float, ...]:
    if isinstance(bounds, tuple) and (found := _SHARED_BOUNDS.get(bounds)) is not None:
        return found
    key = tuple(float(b) for b in bounds)
    shared = _SHARED_BOUNDS.get(key)
    if shared is None:
        if len(_SHARED_BOUNDS) >= 256:
            _SHARED_BOUNDS.clear()
        shared = _SHARED_BOUNDS[key] = key
    return shared


def _counts(counts: Sequence[float]) -> array:
    """Counts as a packed array of doubles, a negative or NaN count read as 0."""
    packed = counts if isinstance(counts, array) and counts.typecode == "d" else None
    if packed is None:
        try:
            packed = array("d", counts)
        except TypeError:  # not all floats (ints, numpy scalars): one by one
            packed = array("d", (float(c) for c in counts))
    if all(map(operator.le, itertools.repeat(0.0), packed)):  # 0 <= c: False for a negative or NaN one
        return packed
    return array("d", (max(0.0, c) for c in packed))


@dataclass(slots=True)
class TrafficBin:
    """One scrape interval: arrivals and the interval's length marginals (bucket counts, not cumulative).
    Compact, since a server keeps up to `max_bins` of them: bounds are one shared tuple per layout, counts a
    packed array of doubles (negative counts read as 0)."""

    start: float
    end: float
    arrivals: float
    in_system_at_start: float
    prompt_bounds: tuple[float, ...] = ()
    prompt_counts: array = field(default_factory=lambda: array("d"))
    prompt_sum: float = 0.0
    generation_bounds: tuple[float, ...] = ()
    generation_counts: array = field(default_factory=lambda: array("d"))
    generation_sum: float = 0.0
    queued_at_start: float | None = None  # of in_system_at_start, those still waiting (not yet admitted)
    # The prefill batches the scheduler ran in the interval, in order: [#new-seq, #new-token, #cached-token]
    admissions: list[list[int]] = field(default_factory=list)
    # The running decode batch at the interval's end: sum of its sequence lengths (decode_sum_seq_lens) and its
    # requests; 0 and 0 when not shown or idle.
    live_seq_tokens: float = 0.0
    live_running: float = 0.0
    # The interval's queue-time histogram (sglang:queue_time_seconds, observed as a request leaves the queue):
    # bucket upper bounds in seconds and counts; empty when not shown.
    queue_bounds: tuple[float, ...] = ()
    queue_counts: array = field(default_factory=lambda: array("d"))

    def __post_init__(self) -> None:
        self.prompt_bounds = _shared_bounds(self.prompt_bounds)
        self.generation_bounds = _shared_bounds(self.generation_bounds)
        self.queue_bounds = _shared_bounds(self.queue_bounds)
        self.prompt_counts = _counts(self.prompt_counts)
        self.generation_counts = _counts(self.generation_counts)
        self.queue_counts = _counts(self.queue_counts)

    @property
    def finished(self) -> float:
        return float(sum(self.prompt_counts))

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start, "end": self.end, "arrivals": self.arrivals,
            "in_system_at_start": self.in_system_at_start,
            "prompt_bounds": list(self.prompt_bounds), "prompt_counts": list(self.prompt_counts),
            "prompt_sum": self.prompt_sum,
            "generation_bounds": list(self.generation_bounds), "generation_counts": list(self.generation_counts),
            "generation_sum": self.generation_sum,
            "queued_at_start": self.queued_at_start,
            "admissions": [list(batch) for batch in self.admissions],
            "live_seq_tokens": self.live_seq_tokens, "live_running": self.live_running,
            "queue_bounds": list(self.queue_bounds), "queue_counts": list(self.queue_counts),
        }


@dataclass(frozen=True)
class ExactRequest:
    arrival: float  # server clock seconds
    input_tokens: int
    output_tokens: int
    max_new_tokens: int | None = None
    finish: float | None = None  # server clock seconds; None = arrival (a record without latency)
    cached_tokens: int = 0  # the prefix the radix cache matched (meta_info cached_tokens); 0 when unknown
    # True: it stopped on its own (finish reason `stop`); False: it reached its max_new_tokens (`length`); None:
    # the log does not say
    stopped: bool | None = None


QueueHistogram = tuple[tuple[float, ...], tuple[float, ...]]  # (bucket upper bounds in seconds, counts)
QueueSeries = tuple[tuple[float, float, tuple[float, ...]], ...]  # per interval: (start, end, counts)


# A max_new_tokens at which at least this many requests of the window finished by length is a cap their clients
# share (a length finish marks a request that reached its own cap; two at one token count are no coincidence).
# At three, the demo's first window (1,678 requests, two of them at its 2048 cap) replayed every request unset: its
# KV cliff came early and the advice was 7.2, where the scheduler model serves 30-35% less SLO goodput than at 8.2;
# the next window, with the cap read, asked for a second restart.
SHARED_CAP_MIN_REQUESTS = 2


def with_caps_from_finishes(records: Sequence[ExactRequest], seed: int = 0) -> list[ExactRequest]:
    """The requests with the max_new_tokens their finishes tell, where the log does not show the sampling params
    (`--log-requests-level` 0). Only where the log tells stops from length finishes (it shows both): a request that
    finished by `length` reached its cap, so its max_new_tokens is its output; at a value X where
    SHARED_CAP_MIN_REQUESTS or more did so, clients share the cap X, and of the requests that would have run past X,
    the A that stopped at it and the B whose outputs went beyond, A / (A + B) were capped there. That share of the
    requests that stopped short of X is given the cap X (drawn with `seed`), capping being independent of how long
    an answer runs; caps are taken smallest first. Admission reserves up to each request's cap (clipped at 4096):
    support sessions capped at 1024 were replayed as unset and reserved four times what the server did."""
    unknown = [r for r in records if r.max_new_tokens is None]
    if not any(r.stopped is True for r in unknown) or not any(r.stopped is False for r in unknown):
        return list(records)
    at_cap = Counter(r.output_tokens for r in unknown if r.stopped is False)
    outputs = np.sort(np.asarray([r.output_tokens for r in unknown]))
    shares = []
    for cap in sorted(value for value, count in at_cap.items() if count >= SHARED_CAP_MIN_REQUESTS and value > 1):
        beyond = len(outputs) - int(np.searchsorted(outputs, cap, side="right"))
        shares.append((cap, at_cap[cap] / (at_cap[cap] + beyond)))
    rng = np.random.default_rng(seed)
    out = []
    for r in records:
        if r.max_new_tokens is None and r.stopped is False:
            r = replace(r, max_new_tokens=max(1, r.output_tokens))
        elif r.max_new_tokens is None and r.stopped is True:
            for cap, share in shares:
                if r.output_tokens < cap and rng.random() < share:
                    r = replace(r, max_new_tokens=cap)
                    break
        out.append(r)
    return out


@dataclass(frozen=True)
class TrafficPicture:
    """The replayable traffic: requests with times from the window's start, the window, and where it came from."""

    requests: list[RequestSpec]
    window_seconds: float
    source: str  # "request_log" | "metrics"
    backlog: int = 0  # requests replayed at t=0 for what was running or queued when the window opened
    # The running batch's mean sequence length the server showed over the window (its decode_sum_seq_lens over
    # num_running_reqs, time-weighted), when the outputs were paired to it; the replay checks its own against it.
    live_context: float | None = None
    live_running: float | None = None  # ... and its mean running requests over the same scrapes (all DP ranks)
    # Requests whose output the server's matched prefixes fixed (continued turns): a re-pairing leaves them.
    fixed_outputs: tuple[int, ...] = ()
    # The server's queue-time histogram over the window (bucket upper bounds in seconds, counts), when it showed
    # one: the replay at the live ratio checks its own queue against it.
    live_queue_times: QueueHistogram | None = None
    # The same histogram per scrape interval of its layout: (start, end, counts), in seconds from the window's start.
    # SGLang observes a request's wait once, as its first forward begins, so the counts are the server's admissions
    # through the window (under a full pool, its turnover), and the replay, which measures only after
    # its warmup, reads the server's admission rate over the same part (`recommend/replay.py` `_work_matched`).
    live_queue_series: QueueSeries | None = None

    @property
    def arrival_rate(self) -> float:
        return len(self.requests) / self.window_seconds if self.window_seconds > 0 else 0.0


def picture_since(picture: TrafficPicture, start: float) -> TrafficPicture:
    """The picture's requests from `start` (seconds from its window's start) on, their times from there: what ran
    before is not replayed, nor queued at the start."""
    kept = [index for index, request in enumerate(picture.requests) if request.time >= start]
    position = {index: new for new, index in enumerate(kept)}
    return replace(picture, requests=[replace(picture.requests[i], time=picture.requests[i].time - start) for i in kept],
                   window_seconds=max(picture.window_seconds - start, 1.0), backlog=0,
                   fixed_outputs=tuple(position[index] for index in picture.fixed_outputs if index in position))


def tiled(picture: TrafficPicture, seconds: float) -> TrafficPicture:
    """The picture's traffic repeated back to back until it spans `seconds` (what it would be had it lasted that
    long): each copy's conversations are their own, so no copy reuses another's cached prefixes."""
    span = picture.window_seconds
    if not span > 0 or seconds <= span or not picture.requests:
        return picture
    copies = int(math.ceil(seconds / span))
    fixed_outputs = set(picture.fixed_outputs)
    requests: list[RequestSpec] = []
    fixed: list[int] = []
    for copy in range(copies):
        offset = copy * span
        for index, request in enumerate(picture.requests):
            if request.time + offset >= seconds:
                continue
            if index in fixed_outputs:
                fixed.append(len(requests))
            group = request.prefix_group if copy == 0 or request.prefix_group is None else f"{request.prefix_group}#{copy}"
            requests.append(replace(request, time=request.time + offset, prefix_group=group))
    return replace(picture, requests=requests, window_seconds=seconds, fixed_outputs=tuple(fixed))


def redrawn(picture: TrafficPicture, seconds: float, rng: np.random.Generator) -> TrafficPicture:
    """The picture's traffic drawn again until it spans `seconds`: its arrivals (a conversation, all the turns of a
    prefix group at their own offsets, is one) drawn with replacement, the gaps between them drawn from its own
    gaps. A short stretch repeated (`tiled`) repeats its luck, the few close arrivals it happened to hold or lack;
    drawn again, the same rate and mix meet in the coincidences a longer stretch of them holds. Each drawn
    conversation is its own, so none reuses another's cached prefixes."""
    span = picture.window_seconds
    if not span > 0 or seconds <= span or len(picture.requests) < 2:
        return tiled(picture, seconds)
    units: dict[str | int, list[int]] = {}
    for index, request in enumerate(picture.requests):
        units.setdefault(request.prefix_group if request.prefix_group is not None else index, []).append(index)
    members = sorted(units.values(), key=lambda unit: picture.requests[unit[0]].time)
    starts = np.asarray([picture.requests[unit[0]].time for unit in members])
    gaps = np.diff(starts)
    if len(gaps) == 0 or not gaps.sum() > 0:
        return tiled(picture, seconds)
    # the gaps cover the span but its edges: drawn so, the rate over `seconds` is the picture's
    gaps = gaps * (span / len(members)) / gaps.mean()
    fixed_outputs = set(picture.fixed_outputs)
    requests: list[RequestSpec] = []
    fixed: list[int] = []
    start = float(rng.choice(gaps)) * float(rng.random())
    drawn = 0
    while start < seconds:
        unit = members[int(rng.integers(0, len(members)))]
        first = picture.requests[unit[0]].time
        for index in unit:
            request = picture.requests[index]
            at = start + request.time - first
            if at >= seconds:
                continue
            if index in fixed_outputs:
                fixed.append(len(requests))
            group = None if request.prefix_group is None else f"{request.prefix_group}#{drawn}"
            requests.append(replace(request, time=at, prefix_group=group))
        drawn += 1
        start += float(rng.choice(gaps))
    order = sorted(range(len(requests)), key=lambda k: requests[k].time)
    position = {old: new for new, old in enumerate(order)}
    return replace(picture, requests=[requests[k] for k in order], window_seconds=seconds,
                   fixed_outputs=tuple(sorted(position[k] for k in fixed)))


def _bucket_means(lowers: np.ndarray, uppers: np.ndarray, exponent: float) -> np.ndarray:
    """The mean of each bucket [lower, upper] under a density proportional to x**exponent inside it."""
    ratio = lowers / uppers
    power = exponent + 1.0
    if abs(power) < 1e-9:  # log-uniform
        spans = np.log(uppers / lowers)
        return np.where(spans > 0, (uppers - lowers) / np.where(spans > 0, spans, 1.0), lowers)
    if abs(power + 1.0) < 1e-9:
        spans = np.log(uppers / lowers)
        return np.where(spans > 0, spans * lowers / np.where(spans > 0, 1.0 - ratio, 1.0), lowers)
    below = 1.0 - ratio ** power
    above = 1.0 - ratio ** (power + 1.0)
    inside = np.abs(below) > 1e-12
    return np.where(inside, uppers * power / (power + 1.0) * above / np.where(inside, below, 1.0), lowers)


def _sample_lengths(rng: np.random.Generator, bounds: Sequence[float], counts: Sequence[float], total: float,
                    n: int) -> np.ndarray:
    """n lengths drawn from a histogram's buckets, inside each bucket from a density proportional to x**a, the one
    exponent a for every bucket whose mean over the buckets' counts is the exact mean (`total` over the count):
    each draw stays in the bucket it was drawn from, and where inside their buckets the traffic sits follows the
    sum. An exact mean the buckets cannot hold (beyond an open top bucket's assumed doubling) scales the draws.
    Not the draw held to the exact mean: n draws of a heavy tail hold its longest few or miss them, and a draw
    held to the mean either way loses the tail and lifts the rest (heavy-tailed answers, 18 a scrape: median 1866
    against 1492, 99th percentile 11771 against 15366)."""
    counts_array = np.asarray(counts, dtype=float)
    if n <= 0 or counts_array.sum() <= 0:
        return np.zeros(0)
    lowers = np.concatenate([[1.0], np.asarray(bounds[:-1], dtype=float)])
    uppers = np.asarray(bounds, dtype=float).copy()
    infinite = ~np.isfinite(uppers)
    uppers[infinite] = np.maximum(lowers[infinite], 1.0) * 2.0
    lowers = np.maximum(lowers, 1.0)
    uppers = np.maximum(uppers, lowers)
    mean = total / counts_array.sum() if total > 0 else 0.0
    weights = counts_array / counts_array.sum()

    def buckets_mean(exponent: float) -> float:
        return float(np.dot(weights, _bucket_means(lowers, uppers, exponent)))

    low, high = -BUCKET_EXPONENT_LIMIT, BUCKET_EXPONENT_LIMIT
    if not mean > 0:
        exponent = -1.0  # no sum: log-uniform
    elif mean <= buckets_mean(low):
        exponent = low
    elif mean >= buckets_mean(high):
        exponent = high
    else:
        for _ in range(BUCKET_EXPONENT_BISECTIONS):
            middle = (low + high) / 2.0
            low, high = (middle, high) if buckets_mean(middle) < mean else (low, middle)
        exponent = (low + high) / 2.0
    picks = rng.choice(len(counts_array), size=n, p=weights)
    lower, upper, u = lowers[picks], uppers[picks], rng.random(n)
    power = exponent + 1.0
    if abs(power) < 1e-9:
        values = lower * (upper / lower) ** u
    else:
        ratio = (lower / upper) ** power
        values = upper * (ratio + u * (1.0 - ratio)) ** (1.0 / power)
    expected = buckets_mean(exponent)
    if mean > 0 and expected > 0:
        values = values * (mean / expected)  # ~1 once bisected; the mean itself where no exponent reaches it
    return np.maximum(1.0, np.round(values))


def _window_prompts(bins: Sequence[TrafficBin], rng: np.random.Generator) -> np.ndarray | None:
    """SPLIT_POOL prompt lengths drawn from the bins' prompt histograms pooled (`_pooled_lengths`), or None when
    they counted no finished request."""
    pooled = _pooled_lengths(bins)
    if pooled is None:
        return None
    drawn = _sample_lengths(rng, pooled.prompt_bounds, pooled.prompt_counts, pooled.prompt_sum, SPLIT_POOL)
    return drawn if len(drawn) else None


def _pooled_lengths(bins: Sequence[TrafficBin]) -> TrafficBin | None:
    """One bin holding the summed token histograms of `bins` (those of the most common bucket layout)."""
    usable = [b for b in bins if b.prompt_bounds and b.generation_bounds]
    if not usable:
        return None
    layout = max({(b.prompt_bounds, b.generation_bounds) for b in usable},
                 key=lambda key: sum((b.prompt_bounds, b.generation_bounds) == key for b in usable))
    same = [b for b in usable if (b.prompt_bounds, b.generation_bounds) == layout]
    return TrafficBin(
        start=same[0].start, end=same[-1].end, arrivals=0.0, in_system_at_start=0.0,
        prompt_bounds=layout[0], prompt_counts=array("d", np.sum([b.prompt_counts for b in same], axis=0)),
        prompt_sum=sum(b.prompt_sum for b in same), generation_bounds=layout[1],
        generation_counts=array("d", np.sum([b.generation_counts for b in same], axis=0)),
        generation_sum=sum(b.generation_sum for b in same),
    )


class AdmittedPrompt(NamedTuple):
    tokens: int  # the prompt: new and cached tokens
    cached: int
    batch: int  # the index of the batch that admitted it (its first chunk)


def _split_batch(new_tokens: int, open_so_far: int | None, whole: int, cut: bool, drawn: np.ndarray | None,
                 rng: np.random.Generator | None) -> tuple[int | None, list[int], int | None]:
    """A batch's new tokens split between what shares it: the next piece of a prompt continued from the previous
    batch (`open_so_far` of its tokens came before), `whole` prompts admitted complete, and the first piece of a
    prompt the batch's chunk cuts (`cut`). Returns (continued piece, whole prompts, cut piece).

    Without `drawn` (prompts drawn from the window's prompt histogram) evenly. With it, a draw from that histogram
    given what the line shows, by rejection: whole prompts are drawn from it, a continued prompt's length from it
    above what it already had; of SPLIT_DRAWS candidates, the one whose tokens come nearest the batch's (then
    scaled to them), or, where a cut piece takes the rest, the first that leaves it a token. A batch of a
    document's last chunk and two chat turns is then one long and two short prompts, not three alike."""
    count = whole + (open_so_far is not None) + cut
    even = int(round(new_tokens / count))  # all of them for a batch of one
    fallback = (even if open_so_far is not None else None), [even] * whole, (even if cut else None)
    if count == 1 or drawn is None or rng is None or len(drawn) == 0:
        return fallback
    totals = np.zeros(SPLIT_DRAWS)
    continued = None
    if open_so_far is not None:
        longer = drawn[drawn > open_so_far]
        if not len(longer):
            return fallback
        continued = longer[rng.integers(0, len(longer), SPLIT_DRAWS)] - open_so_far
        totals += continued
    candidates = drawn[rng.integers(0, len(drawn), size=(SPLIT_DRAWS, whole))]
    totals += candidates.sum(axis=1)
    if cut:
        fits = np.flatnonzero(totals <= new_tokens - 1)
        if not len(fits):
            return fallback
        pick = int(fits[0])
        scale = 1.0
    else:
        pick = int(np.argmin(np.abs(np.log(totals / max(new_tokens, 1)))))
        scale = new_tokens / totals[pick]
    piece = int(max(1, round(continued[pick] * scale))) if continued is not None else None
    taken = [int(max(1, round(v * scale))) for v in candidates[pick]]
    rest = new_tokens - (piece or 0) - sum(taken)
    if cut:
        return piece, taken, rest
    # rounding: the largest share takes the odd tokens, so the batch's tokens add up
    if piece is not None and (not taken or piece >= max(taken)):
        piece = max(1, piece + rest)
    elif taken:
        largest = int(np.argmax(taken))
        taken[largest] = max(1, taken[largest] + rest)
    return piece, taken, None


def admitted_prompts(batches: Sequence[Sequence[int]], chunk_tokens: int | None, page_size: int = 1,
                     drawn: np.ndarray | None = None, rng: np.random.Generator | None = None,
                     ) -> list[AdmittedPrompt]:
    """The requests a run of `Prefill batch` lines admitted, in admission order, with their prompt and cached tokens.
    SGLang's default fcfs policy admits in arrival order, so this is the arrivals' prompt sequence, with the
    lengths placed at the time they came (a histogram of finished requests places a long prompt when it ends).

    A line counts the requests of its batch (`#new-seq`, len(can_run_list)), their new and cached tokens. A
    prompt longer than the chunk is cut at the chunk (page-aligned) and continues first in the next batch, where
    it counts again: a batch that reached the chunk leaves its last request open. Tokens of a batch of several
    requests are split between them as `_split_batch` says: by a draw from `drawn` (the window's prompts) where
    given with `rng` and the batch has no cached tokens, else evenly (the lines do not say more); cached tokens
    go to the new requests only (a continuing request matched its prefix when it first came). A batch's optional
    fourth value is the DP rank that printed it: each DP worker schedules, and continues its chunks, on its own."""
    out: list[AdmittedPrompt] = []
    # per DP rank: [tokens so far, cached, first batch] of a request cut at the chunk
    open_prompts: dict[int, list[int]] = {}
    threshold = chunk_tokens - max(1, page_size) + 1 if chunk_tokens and chunk_tokens > 0 else None
    for position, batch in enumerate(batches):
        seqs, new_tokens, cached = (max(0, int(v)) for v in batch[:3])
        rank = int(batch[3]) if len(batch) > 3 else -1
        if seqs <= 0:
            continue
        cut = threshold is not None and new_tokens >= threshold
        open_prompt = open_prompts.pop(rank, None)
        fresh = seqs - (open_prompt is not None)
        if open_prompt is not None and fresh == 0:
            open_prompt[0] += new_tokens
            if cut:
                open_prompts[rank] = open_prompt
                continue  # still open: the whole batch was its next chunk
            out.append(AdmittedPrompt(open_prompt[0] + open_prompt[1], open_prompt[1], open_prompt[2]))
            continue
        piece, whole_tokens, cut_piece = _split_batch(
            new_tokens, None if open_prompt is None else open_prompt[0] + open_prompt[1], fresh - cut, cut,
            drawn if cached == 0 else None, rng)
        if open_prompt is not None:
            open_prompt[0] += piece or 0
            out.append(AdmittedPrompt(open_prompt[0] + open_prompt[1], open_prompt[1], open_prompt[2]))
        cached_share = cached // fresh
        for taken in whole_tokens:
            out.append(AdmittedPrompt(max(1, taken + cached_share), cached_share, position))
        if cut_piece is not None:
            open_prompts[rank] = [cut_piece, cached_share, position]
    for open_prompt in open_prompts.values():
        out.append(AdmittedPrompt(open_prompt[0] + open_prompt[1], open_prompt[1], open_prompt[2]))
    return out


# How far `_tilted_draws` may tilt toward either end: the weights go as (length / geometric mean) ** exponent.
TILT_EXPONENT_MAX = 12.0


def _tilted_draws(lengths: Sequence[int], count: int, mean: float | None, rng: np.random.Generator) -> np.ndarray:
    """`count` indices into `lengths` drawn with replacement: uniformly without a `mean`, else with weights
    exponentially tilted in log length (length ** exponent, the exponent found by bisection) so that the drawn
    lengths' expected mean is `mean` (the nearest end's where it lies beyond the lengths). The tilt keeps the pool's
    shape as far as the mean allows: a mean between two modes moves weight from one to the other."""
    if mean is None or count <= 0 or len(lengths) < 2:
        return rng.integers(0, len(lengths), count)
    values = np.asarray(lengths, dtype=float)
    logs = np.log(np.maximum(values, 1.0))
    logs -= logs.mean()

    def weights(exponent: float) -> np.ndarray:
        raw = np.exp(exponent * logs - np.max(exponent * logs))
        return raw / raw.sum()

    low, high = -TILT_EXPONENT_MAX, TILT_EXPONENT_MAX
    for _ in range(48):
        middle = (low + high) / 2
        if float(weights(middle) @ values) < mean:
            low = middle
        else:
            high = middle
    return rng.choice(len(values), size=count, p=weights((low + high) / 2))


def _paired_outputs(requests: list[RequestSpec], paired: Sequence[int], residence: np.ndarray,
                    buckets: np.ndarray) -> list[RequestSpec]:
    """The drawn output lengths of the `paired` requests rescaled by their prompt bucket's mean residence over
    the mean of all (a bucket whose requests stay twice as long decodes about twice as many tokens): the pairing
    of output with prompt the server showed, the outputs' mean the histograms'. A bucket with too few finished
    requests to say keeps the drawn lengths."""
    stays = np.asarray(residence, dtype=float)
    bucket_of = np.asarray(buckets)
    means = {}
    for bucket in np.unique(bucket_of):
        finished = stays[(bucket_of == bucket) & np.isfinite(stays)]
        if len(finished) >= MIN_BUCKET_FINISHES:
            means[int(bucket)] = float(finished.mean())
    if len(means) < 2:
        return requests
    factor = np.asarray([means.get(int(bucket), math.nan) for bucket in bucket_of])
    rescaled = np.isfinite(factor)
    overall = float(np.mean(factor[rescaled]))
    if not overall > 0:
        return requests
    factor = np.where(rescaled, factor / overall, 1.0)
    out = list(requests)
    for position, index in enumerate(paired):
        spec = out[index]
        out[index] = replace(spec, output_tokens=max(1, int(round(spec.output_tokens * factor[position]))))
    return out


def conversations_from_hits(requests: list[RequestSpec], cached: Sequence[int]) -> list[RequestSpec]:
    """Radix reuse for a picture that knows each request's prompt and matched prefix (`cached`, from the prefill
    lines) but not which earlier request it continues. A turn's matched prefix is its conversation's previous
    turn whole (prompt + output), so an earlier request not yet continued whose prompt lies below the match by
    a likely output (`_linked_turns`) is taken as the previous turn, and its output is what closes the gap;
    `prefix_groups` then makes the conversations. Any other match stays a shared prefix."""
    linked, _ = _linked_turns(requests, cached)
    return _with_prefix_groups(linked, cached)


def _linked_turns(requests: list[RequestSpec], cached: Sequence[int]) -> tuple[list[RequestSpec], set[int]]:
    """The requests with each continued turn's output closing the gap to its continuation's matched prefix (see
    `conversations_from_hits`), and the indices of those continued turns.

    The previous turn is the earlier request, not yet continued, whose prompt lies below the match by a length
    the outputs make likely and which came recently: among the candidates (prompts within the longest output
    below the match) the one with the highest log-likelihood of its gap under the drawn outputs' log-normal fit,
    less its age over TURN_GAP_SECONDS. The nearest prompt below the match alone would pick the last turns of
    sessions long over, whose prompts pile up over the window, and read their short gaps as outputs."""
    out = list(requests)
    continued: set[int] = set()
    if not any(c > 0 for c in cached):
        return out, continued
    log_outputs = np.log(np.maximum(1.0, np.asarray([r.output_tokens for r in requests], dtype=float)))
    centre, spread = float(log_outputs.mean()), max(float(log_outputs.std()), 0.1)
    open_prompts: list[tuple[int, int]] = []  # (prompt tokens, index) of turns not yet continued, sorted
    # a turn's output is at most what the histograms drew, or SGLang's clipped max_new_tokens estimate
    longest_output = max(max((r.output_tokens for r in requests), default=1), TURN_OUTPUT_CAP)
    for index, spec in enumerate(out):
        hit = cached[index]
        if hit > 0:
            low = bisect.bisect_left(open_prompts, (hit - longest_output + 1, -1))
            high = bisect.bisect_left(open_prompts, (hit, -1))
            if high > low:
                candidates = open_prompts[low:high]
                gaps = np.log(np.asarray([hit - prompt + 1 for prompt, _ in candidates], dtype=float))
                ages = np.asarray([spec.time - out[parent].time for _, parent in candidates], dtype=float)
                score = -0.5 * ((gaps - centre) / spread) ** 2 - gaps - ages / TURN_GAP_SECONDS
                prompt, parent = open_prompts.pop(low + int(np.argmax(score)))
                out[parent] = replace(out[parent], output_tokens=max(1, hit - prompt + 1))
                continued.add(parent)
        bisect.insort(open_prompts, (spec.input_tokens, index))
    return out, continued


def _with_prefix_groups(requests: list[RequestSpec], cached: Sequence[int]) -> list[RequestSpec]:
    if not any(c > 0 for c in cached):
        return requests
    records = [ExactRequest(arrival=r.time, input_tokens=r.input_tokens, output_tokens=r.output_tokens,
                            cached_tokens=min(c, max(0, r.input_tokens - 1)))
               for r, c in zip(requests, cached, strict=True)]
    return prefix_groups(records, requests)


def prefix_groups(records: Sequence[ExactRequest], requests: Sequence[RequestSpec]) -> list[RequestSpec]:
    """The radix reuse the records show, as the scheduler model's prefix groups (`records` and `requests` alike,
    by arrival). A request whose matched prefix (`cached_tokens`) is the whole sequence of a request that
    finished before it arrived (input + output, less the last sampled token, page-rounded down) is that
    conversation's next turn: it joins the earlier one's group, which leaves its sequence cached when it
    finishes (SGLang's cache_finished_req). Any other matched prefix is a fixed shared one (a system prompt):
    the requests matching the same length share it, unless the sequence matched is an earlier turn of a
    conversation a later turn already continued: the cache lost what came since, or the previous turn still
    ran (`_latest_turn`). Turns the server's cache missed are found as well (`_missed_turns`). The model then
    re-decides, at each candidate ratio, what stays cached and what is evicted; records without cached counts
    replay without reuse."""
    if not any(r.cached_tokens > 0 for r in records):
        return list(requests)
    parent: list[int | None] = [None] * len(records)
    shared: list[int] = [0] * len(records)
    open_totals: list[tuple[int, float, int]] = []  # (sequence length, finish, index) of unclaimed turns
    claimed_totals: list[tuple[int, float, int]] = []  # ... of finished turns a later turn continued
    claimed: set[int] = set()
    conversation = list(range(len(records)))  # a turn's conversation: its first turn's index
    turns: dict[int, list[int]] = {}  # conversation -> its turns so far, by arrival

    def entry(k: int) -> tuple[int, float, int]:
        return records[k].input_tokens + records[k].output_tokens, _finish_of(records[k]), k

    def claim(k: int, j: int) -> None:
        if _finish_of(records[k]) <= records[j].arrival:  # finished: from the open turns to the continued ones
            del open_totals[bisect.bisect_left(open_totals, entry(k))]
            bisect.insort(claimed_totals, entry(k))
        claimed.add(k)
        parent[j], conversation[j] = k, conversation[k]

    for j, record, finished in _finishing_before(records):
        for k in finished:
            bisect.insort(claimed_totals if k in claimed else open_totals, entry(k))
        cached = record.cached_tokens
        if cached > 0:
            # the previous turn: its sequence (minus the last token) rounded down to a page is what matched
            # (the closest such sequence; of equal ones, the turn that finished last). A turn a later one already
            # continued matches too where the cache lost what came since, or the turn after it still ran: under
            # a server behind its clients' schedule a third of the matches (176 of 555 in a research-agent
            # timeline) are an earlier turn's sequence, exactly, while another conversation's unclaimed turn lies
            # within the slack above; the closer sequence is the one that matched.
            bounds = ((cached + 1, -math.inf, -1), (cached + max(PREFIX_MATCH_SLACK, cached // 50), math.inf, 1 << 62))
            match = _closest(open_totals, *bounds)
            earlier = _closest(claimed_totals, *bounds)
            if match is not None and earlier is not None and earlier[0] < match[0]:
                match = None
            if match is not None and match[0] - 1 < record.input_tokens:
                claim(match[2], j)
            elif earlier is not None and (tip := _latest_turn(records, turns[conversation[earlier[2]]], claimed,
                                                              record.input_tokens)) is not None:
                claim(tip, j)
            else:
                shared[j] = cached
        turns.setdefault(conversation[j], []).append(j)
    _missed_turns(records, parent)
    group: list[str | None] = [None] * len(records)
    prefix = [0] * len(records)
    extends = [False] * len(records)
    for j in range(len(records)):  # by arrival: a turn's previous turn is named before it
        previous = parent[j]
        if previous is not None:
            if group[previous] is None:
                group[previous], extends[previous] = f"turns-{previous}", True
            # a turn after a shared prompt opens its own conversation
            group[j] = group[previous] if extends[previous] else f"turns-{previous}"
            prefix[j], extends[j] = _sequence(records[previous]), True
        elif shared[j]:
            group[j], prefix[j] = f"shared-{shared[j]}", shared[j]
    return [
        RequestSpec(spec.time, spec.input_tokens, spec.output_tokens, spec.max_new_tokens, group[k],
                    min(prefix[k], spec.input_tokens - 1), extends_prefix=extends[k])
        if group[k] is not None else spec
        for k, spec in enumerate(requests)
    ]


# The matched turns a window must show before its unmatched requests are read as turns the cache missed.
MISSED_TURNS_MIN_MATCHED = 20
# The share of the matched turns' new tokens and of their gaps (previous finish to arrival) a missed turn's must
# lie within.
MISSED_TURNS_QUANTILE = 0.95
# The matched turns that came while their previous turn still ran a window must show before a request that matched
# nothing is linked to a request still running at its arrival.
RUNNING_TURNS_MIN_MATCHED = 10


def _missed_turns(records: Sequence[ExactRequest], parent: list[int | None]) -> None:
    """Links, in `parent`, the conversation turns the server's radix cache missed. On a hybrid model a cached
    prefix holds a recurrent state, and SGLang evicts those states when the running requests need the slots
    (mem_cache/mamba_radix_cache.py), so under a tight state pool many next turns match nothing: read as requests
    of their own, a replay at a ratio with slots to spare would prefill them whole, and credit more slots with
    clearing a queue the reuse never builds. Where the window shows a conversation pattern (at least
    MISSED_TURNS_MIN_MATCHED matched turns), a request that matched nothing and whose prompt is an earlier
    finished, unclaimed request's sequence plus new tokens as many as the matched turns' add, after a gap as
    long as the matched turns that came after theirs finished show (both within their MISSED_TURNS_QUANTILE), is
    that request's next turn: of the candidates, the likeliest under log-normal fits of the new tokens and gaps.
    A request may also follow a turn that still ran when it arrived: a timeline replayed to the server sends each
    turn on the clients' schedule, so where the server runs behind it, the next turn arrives before its previous
    one's sequence is cached and matches nothing (a research-agent timeline at 0.9 on TP2: 134 of 738 continued
    turns). A replay at a ratio that keeps up serves those turns from the cache, so they are linked too, to an
    unclaimed earlier request still running at their arrival, after as long since its arrival as the matched
    turns that came while theirs ran show (at least RUNNING_TURNS_MIN_MATCHED of them; within their
    MISSED_TURNS_QUANTILE), scored the same way on that span. Records without finish times (lines, not request
    logs) are left as they are, and the copies standing for requests the server still holds (no known finish)
    are no one's earlier turn; their arrivals are placed over the window's last span, not seen, so such a copy is
    scored on its new tokens alone, whatever its gap (agentic sessions on a dense hybrid queued at 0.9 held 1,066
    at the last scrape, copies of late turns of ~20K tokens: gapped, 370 continued a conversation and the window's
    replay prefilled 23.3M tokens, 14.8M of them the copies'; scored so, 840 and 14.1M, 5.6M)."""
    matched = [(j, k) for j, k in enumerate(parent) if k is not None]
    if len(matched) < MISSED_TURNS_MIN_MATCHED or any(r.finish is None for r in records):
        return
    new_tokens = np.asarray([max(1, records[j].input_tokens - _sequence(records[k])) for j, k in matched], dtype=float)
    most_added = int(math.ceil(np.quantile(new_tokens, MISSED_TURNS_QUANTILE)))
    added = _LogNormal.of(np.log(new_tokens))
    # A finished turn is scored on its gap (finish to arrival), as the matched turns that came after their previous
    # one finished show it; one still running on its span (arrival to arrival), as the matched turns that came while
    # theirs ran show it, and only where at least RUNNING_TURNS_MIN_MATCHED did: a server that keeps up with its
    # clients (support sessions on TP8: none of 491) shows none, and a running request is no earlier turn there.
    def arrived_after(j: int, k: int) -> bool:
        return _finish_of(records[k]) <= records[j].arrival

    def fit(values: list[float]) -> _LogNormal:
        array = np.maximum(1e-3, np.asarray(values, dtype=float))
        return _LogNormal.of(np.log(array), float(np.quantile(array, MISSED_TURNS_QUANTILE)))

    gaps = [records[j].arrival - _finish_of(records[k]) for j, k in matched if arrived_after(j, k)]
    spans = [records[j].arrival - records[k].arrival for j, k in matched if not arrived_after(j, k)]
    after_finish = fit(gaps) if gaps else None
    after_arrival = fit(spans) if len(spans) >= RUNNING_TURNS_MIN_MATCHED else None
    claimed = {k for k in parent if k is not None}
    open_totals: list[tuple[int, int]] = []  # (sequence length, index) of finished turns no later turn claims
    running: list[tuple[int, int]] = []  # ... of requests still running, no later turn claims
    for j, record, finished in _finishing_before(records):
        for k in finished:
            if k not in claimed:
                entry = (_sequence(records[k]), k)
                at = bisect.bisect_left(running, entry)
                if at < len(running) and running[at] == entry:
                    running.pop(at)
                bisect.insort(open_totals, entry)
        if parent[j] is None and record.cached_tokens == 0:
            held = _finish_of(record) == math.inf  # a copy standing for a request the server holds
            best: tuple[float, list[tuple[int, int]], int] | None = None  # (score, candidates list, position)
            for candidates, since, elapsed_fit in ((open_totals, lambda k: _finish_of(records[k]), after_finish),
                                                   (running, lambda k: records[k].arrival, after_arrival)):
                if elapsed_fit is None:
                    continue
                low = bisect.bisect_left(candidates, (record.input_tokens - most_added, -1))
                high = bisect.bisect_left(candidates, (record.input_tokens, -1))
                for m in range(low, high):
                    total, k = candidates[m]
                    if held:  # its arrival is placed, not seen: only its new tokens say whose turn it is
                        score = added.log_density(record.input_tokens - total)
                    else:
                        elapsed = record.arrival - since(k)
                        if elapsed > elapsed_fit.most:
                            continue
                        score = added.log_density(record.input_tokens - total) + elapsed_fit.log_density(elapsed)
                    if best is None or score > best[0]:
                        best = (score, candidates, m)
            if best is not None:
                chosen = best[1].pop(best[2])[1]
                parent[j] = chosen
                claimed.add(chosen)
        if j not in claimed and record.arrival < _finish_of(record) < math.inf:  # (one that took no time is finished)
            bisect.insort(running, (_sequence(record), j))


@dataclass(frozen=True)
class _LogNormal:
    """A log-normal fit of positive values (from their logs): the log density, in log space, of a value, and the
    most a candidate's value may be."""

    centre: float
    spread: float
    most: float = math.inf

    @classmethod
    def of(cls, logs: np.ndarray, most: float = math.inf) -> _LogNormal:
        return cls(float(logs.mean()), max(float(logs.std()), 0.1), most)

    def log_density(self, value: float) -> float:
        log_value = math.log(max(1e-3, value))
        return -0.5 * ((log_value - self.centre) / self.spread) ** 2 - log_value


def _finishing_before(records: Sequence[ExactRequest]) -> Iterator[tuple[int, ExactRequest, list[int]]]:
    """Each record by arrival, with the indices of the records that finished since the previous one arrived (by
    its own arrival, in finishing order)."""
    finishing = sorted(range(len(records)), key=lambda k: _finish_of(records[k]))
    released = 0
    for j, record in enumerate(records):
        start = released
        while released < len(finishing) and _finish_of(records[finishing[released]]) <= record.arrival:
            released += 1
        yield j, record, finishing[start:released]


def _latest_turn(records: Sequence[ExactRequest], turns: Sequence[int], claimed: set[int],
                 prompt: int) -> int | None:
    """A conversation's latest turn no later turn continued whose sequence a prompt of `prompt` tokens can hold,
    finished or not: the previous turn of a request that matched an earlier turn of that conversation, the cache
    having lost (evicted, or not yet inserted: the turn still runs) the sequences since."""
    for k in reversed(turns):
        if k not in claimed and _sequence(records[k]) < prompt:
            return k
    return None


def _closest(totals: list[tuple[int, float, int]], low: tuple[int, float, int],
             high: tuple[int, float, int]) -> tuple[int, float, int] | None:
    """Of the sorted (sequence length, finish, index) entries between `low` and `high`, the shortest sequence's
    (of equal ones, the latest finish); None when there is none."""
    start, stop = bisect.bisect_left(totals, low), bisect.bisect_right(totals, high)
    if start >= stop:
        return None
    shortest = totals[start][0]
    return max((entry for entry in totals[start:stop] if entry[0] == shortest), key=lambda entry: entry[1])


def _sequence(record: ExactRequest) -> int:
    """A finished request's sequence less its last sampled token: what its next turn's cached prefix matches."""
    return record.input_tokens + record.output_tokens - 1


def _finish_of(record: ExactRequest) -> float:
    return record.arrival if record.finish is None else record.finish


def _output_rate(records: Sequence[ExactRequest]) -> float | None:
    """The median output tokens a finished request made per second of its stay (arrival to finish, its wait
    included): what a held request has generated at least, per second since its admission."""
    rates = [r.output_tokens / (r.finish - r.arrival) for r in records
             if r.finish is not None and r.finish > r.arrival and r.output_tokens >= TAIL_RATE_MIN_OUTPUT]
    return float(np.median(rates)) if rates else None


def _running_like(pool: Sequence[ExactRequest], near: Sequence[int], so_far: float | None,
                  rng: np.random.Generator) -> ExactRequest:
    """The known request whose output and cap a held running request takes: one of the near prompts (indices
    into `pool`) that runs longer than the `so_far` tokens it has made, else one of the pool's, else the longest
    near one run on by the pool's median; undated (`so_far` None), a near one drawn in proportion to its output."""
    if so_far is None:
        weights = np.asarray([pool[k].output_tokens for k in near], dtype=float)
        return pool[near[int(rng.choice(len(near), p=weights / weights.sum()))]]
    for candidates in (near, range(len(pool))):
        longer = [k for k in candidates if pool[k].output_tokens > so_far]
        if longer:
            return pool[longer[int(rng.integers(0, len(longer)))]]
    longest = max((pool[k] for k in near), key=lambda r: r.output_tokens)
    return replace(longest, output_tokens=int(so_far) + int(np.median([r.output_tokens for r in pool])))


def _live_batch(seq_tokens: float | None, running: float | None) -> dict[str, float]:
    if (seq_tokens is None or running is None or not math.isfinite(seq_tokens) or not math.isfinite(running)
            or running <= 0 or seq_tokens < running):
        return {}
    return {"live_seq_tokens": float(seq_tokens), "live_running": float(running)}


def queue_share_over(bounds: Sequence[float], counts: Sequence[float], seconds: float) -> float | None:
    """The share of the requests in a queue-time histogram (bucket upper bounds, per-bucket counts) that waited
    longer than `seconds`, linear within the bucket that holds it; None for an empty histogram."""
    total = float(sum(counts))
    if not total > 0:
        return None
    within, lower = 0.0, 0.0
    for upper, count in zip(bounds, counts, strict=True):
        if upper <= seconds:
            within += count
        elif lower < seconds and math.isfinite(upper):
            within += count * (seconds - lower) / (upper - lower)
            break
        else:
            break
        lower = upper
    return max(0.0, 1.0 - within / total)


def _queue_times(bins: Sequence[TrafficBin], start: float) -> tuple[QueueHistogram | None, QueueSeries | None]:
    """The window's queue-time histogram, and the same per bin: the layout most bins that showed one share (SGLang's,
    being labelled, appears with its first observation), each such bin's counts with its span from `start`, and
    their sum; (None, None) when no bin showed one."""
    shown = [b for b in bins if b.queue_bounds and sum(b.queue_counts) > 0]
    if not shown:
        return None, None
    layout = Counter(b.queue_bounds for b in shown).most_common(1)[0][0]
    series = tuple((b.start - start, b.end - start, tuple(float(c) for c in b.queue_counts))
                   for b in bins if b.queue_bounds == layout)
    pooled = tuple(float(c) for c in np.sum([counts for _, _, counts in series], axis=0))
    return (layout, pooled), series


def _mean_live_batch(bins: Sequence[TrafficBin]) -> tuple[float, float] | None:
    """The running batch's mean sequence length and mean running requests over the bins that showed one (busy),
    weighted by their length; None under MIN_LIVE_SAMPLES busy bins (a handful of gauge readings says too little
    to pair by)."""
    busy = [b for b in bins if b.live_running > 0]
    seconds = sum(b.end - b.start for b in busy)
    if len(busy) < MIN_LIVE_SAMPLES or seconds <= 0:
        return None
    length = sum((b.end - b.start) * b.live_seq_tokens / b.live_running for b in busy) / seconds
    return length, sum((b.end - b.start) * b.live_running for b in busy) / seconds


def live_context(requests: Sequence[RequestSpec]) -> float | None:
    """The mean sequence length of the running decode batch these requests would make, step-weighted: a request
    decodes in `output_tokens` steps (fewer with speculative decoding, but its share stays) at lengths prompt,
    prompt + 1, ..., so over all steps the batch's mean length is sum(o * (p + o / 2)) / sum(o). Who shares the
    batch does not matter; which prompt carries which output does: long outputs on long prompts hold long
    sequences for long."""
    lengths, steps = _batch_sums(np.asarray([r.input_tokens for r in requests], dtype=float),
                                 np.asarray([r.output_tokens for r in requests], dtype=float))
    return lengths / steps if steps > 0 else None


def _batch_sums(prompts: np.ndarray, outputs: np.ndarray) -> tuple[float, float]:
    """(sum over decode steps of the sequence length, the steps): sum(o * (p + o / 2)) and sum(o)."""
    return float((outputs * (prompts + outputs / 2)).sum()), float(outputs.sum())


def _normal_log_density(values: np.ndarray, mean: float, sd: float) -> np.ndarray:
    return -0.5 * ((values - mean) / sd) ** 2 - math.log(sd * math.sqrt(2.0 * math.pi))


def _kind_posterior(values: np.ndarray, weights: np.ndarray, means: np.ndarray, sds: np.ndarray,
                    ) -> tuple[np.ndarray, float]:
    """(each value's probability of being of each of the two kinds, the mixture's log-likelihood of the values)."""
    joint = np.stack([np.log(weights[k]) + _normal_log_density(values, means[k], sds[k]) for k in range(2)])
    top = joint.max(axis=0)
    total = top + np.log(np.exp(joint - top).sum(axis=0))
    return np.exp(joint - total), float(total.sum())


def _two_kinds(log_prompts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(weights, means, sds) of the best two-normal fit in log tokens, when it beats one normal by more than
    MIXTURE_EVIDENCE nats per log n; else None. Fitted on at most MIXTURE_FIT_POINTS evenly spaced quantiles."""
    n = len(log_prompts)
    sample = log_prompts if n <= MIXTURE_FIT_POINTS else np.quantile(
        log_prompts, (np.arange(MIXTURE_FIT_POINTS) + 0.5) / MIXTURE_FIT_POINTS)
    points = len(sample)
    mean, sd = float(sample.mean()), float(sample.std())
    one = float(_normal_log_density(sample, mean, sd).sum())
    best: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None
    for quantile in MIXTURE_STARTS:
        split = float(np.quantile(sample, quantile))
        low, high = sample[sample <= split], sample[sample > split]
        if len(low) < 2 or len(high) < 2:
            continue
        weights = np.asarray([len(low) / points, len(high) / points])
        means = np.asarray([low.mean(), high.mean()])
        sds = np.maximum(np.asarray([low.std(), high.std()]), MIXTURE_MIN_SD)
        likelihood = -math.inf
        for _ in range(MIXTURE_ITERATIONS):
            previous = likelihood
            posterior, likelihood = _kind_posterior(sample, weights, means, sds)
            mass = posterior.sum(axis=1)
            if (mass < 1.0).any() or likelihood - previous < 1e-6 * points:
                break
            weights = mass / points
            means = (posterior * sample).sum(axis=1) / mass
            sds = np.maximum(np.sqrt((posterior * (sample - means[:, None]) ** 2).sum(axis=1) / mass), MIXTURE_MIN_SD)
        if (mass >= 1.0).all() and (best is None or likelihood > best[0]):
            best = (likelihood, weights, means, sds)
    if best is None or (best[0] - one) * n / points <= MIXTURE_EVIDENCE * math.log(n):
        return None
    return best[1], best[2], best[3]


def pairing_axis(log_prompts: np.ndarray) -> np.ndarray:
    """Each prompt's place on the axis outputs are paired along: its z-score in log tokens, or, where the
    prompts are a mixture of two kinds (chat and documents, say), the z-score of its kind's mean, weighed by how
    surely it is of that kind. Outputs follow the kind of request (its application), not a few tokens more of
    prompt: a linear axis would give every document the very longest outputs and the longest chats the longer
    ones, where a mixture's documents answer longer as a group and each kind's answers spread as they do.
    The mixture is a two-component normal fit in log tokens (EM from a few starts), kept where it explains the
    prompts better than one normal by more than MIXTURE_EVIDENCE nats per log n (a BIC-like margin)."""
    mean, sd = float(log_prompts.mean()), float(log_prompts.std())
    z = (log_prompts - mean) / sd
    kinds = _two_kinds(log_prompts) if len(log_prompts) >= MIXTURE_MIN_REQUESTS else None
    if kinds is None:
        return z
    weights, means, sds = kinds
    posterior, _ = _kind_posterior(log_prompts, weights, means, sds)
    return ((means[:, None] - mean) / sd * posterior).sum(axis=0)


def paired_to_live_context(requests: list[RequestSpec], target: float, rng: np.random.Generator,
                           keep: Collection[int] = (), tolerance: float = PAIRING_TOLERANCE) -> list[RequestSpec]:
    """The drawn outputs dealt out again over the prompts so that the replay's running batch holds the mean
    sequence length the server showed (`target`, its decode_sum_seq_lens over num_running_reqs). The histograms
    give the outputs' distribution but not which prompt each belongs to, and that pairing sets how much KV the
    running batch holds: a document with a long answer holds its long sequence for every step of the answer.
    Each request is weighed by log output + beta * (its prompt's place on `pairing_axis`) * sd(log output); the
    drawn outputs, sorted, go to the requests in the order of that weight, and beta (0 = the pairing as given,
    > 0 long prompts get long outputs, < 0 short ones) is the weakest whose batch length comes within
    `tolerance` of the target (or nearest it). A few long prompts carry much of the batch length, so it moves
    in steps a coarse grid of beta overshoots: between the two grid values that bracket the band, beta is
    bisected for the band's edge.
    The outputs' distribution stays exactly the histograms'. Requests in `keep` (turns whose output their
    continuation's matched prefix fixed) keep theirs and count towards the batch length as they are."""
    free = np.asarray([index for index in range(len(requests)) if index not in keep], dtype=int)
    if len(free) < 3 or not target > 0:
        return requests
    prompts = np.log(np.asarray([max(1, requests[index].input_tokens) for index in free], dtype=float))
    drawn = np.asarray([requests[index].output_tokens for index in free], dtype=float)
    log_outputs = np.log(np.maximum(drawn, 1.0))
    if prompts.std() <= 0 or log_outputs.std() <= 0:
        return requests
    kept = [requests[index] for index in range(len(requests)) if index in keep]
    kept_lengths, kept_steps = _batch_sums(np.asarray([r.input_tokens for r in kept], dtype=float),
                                           np.asarray([r.output_tokens for r in kept], dtype=float))
    propensity = pairing_axis(prompts) * log_outputs.std()
    ties = rng.random(len(free))  # breaks ties among equal weights without favouring arrival order
    ranked = np.sort(drawn)
    prompt_tokens = np.exp(prompts)

    def dealt_at(beta: float) -> tuple[np.ndarray, float]:
        dealt = np.empty_like(drawn)
        dealt[np.lexsort((ties, log_outputs + beta * propensity))] = ranked
        lengths, steps = _batch_sums(prompt_tokens, dealt)
        return dealt, (lengths + kept_lengths) / (steps + kept_steps)

    def miss(batch_length: float, beta: float) -> tuple[float, float]:
        """How far outside the tolerance band, then the weaker pairing."""
        return max(0.0, abs(batch_length - target) - tolerance * target), abs(beta)

    tried = [(float(beta), *dealt_at(float(beta))) for beta in np.linspace(-PAIRING_STRENGTH, PAIRING_STRENGTH,
                                                                          PAIRING_STEPS)]
    if min(miss(length, beta)[0] for beta, _, length in tried) > 0:
        low_edge, high_edge = target * (1.0 - tolerance), target * (1.0 + tolerance)
        for (beta_a, _, length_a), (beta_b, _, length_b) in itertools.pairwise(list(tried)):
            if max(length_a, length_b) < low_edge or min(length_a, length_b) > high_edge:
                continue  # the band is not between these two
            # from the end nearer the drawn pairing towards the other, for the first beta inside the band
            (outside, length_out), inside = ((beta_a, length_a), beta_b) if abs(beta_a) <= abs(beta_b) \
                else ((beta_b, length_b), beta_a)
            edge = low_edge if length_out < low_edge else high_edge
            for _ in range(PAIRING_BISECTIONS):
                middle = (outside + inside) / 2
                if (dealt_at(middle)[1] < edge) == (length_out < edge):
                    outside = middle
                else:
                    inside = middle
            tried.append((inside, *dealt_at(inside)))
    _, best_dealt, _ = min(tried, key=lambda t: miss(t[2], t[0]))
    out = list(requests)
    for index, tokens in zip(free, best_dealt, strict=True):
        if int(tokens) != out[index].output_tokens:
            out[index] = replace(out[index], output_tokens=max(1, int(tokens)))
    return out


class TrafficEstimator:
    def __init__(self, settings: TrafficSettings | None = None) -> None:
        self.settings = settings or TrafficSettings()
        self.bins: deque[TrafficBin] = deque()
        self.exact: deque[ExactRequest] = deque()
        self.newest_arrival: float | None = None
        self.last_in_system: float | None = None
        self.last_queued: float | None = None
        self.last_time: float | None = None
        # prefill batches read since the last interval (they join the next one), and how the server chunks
        self.pending_admissions: list[list[int]] = []
        # per DP rank, its latest `Prefill batch` line's queue: (#queue-req, #pending-token)
        self.waiting_by_rank: dict[int, tuple[int, int]] = {}
        self.chunk_tokens: int | None = None
        self.page_size = 1
        # (time, requests the server had taken in by then) at the first scrape of a server process: how long it had
        # been serving, so that the finishes of its first minutes, which cannot yet hold its long requests, are
        # known for what they are (`_mature_from`)
        self.served_at_baseline: tuple[float, float] | None = None

    # -- inputs ---------------------------------------------------------------------------------------

    def observe_interval(
        self, now: float, seconds: float, *, finished: float, in_system: float,
        prompt_bounds: Sequence[float] = (), prompt_counts: Sequence[float] = (), prompt_sum: float = 0.0,
        generation_bounds: Sequence[float] = (), generation_counts: Sequence[float] = (), generation_sum: float = 0.0,
        queued: float | None = None, live_seq_tokens: float | None = None, live_running: float | None = None,
        queue_bounds: Sequence[float] = (), queue_counts: Sequence[float] = (),
    ) -> None:
        """One scrape interval ending at `now`: requests finished in it, running + queued at its end (`queued` of
        them waiting, when known), the interval's bucket counts of the two token histograms, the prefill
        batches observed since the last interval, the running decode batch's summed sequence lengths and
        size at its end (`decode_sum_seq_lens` and `num_running_reqs`, when shown), and the interval's bucket
        counts of the queue-time histogram (when shown)."""
        admissions, self.pending_admissions = self.pending_admissions, []
        if not (seconds > 0 and math.isfinite(seconds) and math.isfinite(finished) and math.isfinite(in_system)):
            return
        previous, previous_queued, previous_time = self.last_in_system, self.last_queued, self.last_time
        self.last_in_system = in_system
        self.last_queued = queued if queued is not None and math.isfinite(queued) else None
        self.last_time = now
        if previous is None:
            return  # the first scrape only gives the baseline in-system count
        # The bin runs from the in-system count it differs from: where intervals went unobserved since (nothing
        # had finished yet, so no histogram to read), their arrivals spread over them, not into the last one.
        # One further back than the window says nothing of when they came: a new baseline.
        start = now - seconds
        if previous_time is not None and previous_time < start:
            if now - previous_time > self.settings.window_seconds:
                return
            start = previous_time
        arrivals = max(0.0, finished + in_system - previous)
        shown_queue = bool(queue_bounds) and len(queue_bounds) == len(queue_counts)
        self.bins.append(TrafficBin(
            start=start, end=now, arrivals=arrivals, in_system_at_start=previous,
            queued_at_start=previous_queued, admissions=admissions,
            prompt_bounds=_shared_bounds(prompt_bounds), prompt_counts=_counts(prompt_counts),
            prompt_sum=max(0.0, float(prompt_sum)),
            generation_bounds=_shared_bounds(generation_bounds), generation_counts=_counts(generation_counts),
            generation_sum=max(0.0, float(generation_sum)),
            **_live_batch(live_seq_tokens, live_running),
            queue_bounds=_shared_bounds(queue_bounds) if shown_queue else (),
            queue_counts=_counts(queue_counts) if shown_queue else array("d"),
        ))
        horizon = now - self.settings.window_seconds
        while self.bins and (self.bins[0].end <= horizon or len(self.bins) > self.settings.max_bins):
            self.bins.popleft()

    def baseline(self, in_system: float, queued: float | None, now: float,
                 lifetime_requests: float | None = None) -> None:
        """A scrape that only sets the baseline (the first after a restart): what ran before it is not replayed.
        `lifetime_requests`, the requests the server process finished before it (its first scrape, or the first
        after it restarted; None after the daemon's own restore), dates when that process began serving."""
        self.last_in_system, self.last_queued, self.last_time = in_system, queued, now
        self.pending_admissions = []
        self.waiting_by_rank = {}
        if lifetime_requests is not None and math.isfinite(lifetime_requests) and math.isfinite(in_system):
            self.served_at_baseline = (now, max(0.0, lifetime_requests) + max(0.0, in_system))

    def observe_admissions(self, batches: Sequence[Sequence[int]], *, chunk_tokens: int | None = None,
                           page_size: int = 1) -> None:
        """`Prefill batch` lines in log order as [#new-seq, #new-token, #cached-token] or, with the DP rank that
        printed it, [..., rank], or with the queue behind the batch too, [..., rank, #queue-req, #pending-token]
        (-1 where the line does not show it); they join the next interval, and each rank's latest queue sizes what
        the server holds waiting (`_waiting_prompt_mean`). `chunk_tokens` is the server's chunked_prefill_size
        (where a long prompt is cut), when known."""
        for batch in batches:
            values = [int(v) for v in batch[:4]]
            if len(values) >= 3 and min(values[:3]) >= 0:
                self.pending_admissions.append(values)
            if len(batch) >= 6 and int(batch[4]) >= 0 and int(batch[5]) >= 0:
                self.waiting_by_rank[int(batch[3])] = (int(batch[4]), int(batch[5]))
        if chunk_tokens is not None and chunk_tokens > 0:
            self.chunk_tokens = int(chunk_tokens)
        self.page_size = max(1, int(page_size))

    def observe_requests(self, records: Sequence[ExactRequest]) -> int:
        """Finished requests with their arrival times on the server's clock, in the order they finished."""
        added = 0
        for record in records:
            if not (math.isfinite(record.arrival) and record.input_tokens >= 1 and record.output_tokens >= 0):
                continue
            self.exact.append(record)
            self.newest_arrival = record.arrival if self.newest_arrival is None else max(self.newest_arrival,
                                                                                          record.arrival)
            added += 1
        if self.newest_arrival is not None:
            horizon = self.newest_arrival - self.settings.window_seconds
            while self.exact and (self.exact[0].arrival < horizon or len(self.exact) > self.settings.max_requests):
                self.exact.popleft()
        return added

    # -- output ---------------------------------------------------------------------------------------

    def picture(self, seed: int = 0) -> TrafficPicture | None:
        """The replayable traffic of the window, or None when too little has been seen."""
        picture = self._exact_picture(seed) or self._binned_picture(seed)
        if picture is None or len(picture.requests) <= self.settings.max_replay_requests:
            return picture
        # The most recent requests only, from the first of them (what ran before is not replayed).
        return picture_since(picture, picture.requests[len(picture.requests) - self.settings.max_replay_requests].time)

    def _exact_picture(self, seed: int = 0) -> TrafficPicture | None:
        """The finished requests whose arrivals are known completely: from the first finish seen (an earlier
        arrival is only known if it finished late) to the last finish less the 98th percentile of e2e latency
        (a later arrival may not have finished yet); then, where the scrapes count what the server holds, the
        requests that came after that cut (`_past_the_cut`) up to the last finish."""
        if len(self.exact) < 2:
            return None
        finishes = np.asarray([r.arrival if r.finish is None else r.finish for r in self.exact])
        latencies = finishes - np.asarray([r.arrival for r in self.exact])
        lower = float(finishes.min())
        upper = float(finishes.max() - np.quantile(latencies, 0.98))
        records = sorted((r for r in self.exact if lower <= r.arrival <= upper), key=lambda r: r.arrival)
        if len(records) < 2:
            return None
        first, last = records[0].arrival, records[-1].arrival
        span = last - first
        enough = len(records) >= self.settings.exact_min_requests and span >= self.settings.exact_min_seconds
        if (span < self.settings.exact_coverage * self.settings.window_seconds and not enough
                and not self._exact_covers_history(span)):
            return None
        records = with_caps_from_finishes(records, seed)
        tail = self._past_the_cut(records, upper, float(finishes.max()), seed)
        if tail:
            records = sorted([*records, *tail], key=lambda r: r.arrival)
            span = max(span, float(finishes.max()) - first)
        requests = [
            RequestSpec(r.arrival - first, r.input_tokens, max(1, r.output_tokens),
                        max(r.max_new_tokens or UNSET_MAX_NEW_TOKENS, max(1, r.output_tokens)))
            for r in records
        ]
        requests = prefix_groups(records, requests)
        return TrafficPicture(requests=requests, window_seconds=max(span, 1.0), source="request_log",
                              live_queue_times=self._recent_queue_times(max(span, 1.0)))

    def _recent_queue_times(self, seconds: float) -> QueueHistogram | None:
        """The server's queue-time histogram over the scrape intervals of the last `seconds` (the bins wholly
        inside them, on the scrapes' clock: the log's may be another), for a picture read from the request log.
        A log line shows a request's whole latency, not how long it waited before its first forward; the histogram
        shows that wait as SGLang observed it, and the replay at the live ratio is checked against it as a
        metrics-only picture's is (`recommend/replay.py` `_queue_check`). None where no bin showed one."""
        if not self.bins:
            return None
        since = self.bins[-1].end - seconds
        recent = [b for b in self.bins if b.start >= since and b.end > b.start]
        return _queue_times(recent, since)[0] if recent else None

    def _past_the_cut(self, records: Sequence[ExactRequest], upper: float, last: float,
                      seed: int) -> list[ExactRequest]:
        """The requests that arrived after the exact picture's cut (`upper`) up to the last finish: those that
        finished as they are, and as many more as the server held at the last scrape (running + queued, which no
        request log line shows before they finish), spread evenly over the span (`_held_requests`). Under a queue
        at the live ratio the cut lies minutes back (a request's e2e latency is mostly its wait), and those minutes
        are the newest traffic: a request-log picture without them showed a drift back to chat 3.7 minutes late,
        and its curve peaked at r 3.9 where the whole timeline's peaked at 3.1. None where the scrapes have not
        counted what the server holds."""
        held = self.last_in_system
        if held is None or not math.isfinite(held) or not last > upper or not records:
            return []
        finished = [r for r in self.exact if r.arrival > upper]
        count = int(round(max(0.0, held)))
        if count == 0:
            return finished
        rng = np.random.default_rng(seed)
        step = (last - upper) / count
        return [*finished, *(replace(request, arrival=upper + step * (k + 0.5))
                             for k, request in enumerate(self._held_requests(records, count, rng)))]

    def _held_requests(self, known: Sequence[ExactRequest], count: int,
                       rng: np.random.Generator) -> list[ExactRequest]:
        """`count` requests standing for what the server holds unfinished, by arrival, copied from `known`: the
        latest requests before the picture's cut, all of them finished (those that finished past the cut are the
        quick ones by selection, and copied they made the held ones short).

        Those it runs (all held but the scrape's queued) are the newest the prefill lines admitted that no finished
        request accounts for (`_running_prompts`): their prompts and matched prefixes, each with the output and
        cap of a known request of a near prompt that runs longer than the held one has run (its age since admission
        at the window's output rate: a request still running after minutes is a long one); where the lines do not
        date them, drawn in proportion to the outputs instead (a request still running is one of the long ones, as
        one the log has already finished is one of the short ones). At the last replay of two held-out watches, the
        held requests ran to 758 output tokens on average (bimodal chat and documents, one GPU) and 9,250
        (reasoning waves, TP2); copies of the latest known and proportional draws from the newest admitted made
        them 436 and 3,470, these 676 and 8,200.
        Those still queued came after them and no line shows their lengths, but the last `Prefill batch` line shows
        how many wait and their tokens (`#pending-token`): copies of the latest known requests, without a matched
        prefix, drawn so that their mean prompt is the waiting ones' where the lines show it (`_tilted_draws`).
        Chat after documents on an H100 queued at 0.9 (set 4's regime shift, seed 2) held ~1,750 requests six
        minutes after chat came back; copied from the documents' last minutes they read as documents still, and the
        advice reached the chat regime's good ratios 16.5 minutes after the shift (11.5 with the queue sized).
        Without prefill lines, all are copies."""
        pool = list(known[-max(count, TAIL_POOL_MIN):])
        queued = count if self.last_queued is None else min(count, int(round(max(0.0, self.last_queued))))
        held = self._running_prompts(count - queued, rng) if count > queued else []
        running = len(held)
        order = sorted(range(len(pool)), key=lambda k: pool[k].input_tokens)
        lengths = [pool[k].input_tokens for k in order]
        rate = _output_rate(known)
        out = []
        for prompt, age in held:
            at = bisect.bisect_left(lengths, prompt.tokens)
            near = sorted(range(max(0, at - TAIL_NEAR_PROMPTS), min(len(lengths), at + TAIL_NEAR_PROMPTS)),
                          key=lambda j: abs(lengths[j] - prompt.tokens))[:TAIL_NEAR_PROMPTS]
            reach = max(abs(lengths[near[0]] - prompt.tokens), TAIL_NEAR_SHARE * prompt.tokens)
            near_pool = [order[j] for j in near if abs(lengths[j] - prompt.tokens) <= reach]
            like = _running_like(pool, near_pool, None if age is None or rate is None else age * rate, rng)
            out.append(ExactRequest(arrival=0.0, input_tokens=prompt.tokens, output_tokens=like.output_tokens,
                                    max_new_tokens=like.max_new_tokens, finish=math.inf,
                                    cached_tokens=min(prompt.cached, prompt.tokens - 1)))
        out += [replace(pool[int(i)], cached_tokens=0, finish=math.inf)
                for i in _tilted_draws([r.input_tokens for r in pool], count - running, self._waiting_prompt_mean(),
                                       rng)]
        return out

    def _waiting_prompt_mean(self) -> float | None:
        """The mean prompt of the requests waiting at each DP rank's latest `Prefill batch` line (its pending tokens
        over its queue; a retracted request waits with its output too), None where no line showed one waiting."""
        queued = sum(q for q, _ in self.waiting_by_rank.values())
        tokens = sum(t for _, t in self.waiting_by_rank.values())
        return tokens / queued if queued > 0 and tokens > 0 else None

    def _running_prompts(self, count: int, rng: np.random.Generator) -> list[tuple[AdmittedPrompt, float | None]]:
        """`count` prompts for the held requests the server runs, by admission, read once from the window's prefill
        lines: the newest admitted that no finished request of the log accounts for, each with its age at the last
        scrape (from its line's interval); where the lines show fewer, the rest drawn from the newest admitted (at
        least TAIL_POOL_MIN of them), undated. The finished requests account for the earliest admitted prompts of
        their length (first come, first done: of a hundred requests of one length, the last admitted are the ones
        still running). None without prefill lines."""
        bins = [b for b in self.bins if b.end > b.start]
        prompts = self._admitted_prompts(bins, rng) if bins else []
        if not prompts:
            return []
        accounted = Counter(r.input_tokens for r in self.exact if r.finish is not None)
        unaccounted = []
        for prompt in prompts:
            if accounted[prompt.tokens] > 0:
                accounted[prompt.tokens] -= 1
            else:
                unaccounted.append(prompt)
        batch_bin = np.repeat(np.arange(len(bins)), [len(b.admissions) for b in bins])
        middles = [(b.start + b.end) / 2 for b in bins]
        now = bins[-1].end  # the scrapes' clock, as the lines' intervals (the log's may be another)
        held: list[tuple[AdmittedPrompt, float | None]] = [
            (prompt, max(0.0, now - middles[int(batch_bin[prompt.batch])]))
            for prompt in unaccounted[len(unaccounted) - min(count, len(unaccounted)):]]
        newest = prompts[-max(count, TAIL_POOL_MIN):]
        return held + [(newest[int(i)], None) for i in rng.integers(0, len(newest), count - len(held))]

    def _exact_covers_history(self, span: float) -> bool:
        """Exact records cover all that was observed (a young daemon): the bins hold no more than they do."""
        if not self.bins:
            return True
        binned = self.bins[-1].end - self.bins[0].start
        return span >= self.settings.exact_coverage * binned

    def _binned_picture(self, seed: int) -> TrafficPicture | None:
        bins = [b for b in self.bins if b.end > b.start]
        if not bins or sum(b.arrivals for b in bins) < 2:
            return None
        rng = np.random.default_rng(seed)
        start = bins[0].start
        window = bins[-1].end - start
        # lengths for a bin without finished requests come from the nearest bin that has some
        with_lengths = [i for i, b in enumerate(bins) if b.finished > 0 and sum(b.generation_counts) > 0]
        if not with_lengths:
            return None
        prompts = self._admitted_prompts(bins, rng)
        mature = self._mature_from(bins, with_lengths)
        pooled = _pooled_lengths([bins[i] for i in with_lengths if i >= mature])
        requests: list[RequestSpec] = []
        backlog = int(round(bins[0].in_system_at_start))
        carry = 0.0
        finished_by = np.cumsum([b.finished for b in bins])
        numbered = 0
        for index, traffic_bin in enumerate(bins):
            count_float = traffic_bin.arrivals + carry
            count = int(math.floor(count_float))
            carry = count_float - count
            if index == 0:
                count += backlog
            if count <= 0:
                continue
            # fcfs: the n-th request in (the backlog first) is the n-th to finish, and its lengths are in the
            # histograms of the interval it finished in
            finished_in = np.searchsorted(finished_by, np.arange(numbered, numbered + count), side="right")
            numbered += count
            inputs = np.zeros(count)
            outputs = np.zeros(count)
            for which in np.unique(finished_in):
                among = finished_in == which
                source = self._length_source(int(which), with_lengths, bins, mature, pooled)
                inputs[among] = _sample_lengths(rng, source.prompt_bounds, source.prompt_counts, source.prompt_sum,
                                                int(among.sum()))
                outputs[among] = _sample_lengths(rng, source.generation_bounds, source.generation_counts,
                                                 source.generation_sum, int(among.sum()))
            if index == 0 and backlog:
                times = np.concatenate([np.zeros(min(backlog, count)),
                                        rng.uniform(0.0, traffic_bin.end - start, max(0, count - backlog))])
            else:
                times = rng.uniform(traffic_bin.start - start, traffic_bin.end - start, count)
            for t, i, o in zip(times, inputs, outputs, strict=True):
                requests.append(RequestSpec(float(t), int(i), int(o), UNSET_MAX_NEW_TOKENS))
        requests.sort(key=lambda r: r.time)
        live_batch = _mean_live_batch(bins)
        target, running = live_batch if live_batch is not None else (None, None)
        continued: set[int] = set()
        if prompts:
            requests, continued = self._with_admitted_prompts(requests, prompts, bins, backlog, rng, target)
        elif target is not None:
            requests = paired_to_live_context(requests, target, rng)
        queue_times, queue_series = _queue_times(bins, start)
        return TrafficPicture(requests=requests, window_seconds=window, source="metrics", backlog=backlog,
                              live_context=target, live_running=running,
                              fixed_outputs=tuple(sorted(continued)), live_queue_times=queue_times,
                              live_queue_series=queue_series)

    @staticmethod
    def _length_source(index: int, with_lengths: Sequence[int], bins: Sequence[TrafficBin], mature: int,
                       pooled: TrafficBin | None) -> TrafficBin:
        """The bin whose histograms give the lengths of requests that finished in bin `index`: its own, or the
        nearest with finishes where it has none; the mature bins' pooled before the first mature one, and past the
        last bin (still in the system at the window's end: under a queue that can be much of the window, and one
        interval's finishes are too few to give it its lengths)."""
        if pooled is not None and (index < mature or index >= len(bins)):
            return pooled
        return bins[min(with_lengths, key=lambda i: abs(i - index))]

    def _mature_from(self, bins: Sequence[TrafficBin], with_lengths: Sequence[int]) -> int:
        """The first bin whose finishes can hold the traffic's long requests: 0 unless the server process began
        serving so recently that the window's first bins cannot. When the process began is dated from the
        requests it had taken in at the first scrape and the window's arrival rate. A long request finishes a
        long stay after that: where the queue is shown, its wait (the bin's queued over the arrival rate: fcfs,
        short and long requests wait alike) plus a long run (the mean run, running over the finish rate, times
        the tail over the mean output); else the whole stay (Little: mean in system over the arrival rate)
        stretched by the tail. Finishes before then hold none of the long requests, and drawing the arrivals'
        lengths from them gives a long-output traffic a lighter tail than it has (heavy-tailed answers on TP8:
        their mean 2037 against 2484 in a window's first third). The tail is the 99th percentile of the window's
        generation histogram (itself short of the longest: a lower bound)."""
        if self.served_at_baseline is None or not with_lengths:
            return 0
        window = bins[-1].end - bins[0].start
        rate = sum(b.arrivals for b in bins) / window if window > 0 else 0.0
        if not rate > 0:
            return 0
        baseline_time, served = self.served_at_baseline
        began = baseline_time - served / rate
        pooled = _pooled_lengths([bins[i] for i in with_lengths])
        if pooled is None:
            return 0
        counts = np.asarray(pooled.generation_counts, dtype=float)
        finished = float(counts.sum())
        if not finished > 0:
            return 0
        mean_output = pooled.generation_sum / finished
        tail_bucket = int(np.searchsorted(np.cumsum(counts), MATURE_TAIL * finished))
        bounds = pooled.generation_bounds
        tail = bounds[min(tail_bucket, len(bounds) - 1)]
        if not math.isfinite(tail):
            tail = 2.0 * bounds[-2] if len(bounds) > 1 else mean_output
        stretch = tail / max(mean_output, 1.0)
        finish_rate = sum(b.finished for b in bins) / window
        queue_shown = all(b.queued_at_start is not None for b in bins) and finish_rate > 0
        if queue_shown:
            running = float(np.mean([max(0.0, b.in_system_at_start - (b.queued_at_start or 0.0)) for b in bins]))
            long_run = running / finish_rate * stretch
        else:
            long_run = float(np.mean([b.in_system_at_start for b in bins])) / rate * stretch
        for index in with_lengths:
            wait = (bins[index].queued_at_start or 0.0) / rate if queue_shown else 0.0
            if bins[index].start - began >= wait + long_run:
                return index
        # none has matured: the window's last third is the nearest to it
        return next((i for i in with_lengths if bins[i].start >= bins[0].start + window * 2 / 3), with_lengths[-1])

    def _admitted_prompts(self, bins: Sequence[TrafficBin], rng: np.random.Generator | None = None,
                          ) -> list[AdmittedPrompt]:
        """The admitted prompts of the bins' prefill lines; a shared batch is split by draws from the bins' own
        prompt histograms (`_split_batch`)."""
        batches = [batch for b in bins for batch in b.admissions]
        if not batches:
            return []
        rng = rng if rng is not None else np.random.default_rng(0)
        drawn = _window_prompts(bins, rng)
        chunk = self.chunk_tokens
        if chunk is None:
            # not told: a chunk shows as the largest batch, reached again and again, and a round number (the
            # flag's values are multiples of 256; a repeated prompt length need not be)
            largest = max(batch[1] for batch in batches)
            repeated = sum(batch[1] == largest for batch in batches) >= 3
            chunk = largest if repeated and largest % 256 == 0 else None
        return admitted_prompts(batches, chunk, self.page_size, drawn, rng)

    def _with_admitted_prompts(self, requests: list[RequestSpec], prompts: list[AdmittedPrompt],
                               bins: Sequence[TrafficBin], backlog: int, rng: np.random.Generator,
                               live_target: float | None = None) -> tuple[list[RequestSpec], set[int]]:
        """The prompt lengths in arrival order from the admitted sequence (fcfs: the k-th admitted is the k-th to
        come). What ran before the window keeps its drawn length; the rest spread over the admitted sequence in
        order (a retracted request admitted twice, or a miscounted chunk, shifts the pairing by one request
        rather than sliding every later one). What still waits at the window's end was never admitted: its
        prompts are drawn from the window's admitted ones (a queue holds arrivals as they come, while the
        histograms near the end count what finished there, the long requests of a burst among them), to the mean
        the last prefill line shows the queue holds where it does (`_tilted_draws`). Then the
        outputs: paired to the running batch's mean length where the server shows it (`paired_to_live_context`),
        else by the prompt buckets' residence (`_paired_outputs`). With the requests, the continued turns (whose
        outputs the matched prefixes fixed)."""
        queued_first = bins[0].queued_at_start
        running_first = backlog - int(round(queued_first)) if queued_first is not None else backlog
        running_first = min(max(running_first, 0), len(requests))
        waiting_last = int(round(self.last_queued)) if self.last_queued is not None else 0
        paired = range(running_first, max(running_first, len(requests) - waiting_last))
        if not paired:
            return requests, set()
        out = list(requests)
        waiting = _tilted_draws([p.tokens for p in prompts], len(out) - paired.stop, self._waiting_prompt_mean(), rng)
        for index, which in zip(range(paired.stop, len(out)), waiting, strict=True):
            out[index] = replace(out[index], input_tokens=max(1, prompts[which].tokens))
        scale = len(prompts) / len(paired)
        chosen = [min(len(prompts) - 1, int(position * scale)) for position in range(len(paired))]
        for index, which in zip(paired, chosen, strict=True):
            out[index] = replace(out[index], input_tokens=max(1, prompts[which].tokens))
        found = self._residence(prompts, bins, running_first, rng) if live_target is None else None
        if found is not None:
            residence, bucket_of = found
            out = _paired_outputs(out, paired, residence[chosen], bucket_of[chosen])
        cached = [0] * len(out)
        for index, which in zip(paired, chosen, strict=True):
            cached[index] = prompts[which].cached
        out, continued = _linked_turns(out, cached)
        if live_target is not None:
            out = paired_to_live_context(out, live_target, rng, keep=continued)
        return _with_prefix_groups(out, cached), continued

    def _residence(self, prompts: list[AdmittedPrompt], bins: Sequence[TrafficBin], running_first: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray] | None:
        """Each admitted prompt's time from admission to finish (NaN where it did not finish in the window): the
        prompt histogram of each interval counts the requests that finished in it by prompt bucket, and within a
        bucket requests of a like length finish roughly in the order they were admitted (matched first in, first
        out). The time spent mostly decoding, it orders the requests by output length: a long document that
        decodes for a long while holds its KV for that while.

        What was running when the window opened finishes first and was admitted before it: each bucket's share
        of it is skipped. Running requests are residence-weighted (Little's law: a bucket holds its finishing
        rate times its stay), so a first pass at the buckets' finishing shares gives the stays, a second pass
        skips by finishes times stay."""
        reference = next((b for b in bins if b.prompt_bounds and sum(b.prompt_counts) > 0), None)
        if reference is None:
            return None
        bounds = np.asarray(reference.prompt_bounds, dtype=float)
        batch_bin = np.repeat(np.arange(len(bins)), [len(b.admissions) for b in bins])
        first_bins = batch_bin[[p.batch for p in prompts]]
        middles = np.asarray([(b.start + b.end) / 2 for b in bins])
        widths = np.asarray([b.end - b.start for b in bins])
        admitted_at = middles[first_bins] + rng.uniform(-0.5, 0.5, len(prompts)) * widths[first_bins]
        bucket_of = np.minimum(np.searchsorted(bounds, [p.tokens for p in prompts], side="left"), len(bounds) - 1)
        finishes: dict[int, np.ndarray] = {}
        members: dict[int, np.ndarray] = {}
        same_layout = [b for b in bins if b.prompt_bounds == reference.prompt_bounds]  # shared bound tuples
        for bucket in range(len(bounds)):
            times = [rng.uniform(b.start, b.end, int(round(b.prompt_counts[bucket]))) for b in same_layout]
            ends = np.sort(np.concatenate(times)) if times else np.zeros(0)
            admitted = np.flatnonzero(bucket_of == bucket)
            if len(ends) and len(admitted):
                finishes[bucket] = ends
                members[bucket] = admitted[np.argsort(admitted_at[admitted], kind="stable")]
        total = sum(len(ends) for ends in finishes.values())
        if not total:
            return None

        def match(weights: dict[int, float]) -> np.ndarray:
            residence = np.full(len(prompts), np.nan)
            weight_sum = sum(len(finishes[k]) * weights[k] for k in finishes) or 1.0
            for bucket, ends in finishes.items():
                skip = int(round(running_first * len(ends) * weights[bucket] / weight_sum))
                ends = ends[skip:]
                matched = min(len(members[bucket]), len(ends))
                order = members[bucket][:matched]
                residence[order] = np.maximum(0.0, ends[:matched] - admitted_at[order])
            return residence

        residence = match(dict.fromkeys(finishes, 1.0))
        if running_first > 0:
            stays = {k: float(np.nanmean(residence[members[k]])) if np.isfinite(residence[members[k]]).any()
                     else 0.0 for k in finishes}
            if any(v > 0 for v in stays.values()):
                residence = match(stays)
        return residence, bucket_of

    # -- checkpoint -----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION,
            "settings": asdict(self.settings),
            "bins": [b.to_dict() for b in self.bins],
            "exact": [[r.arrival, r.input_tokens, r.output_tokens, r.max_new_tokens, r.finish, r.cached_tokens,
                       r.stopped]
                      for r in self.exact],
            "last_in_system": self.last_in_system,
            "last_queued": self.last_queued,
            "last_time": self.last_time,
            "pending_admissions": self.pending_admissions,
            "waiting_by_rank": [[rank, queued, tokens] for rank, (queued, tokens) in self.waiting_by_rank.items()],
            "chunk_tokens": self.chunk_tokens,
            "page_size": self.page_size,
            "served_at_baseline": list(self.served_at_baseline) if self.served_at_baseline else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrafficEstimator:
        """Restore; raises ValueError (or KeyError/TypeError) on a checkpoint that is not ours."""
        if data.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"traffic checkpoint version {data.get('version')!r} is not {CHECKPOINT_VERSION}")
        estimator = cls(TrafficSettings(**data["settings"]))
        estimator.bins = deque(TrafficBin(**b) for b in data["bins"])
        estimator.exact = deque(
            ExactRequest(float(a), int(i), int(o), None if m is None else int(m), None if f is None else float(f),
                         int(rest[0]) if rest else 0, bool(rest[1]) if len(rest) > 1 and rest[1] is not None else None)
            for a, i, o, m, f, *rest in data["exact"]
        )
        estimator.newest_arrival = max((r.arrival for r in estimator.exact), default=None)
        for name in ("last_in_system", "last_time"):
            value = data[name]
            setattr(estimator, name, None if value is None else float(value))
        # written since the admitted-prompt picture: older checkpoints lack them
        queued = data.get("last_queued")
        estimator.last_queued = None if queued is None else float(queued)
        estimator.pending_admissions = [[int(v) for v in batch] for batch in data.get("pending_admissions", [])]
        # written since the waiting requests were sized from the prefill lines: older checkpoints lack it
        estimator.waiting_by_rank = {int(rank): (int(queued), int(tokens))
                                     for rank, queued, tokens in data.get("waiting_by_rank", [])}
        chunk = data.get("chunk_tokens")
        estimator.chunk_tokens = None if chunk is None else int(chunk)
        estimator.page_size = int(data.get("page_size", 1))
        served = data.get("served_at_baseline")  # written since the start-censoring check: older ones lack it
        estimator.served_at_baseline = (float(served[0]), float(served[1])) if served else None
        return estimator
