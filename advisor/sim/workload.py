"""Workloads for the simulator: when requests arrive and how long they are, from YAML files
(parametric mixtures under poisson / on-off / diurnal arrivals, phases, spikes and multi-turn sessions
whose shared prefix grows turn by turn) or replayed SGLang request logs; deterministic under a seed.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from advisor.errors import InputError
from advisor.scheduler.types import RequestSpec
from advisor.yaml_loading import load_yaml

WORKLOADS_DIR = Path(__file__).resolve().parent.parent / "data" / "workloads"
DEFAULT_WORKLOAD = "bimodal-chat-docs"
# Arrivals are generated on a fixed grid of blocks from t = 0, so a seed gives the same
# requests however the caller slices time.
BLOCK_SECONDS = 60.0
DEFAULT_MAX_NEW_TOKENS = 8192
# A client that does not set max_tokens: the OpenAI server passes max_new_tokens=None
# (entrypoints/openai/protocol.py to_sampling_params), and the scheduler reads None as 1 << 30 before
# clipping it to the context and the KV pool (managers/scheduler.py init_req_max_new_tokens).
UNSET_MAX_NEW_TOKENS = 1 << 30
# Timestamp-less replays (the --export-metrics-to-file format) arrive as poisson at this rate
# unless `replay.rate` says otherwise.
DEFAULT_REPLAY_RATE = 1.0
MAX_TOKENS = 10_000_000


# --------------------------------------------------------------------------- validation helpers

MAX_WORKLOAD_YAML_BYTES = 1 << 20  # a workload description; request logs to replay are read separately


def _num(value: Any, where: str, *, minimum: float | None = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where} must be a number, got {value!r}")
    if minimum is not None and (value < minimum or (strict and value == minimum)):
        raise InputError(f"{where} must be {'>' if strict else '>='} {minimum}, got {value!r}")
    return float(value)


def _int(value: Any, where: str, *, minimum: int = 1) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _only(data: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in data:
        if key not in allowed:
            raise InputError(f"{where}.{key} is not a known field (known: {', '.join(sorted(allowed))})")


# --------------------------------------------------------------------------- lengths


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: lognormal (mu, sigma) clipped to [minimum, maximum], or fixed."""

    mu: float
    sigma: float
    minimum: int = 1
    maximum: int = MAX_TOKENS

    @property
    def mean(self) -> float:
        """Mean before clipping."""
        return math.exp(self.mu + self.sigma**2 / 2)

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        if count == 0:
            return np.zeros(0, dtype=np.int64)
        if self.sigma == 0:
            values = np.full(count, math.exp(self.mu))
        else:
            values = rng.lognormal(self.mu, self.sigma, count)
        return np.clip(np.rint(values), self.minimum, self.maximum).astype(np.int64)


def _length(data: Any, where: str) -> LengthDist:
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        value = _num(data, where, minimum=1)
        return LengthDist(math.log(value), 0.0)
    spec = _mapping(data, where)
    _only(spec, {"median", "mean", "sigma", "fixed", "min", "max"}, where)
    minimum = _int(spec.get("min", 1), f"{where}.min")
    maximum = _int(spec.get("max", MAX_TOKENS), f"{where}.max")
    if maximum < minimum:
        raise InputError(f"{where}.max ({maximum}) must be >= {where}.min ({minimum})")
    given = [key for key in ("median", "mean", "fixed") if key in spec]
    if len(given) != 1:
        raise InputError(f"{where} needs exactly one of median, mean or fixed")
    if "fixed" in spec:
        value = _num(spec["fixed"], f"{where}.fixed", minimum=1)
        return LengthDist(math.log(value), 0.0, minimum, maximum)
    sigma = _num(spec.get("sigma", 0.0), f"{where}.sigma", minimum=0.0)
    if sigma > 4:
        raise InputError(f"{where}.sigma must be <= 4 (a lognormal sigma), got {sigma}")
    if "median" in spec:
        mu = math.log(_num(spec["median"], f"{where}.median", minimum=1))
    else:
        mu = math.log(_num(spec["mean"], f"{where}.mean", minimum=1)) - sigma**2 / 2
    return LengthDist(mu, sigma, minimum, maximum)


@dataclass(frozen=True)
class MaxNewPolicy:
    """How a class sets max_new_tokens: a fixed cap, or a multiple of the real output; a share
    `unset_fraction` of its clients send no max_tokens at all (UNSET_MAX_NEW_TOKENS)."""

    fixed: int | None = None
    multiple: float | None = None
    minimum: int = 1
    unset_fraction: float = 0.0

    def apply(self, output: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        if self.fixed is not None:
            caps = np.full(output.shape, self.fixed, dtype=np.int64)
        elif self.multiple is not None:
            caps = np.maximum(np.ceil(output * self.multiple).astype(np.int64), self.minimum)
        else:
            caps = np.full(output.shape, UNSET_MAX_NEW_TOKENS, dtype=np.int64)
        if self.unset_fraction > 0 and rng is not None and len(caps):
            caps[rng.uniform(0.0, 1.0, len(caps)) < self.unset_fraction] = UNSET_MAX_NEW_TOKENS
        return caps


def _max_new(data: Any, where: str) -> MaxNewPolicy:
    if data is None:
        return MaxNewPolicy(fixed=DEFAULT_MAX_NEW_TOKENS)
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return MaxNewPolicy(fixed=_int(data, where))
    spec = _mapping(data, where)
    _only(spec, {"fixed", "multiple", "min", "unset", "unset_fraction"}, where)
    unset = spec.get("unset", False)
    if not isinstance(unset, bool):
        raise InputError(f"{where}.unset must be true or false, got {unset!r}")
    unset_fraction = _num(spec.get("unset_fraction", 0.0), f"{where}.unset_fraction")
    if unset_fraction > 1:
        raise InputError(f"{where}.unset_fraction must be in [0, 1], got {unset_fraction}")
    if unset:
        if "fixed" in spec or "multiple" in spec or "unset_fraction" in spec:
            raise InputError(f"{where}.unset cannot be combined with fixed, multiple or unset_fraction")
        return MaxNewPolicy()
    if ("fixed" in spec) == ("multiple" in spec):
        raise InputError(f"{where} needs exactly one of fixed, multiple or unset")
    if "fixed" in spec:
        return MaxNewPolicy(fixed=_int(spec["fixed"], f"{where}.fixed"), unset_fraction=unset_fraction)
    multiple = _num(spec["multiple"], f"{where}.multiple", minimum=1.0)
    return MaxNewPolicy(
        multiple=multiple, minimum=_int(spec.get("min", 1), f"{where}.min"), unset_fraction=unset_fraction
    )


@dataclass(frozen=True)
class RequestClass:
    name: str
    weight: float
    input: LengthDist
    output: LengthDist
    max_new: MaxNewPolicy
    prefix_groups: int = 0
    prefix_tokens: int = 0

    def mean_context(self) -> float:
        return self.input.mean + self.output.mean


def _request_class(data: Any, where: str, default_name: str) -> RequestClass:
    spec = _mapping(data, where)
    _only(spec, {"name", "weight", "input", "output", "max_new_tokens", "prefix"}, where)
    for required in ("input", "output"):
        if required not in spec:
            raise InputError(f"{where}.{required} is required")
    name = str(spec.get("name", default_name))
    prefix_groups = prefix_tokens = 0
    if spec.get("prefix") is not None:
        prefix = _mapping(spec["prefix"], f"{where}.prefix")
        _only(prefix, {"groups", "tokens"}, f"{where}.prefix")
        prefix_groups = _int(prefix.get("groups", 1), f"{where}.prefix.groups")
        prefix_tokens = _int(prefix.get("tokens"), f"{where}.prefix.tokens")
    return RequestClass(
        name=name,
        weight=_num(spec.get("weight", 1.0), f"{where}.weight", minimum=0.0),
        input=_length(spec["input"], f"{where}.input"),
        output=_length(spec["output"], f"{where}.output"),
        max_new=_max_new(spec.get("max_new_tokens"), f"{where}.max_new_tokens"),
        prefix_groups=prefix_groups,
        prefix_tokens=prefix_tokens,
    )


# --------------------------------------------------------------------------- arrival processes


@dataclass(frozen=True)
class ArrivalProcess:
    """poisson (rate), onoff (on_rate/off_rate for on_seconds/off_seconds, starting on), or
    diurnal (rate * (1 + amplitude * sin(2 pi (t + phase_seconds) / period_seconds)))."""

    process: str = "poisson"
    rate: float = 1.0
    on_rate: float = 0.0
    off_rate: float = 0.0
    on_seconds: float = 0.0
    off_seconds: float = 0.0
    amplitude: float = 0.0
    period_seconds: float = 86400.0
    phase_seconds: float = 0.0

    def breakpoints(self, start: float, end: float) -> list[float]:
        if self.process != "onoff":
            return []
        cycle = self.on_seconds + self.off_seconds
        points = []
        k = math.floor(start / cycle)
        while k * cycle < end:
            for t in (k * cycle, k * cycle + self.on_seconds):
                if start < t < end:
                    points.append(t)
            k += 1
        return points

    def constant_rate(self, t: float) -> float:
        """The rate at t for poisson/onoff; for diurnal, the peak (thinning bound)."""
        if self.process == "poisson":
            return self.rate
        if self.process == "onoff":
            cycle = self.on_seconds + self.off_seconds
            return self.on_rate if (t % cycle) < self.on_seconds else self.off_rate
        return self.rate * (1 + self.amplitude)

    def diurnal_rate(self, times: np.ndarray) -> np.ndarray:
        angle = 2 * math.pi * (times + self.phase_seconds) / self.period_seconds
        return self.rate * (1 + self.amplitude * np.sin(angle))

    @property
    def mean_rate(self) -> float:
        if self.process == "onoff":
            cycle = self.on_seconds + self.off_seconds
            return (self.on_rate * self.on_seconds + self.off_rate * self.off_seconds) / cycle
        return self.rate


def _arrival(data: Any, where: str = "arrival") -> ArrivalProcess:
    spec = _mapping(data, where)
    process = spec.get("process", "poisson")
    if process == "poisson":
        _only(spec, {"process", "rate"}, where)
        if "rate" not in spec:
            raise InputError(f"{where}.rate is required for a poisson process")
        return ArrivalProcess("poisson", rate=_num(spec["rate"], f"{where}.rate", minimum=0, strict=True))
    if process == "onoff":
        _only(spec, {"process", "on_rate", "off_rate", "on_seconds", "off_seconds"}, where)
        for required in ("on_rate", "on_seconds", "off_seconds"):
            if required not in spec:
                raise InputError(f"{where}.{required} is required for an onoff process")
        return ArrivalProcess(
            "onoff",
            on_rate=_num(spec["on_rate"], f"{where}.on_rate", minimum=0, strict=True),
            off_rate=_num(spec.get("off_rate", 0.0), f"{where}.off_rate"),
            on_seconds=_num(spec["on_seconds"], f"{where}.on_seconds", minimum=0, strict=True),
            off_seconds=_num(spec["off_seconds"], f"{where}.off_seconds", minimum=0, strict=True),
        )
    if process == "diurnal":
        _only(spec, {"process", "rate", "amplitude", "period_seconds", "phase_seconds"}, where)
        if "rate" not in spec:
            raise InputError(f"{where}.rate (the mean rate) is required for a diurnal process")
        amplitude = _num(spec.get("amplitude", 0.5), f"{where}.amplitude")
        if amplitude > 1:
            raise InputError(f"{where}.amplitude must be in [0, 1], got {amplitude}")
        return ArrivalProcess(
            "diurnal",
            rate=_num(spec["rate"], f"{where}.rate", minimum=0, strict=True),
            amplitude=amplitude,
            period_seconds=_num(
                spec.get("period_seconds", 86400.0), f"{where}.period_seconds", minimum=0, strict=True
            ),
            phase_seconds=_num(spec.get("phase_seconds", 0.0), f"{where}.phase_seconds", minimum=None),
        )
    raise InputError(f"{where}.process must be poisson, onoff or diurnal, got {process!r}")


@dataclass(frozen=True)
class Phase:
    duration: float
    rate_scale: float = 1.0
    rate: float | None = None  # absolute rate (poisson only)
    weights: tuple[float, ...] | None = None  # per class, in class order


@dataclass(frozen=True)
class Spike:
    """Bursts of one class: poisson at `rate` during [start + k*every, start + k*every + duration)."""

    every: float
    duration: float
    rate: float
    start: float
    request_class: RequestClass


@dataclass(frozen=True)
class SessionClass:
    """Multi-turn sessions (agents, long chats): sessions start as poisson at `rate`; turn 1 sends
    `first_input` tokens, every later turn resends the whole conversation so far plus `turn_input`
    new tokens, so its prefix is the previous turn's input + output (what SGLang's radix cache holds
    once that turn finished). Open loop: turn k+1 arrives `response_seconds_per_token` x output_k +
    a think time after turn k (the client's expectation, not the server's real pace)."""

    name: str
    rate: float
    turns: LengthDist
    first_input: LengthDist
    turn_input: LengthDist
    output: LengthDist
    max_new: MaxNewPolicy
    think_seconds: LengthDist
    response_seconds_per_token: float = 0.03
    max_context: int = 200_000  # a session ends before its context would pass this

    def session(self, rng: np.random.Generator, start: float, sid: str) -> list[RequestSpec]:
        turns = int(self.turns.sample(rng, 1)[0])
        fresh = self.turn_input.sample(rng, turns)
        fresh[0] = self.first_input.sample(rng, 1)[0]
        outputs = self.output.sample(rng, turns)
        caps = self.max_new.apply(outputs, rng)
        thinks = self.think_seconds.sample(rng, turns)
        specs: list[RequestSpec] = []
        t = start
        context = 0
        for k in range(turns):
            prefix = context
            input_tokens = context + int(fresh[k])
            output = int(min(outputs[k], caps[k]))
            if input_tokens + output > self.max_context:
                break
            specs.append(RequestSpec(t, input_tokens, output, int(caps[k]), sid, prefix, extends_prefix=True))
            context = input_tokens + output
            t += output * self.response_seconds_per_token + float(thinks[k]) / 1000.0
        return specs


# --------------------------------------------------------------------------- replay


@dataclass(frozen=True, eq=False)
class ReplayTrace:
    """Requests read from SGLang request logs, arrival offsets from the first arrival."""

    offsets: np.ndarray | None  # None when the log carries no timestamps
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    max_new_tokens: np.ndarray
    rate: float
    speed: float
    loop: bool
    source: str


_LINE_TS = re.compile(r"^\[(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?)")


def _parse_time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _replay_record(line: str) -> tuple[float | None, int, int, int | None] | None:
    """(arrival, prompt, completion, max_new or None) of one log line; None if not a request record."""
    brace = line.find("{")
    if brace < 0:
        return None
    try:
        data = json.loads(line[brace:])
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    finish_ts: float | None = None
    if isinstance(data.get("out"), dict) and isinstance(data["out"].get("meta_info"), dict):
        meta = data["out"]["meta_info"]  # --log-requests-format json
        finish_ts = _parse_time(data.get("timestamp"))
        params = data.get("obj", {}).get("sampling_params") if isinstance(data.get("obj"), dict) else None
    elif "prompt_tokens" in data:
        meta = data  # --export-metrics-to-file
        finish_ts = _parse_time(data.get("timestamp"))
        params = None
        raw = data.get("request_parameters")
        if isinstance(raw, str):
            try:
                parsed = json.loads(raw)
                params = parsed.get("sampling_params") if isinstance(parsed, dict) else None
            except json.JSONDecodeError:
                params = None
    else:
        return None
    if finish_ts is None:
        match = _LINE_TS.match(line)
        if match:
            finish_ts = _parse_time(match.group(1))
    prompt, completion = meta.get("prompt_tokens"), meta.get("completion_tokens")
    if isinstance(prompt, bool) or isinstance(completion, bool):
        return None
    if not isinstance(prompt, int) or not isinstance(completion, int) or prompt < 1 or completion < 0:
        return None
    arrival = None
    if finish_ts is not None:
        latency = meta.get("e2e_latency")
        arrival = finish_ts - (
            float(latency) if isinstance(latency, (int, float)) and not isinstance(latency, bool) else 0.0
        )
    max_new = None
    if isinstance(params, dict) and isinstance(params.get("max_new_tokens"), int):
        max_new = int(params["max_new_tokens"])
    finish = meta.get("finish_reason")
    if max_new is None and isinstance(finish, dict) and finish.get("type") == "length":
        max_new = max(completion, 1)  # it stopped at its cap
    return arrival, prompt, max(completion, 1), max_new


def load_replay(
    path: Path,
    *,
    rate: float | None = None,
    speed: float = 1.0,
    loop: bool = True,
    max_new: MaxNewPolicy | None = None,
) -> ReplayTrace:
    """Read prompt/completion tokens (and arrival = finish timestamp - e2e_latency) from a log."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"replay log {path}: {exc.strerror}") from None
    records = [rec for rec in (_replay_record(line) for line in text.splitlines()) if rec is not None]
    if not records:
        raise InputError(
            f"replay log {path}: no request records (need JSON lines with prompt_tokens and completion_tokens)"
        )
    policy = max_new or MaxNewPolicy(fixed=DEFAULT_MAX_NEW_TOKENS)
    arrivals = [rec[0] for rec in records]
    prompts = np.array([rec[1] for rec in records], dtype=np.int64)
    completions = np.array([rec[2] for rec in records], dtype=np.int64)
    caps_given = [rec[3] for rec in records]
    fallback = policy.apply(completions)
    caps = np.array(
        [cap if cap is not None else fallback[i] for i, cap in enumerate(caps_given)], dtype=np.int64
    )
    caps = np.maximum(caps, completions)
    offsets: np.ndarray | None = None
    if rate is None and all(a is not None for a in arrivals):
        times = np.array(arrivals, dtype=float)
        order = np.argsort(times, kind="stable")
        prompts, completions, caps = prompts[order], completions[order], caps[order]
        offsets = (times[order] - times[order][0]) / speed
    return ReplayTrace(
        offsets=offsets,
        input_tokens=prompts,
        output_tokens=completions,
        max_new_tokens=caps,
        rate=(rate if rate is not None else DEFAULT_REPLAY_RATE) * speed,
        speed=speed,
        loop=loop,
        source=str(path),
    )


# --------------------------------------------------------------------------- the workload


@dataclass(frozen=True)
class Workload:
    """A named request stream. `arrivals(rng, start, end)` yields RequestSpecs in time order."""

    name: str
    description: str = ""
    server: str | None = None  # the shipped server config it is meant for, if any
    arrival: ArrivalProcess = field(default_factory=ArrivalProcess)
    classes: tuple[RequestClass, ...] = ()
    phases: tuple[Phase, ...] = ()
    phases_repeat: bool = True
    spikes: tuple[Spike, ...] = ()
    replay: ReplayTrace | None = None
    sessions: tuple[SessionClass, ...] = ()

    # ----------------------------------------------------------------- public

    def scaled(self, factor: float) -> Workload:
        """The same traffic shape with every arrival rate (base, phases, spikes, sessions) times `factor`."""
        if not factor > 0:
            raise ValueError(f"rate factor must be > 0, got {factor}")
        if self.replay is not None:
            trace = self.replay
            offsets = trace.offsets / factor if trace.offsets is not None else None
            return replace(
                self,
                replay=replace(trace, offsets=offsets, rate=trace.rate * factor, speed=trace.speed * factor),
            )
        arrival = replace(
            self.arrival,
            rate=self.arrival.rate * factor,
            on_rate=self.arrival.on_rate * factor,
            off_rate=self.arrival.off_rate * factor,
        )
        phases = tuple(replace(p, rate=p.rate * factor if p.rate is not None else None) for p in self.phases)
        spikes = tuple(replace(sp, rate=sp.rate * factor) for sp in self.spikes)
        sessions = tuple(replace(se, rate=se.rate * factor) for se in self.sessions)
        return replace(self, arrival=arrival, phases=phases, spikes=spikes, sessions=sessions)

    def arrivals(
        self, rng: np.random.Generator | int | None, start: float = 0.0, end: float = math.inf
    ) -> Iterator[RequestSpec]:
        """Requests arriving in [start, end), in time order. `end` may be infinite (lazy)."""
        generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        source = (
            self._replay_blocks(generator) if self.replay is not None else self._parametric_blocks(generator)
        )
        for block_end, block in source:
            for spec in block:
                if spec.time >= end:
                    return
                if spec.time >= start:
                    yield spec
            if block_end >= end:
                return

    def requests(self, seed: int, duration: float) -> list[RequestSpec]:
        return list(self.arrivals(np.random.default_rng(seed), 0.0, duration))

    def mean_context(self, seed: int = 0, duration: float = 3600.0) -> float:
        """Mean input + output tokens of the requests arriving in [0, duration) under `seed`."""
        specs = self.requests(seed, duration)
        if not specs:
            return float("nan")
        return float(np.mean([s.input_tokens + s.output_tokens for s in specs]))

    @property
    def mean_rate(self) -> float:
        if self.replay is not None:
            if (
                self.replay.offsets is not None
                and len(self.replay.offsets) > 1
                and self.replay.offsets[-1] > 0
            ):
                return len(self.replay.offsets) / float(self.replay.offsets[-1])
            return self.replay.rate
        sessions = sum(se.rate * se.turns.mean for se in self.sessions)
        return (self.arrival.mean_rate if self.classes else 0.0) + sessions

    # ----------------------------------------------------------------- parametric

    def _phase_at(self, t: float) -> Phase | None:
        if not self.phases:
            return None
        cycle = sum(p.duration for p in self.phases)
        if not self.phases_repeat and t >= cycle:
            return self.phases[-1]
        offset = t % cycle
        for phase in self.phases:
            if offset < phase.duration:
                return phase
            offset -= phase.duration
        return self.phases[-1]

    def _phase_breakpoints(self, start: float, end: float) -> list[float]:
        if not self.phases:
            return []
        cycle = sum(p.duration for p in self.phases)
        points = []
        k = math.floor(start / cycle)
        while k * cycle < end:
            if not self.phases_repeat and k >= 1:
                break
            edge = k * cycle
            for phase in self.phases:
                if start < edge < end:
                    points.append(edge)
                edge += phase.duration
            k += 1
        return points

    def _silent_after(self) -> float:
        """The time after which no request can arrive (inf for every endless process)."""
        if not self.phases or self.phases_repeat or self.spikes:
            return math.inf
        last = self.phases[-1]
        silent = (
            last.rate_scale == 0 or last.rate == 0 or (last.weights is not None and sum(last.weights) == 0)
        )
        return sum(p.duration for p in self.phases) if silent else math.inf

    def _parametric_blocks(self, rng: np.random.Generator) -> Iterator[tuple[float, list[RequestSpec]]]:
        """(block end, the block's requests) for consecutive blocks of BLOCK_SECONDS from t = 0."""
        base_weights = np.array([c.weight for c in self.classes], dtype=float)
        all_classes = list(self.classes) + [s.request_class for s in self.spikes]
        silent_after = self._silent_after()
        pending: list[tuple[float, int, RequestSpec]] = []  # later turns of sessions already started
        started = 0
        pushed = 0
        block = 0
        while True:
            b0, b1 = block * BLOCK_SECONDS, (block + 1) * BLOCK_SECONDS
            if b0 >= silent_after:
                return
            block += 1
            turns: list[RequestSpec] = []
            for session_class in self.sessions:
                count = int(rng.poisson(session_class.rate * BLOCK_SECONDS))
                for start in np.sort(rng.uniform(b0, b1, count)).tolist():
                    sid = f"{session_class.name}-{started}"
                    started += 1
                    for spec in session_class.session(rng, start, sid):
                        heapq.heappush(pending, (spec.time, pushed, spec))
                        pushed += 1
            while pending and pending[0][0] < b1:
                turns.append(heapq.heappop(pending)[2])
            times_parts: list[np.ndarray] = []
            class_parts: list[np.ndarray] = []
            edges = sorted({b0, b1, *self.arrival.breakpoints(b0, b1), *self._phase_breakpoints(b0, b1)})
            for t0, t1 in pairwise(edges if self.classes else ()):
                mid = (t0 + t1) / 2
                phase = self._phase_at(mid)
                scale = phase.rate_scale if phase is not None else 1.0
                peak = self.arrival.constant_rate(mid)
                if phase is not None and phase.rate is not None:
                    peak = phase.rate
                peak *= scale
                count = int(rng.poisson(peak * (t1 - t0))) if peak > 0 else 0
                times = np.sort(rng.uniform(t0, t1, count))
                if self.arrival.process == "diurnal" and count:
                    keep = rng.uniform(0.0, 1.0, count) * peak < self.arrival.diurnal_rate(times) * scale
                    times = times[keep]
                weights = (
                    np.array(phase.weights)
                    if phase is not None and phase.weights is not None
                    else base_weights
                )
                total = weights.sum()
                if total <= 0 or len(times) == 0:
                    continue
                times_parts.append(times)
                class_parts.append(rng.choice(len(self.classes), size=len(times), p=weights / total))
            for index, spike in enumerate(self.spikes):
                k = max(0, math.floor((b0 - spike.start) / spike.every))
                while spike.start + k * spike.every < b1:
                    w0 = max(b0, spike.start + k * spike.every)
                    w1 = min(b1, spike.start + k * spike.every + spike.duration)
                    if w1 > w0:
                        count = int(rng.poisson(spike.rate * (w1 - w0)))
                        times_parts.append(np.sort(rng.uniform(w0, w1, count)))
                        class_parts.append(np.full(count, len(self.classes) + index, dtype=np.int64))
                    k += 1
            if not times_parts:
                yield b1, turns
                continue
            times = np.concatenate(times_parts)
            kinds = np.concatenate(class_parts).astype(np.int64)
            inputs = np.zeros(len(times), dtype=np.int64)
            outputs = np.zeros(len(times), dtype=np.int64)
            caps = np.zeros(len(times), dtype=np.int64)
            groups = np.full(len(times), -1, dtype=np.int64)
            for kind, request_class in enumerate(all_classes):
                mask = kinds == kind
                count = int(mask.sum())
                if count == 0:
                    continue
                inputs[mask] = request_class.input.sample(rng, count)
                out = request_class.output.sample(rng, count)
                cap = request_class.max_new.apply(out, rng)
                outputs[mask] = np.minimum(out, cap)
                caps[mask] = cap
                if request_class.prefix_groups:
                    groups[mask] = rng.integers(0, request_class.prefix_groups, count)
            order = np.argsort(times, kind="stable")
            specs = []
            for i in order.tolist():
                request_class = all_classes[kinds[i]]
                group = None
                prefix = 0
                if groups[i] >= 0:
                    prefix = min(request_class.prefix_tokens, int(inputs[i]) - 1)
                    if prefix > 0:
                        group = f"{request_class.name}-{groups[i]}"
                    else:
                        prefix = 0
                specs.append(
                    RequestSpec(float(times[i]), int(inputs[i]), int(outputs[i]), int(caps[i]), group, prefix)
                )
            if turns:
                specs = sorted(specs + turns, key=lambda spec: spec.time)
            yield b1, specs

    # ----------------------------------------------------------------- replay

    def _replay_blocks(self, rng: np.random.Generator) -> Iterator[tuple[float, list[RequestSpec]]]:
        """(pass end, the requests) for each pass over the trace; later passes start after it."""
        trace = self.replay
        assert trace is not None
        count = len(trace.input_tokens)
        base = 0.0
        while True:
            if trace.offsets is not None:
                times = base + trace.offsets
                span = float(trace.offsets[-1]) if count > 1 else 0.0
                gap = span / (count - 1) if count > 1 and span > 0 else 1.0
                next_base = base + span + gap
            else:
                gaps = rng.exponential(1.0 / trace.rate, count)
                times = base + np.cumsum(gaps)
                next_base = float(times[-1])
            yield (
                next_base,
                [
                    RequestSpec(
                        float(times[i]),
                        int(trace.input_tokens[i]),
                        int(trace.output_tokens[i]),
                        int(trace.max_new_tokens[i]),
                    )
                    for i in range(count)
                ],
            )
            if not trace.loop:
                return
            base = next_base


# --------------------------------------------------------------------------- loading

_TOP_LEVEL = {
    "name",
    "description",
    "server",
    "arrival",
    "classes",
    "phases",
    "phases_repeat",
    "spikes",
    "replay",
    "sessions",
}


def _seconds_as_ms(data: Any, where: str) -> LengthDist:
    """A think-time distribution given in seconds, sampled as integer milliseconds."""
    spec = dict(_mapping(data, where))
    for key in ("median", "mean", "fixed", "min", "max"):
        if key in spec:
            spec[key] = _num(spec[key], f"{where}.{key}", minimum=0.001) * 1000
    for key in ("min", "max"):
        if key in spec:
            spec[key] = int(round(spec[key]))
    return _length(spec, where)


def _session_class(data: Any, where: str, default_name: str) -> SessionClass:
    spec = _mapping(data, where)
    known = {
        "name", "rate", "turns", "first_input", "turn_input", "output", "max_new_tokens", "think_seconds",
        "response_seconds_per_token", "max_context",
    }
    _only(spec, known, where)
    for required in ("rate", "turns", "first_input", "turn_input", "output"):
        if required not in spec:
            raise InputError(f"{where}.{required} is required")
    return SessionClass(
        name=str(spec.get("name", default_name)),
        rate=_num(spec["rate"], f"{where}.rate", minimum=0, strict=True),
        turns=_length(spec["turns"], f"{where}.turns"),
        first_input=_length(spec["first_input"], f"{where}.first_input"),
        turn_input=_length(spec["turn_input"], f"{where}.turn_input"),
        output=_length(spec["output"], f"{where}.output"),
        max_new=_max_new(spec.get("max_new_tokens"), f"{where}.max_new_tokens"),
        think_seconds=_seconds_as_ms(spec.get("think_seconds", {"median": 5, "sigma": 1.0}), f"{where}.think_seconds"),
        response_seconds_per_token=_num(
            spec.get("response_seconds_per_token", 0.03), f"{where}.response_seconds_per_token"
        ),
        max_context=_int(spec.get("max_context", 200_000), f"{where}.max_context"),
    )


def workload_from_dict(data: Any, *, name: str = "custom", base_dir: Path | None = None) -> Workload:
    """Build a Workload from a parsed YAML mapping. Errors are InputError naming the field."""
    spec = _mapping(data, "workload")
    _only(spec, _TOP_LEVEL, "workload")
    name = str(spec.get("name", name))
    description = str(spec.get("description", ""))
    server = spec.get("server")
    if server is not None and not isinstance(server, str):
        raise InputError(f"server must be the name of a server config, got {server!r}")
    if spec.get("replay") is not None:
        for key in ("classes", "arrival", "phases", "spikes"):
            if key in spec:
                raise InputError(f"{key} cannot be combined with replay")
        replay = _mapping(spec["replay"], "replay")
        _only(replay, {"path", "rate", "speed", "loop", "max_new_tokens"}, "replay")
        if "path" not in replay or not isinstance(replay["path"], str):
            raise InputError("replay.path is required (the log file to replay)")
        path = Path(replay["path"])
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        rate = _num(replay["rate"], "replay.rate", minimum=0, strict=True) if "rate" in replay else None
        loop = replay.get("loop", True)
        if not isinstance(loop, bool):
            raise InputError(f"replay.loop must be true or false, got {loop!r}")
        trace = load_replay(
            path,
            rate=rate,
            speed=_num(replay.get("speed", 1.0), "replay.speed", minimum=0, strict=True),
            loop=loop,
            max_new=_max_new(replay.get("max_new_tokens"), "replay.max_new_tokens"),
        )
        return Workload(name=name, description=description, server=server, replay=trace)

    raw_sessions = spec.get("sessions") or []
    if not isinstance(raw_sessions, list):
        raise InputError("sessions must be a list")
    sessions = tuple(_session_class(c, f"sessions[{i}]", f"session{i}") for i, c in enumerate(raw_sessions))
    if "classes" not in spec and not sessions:
        raise InputError("classes is required (or replay, or sessions)")
    raw_classes = spec.get("classes", [])
    if not isinstance(raw_classes, list) or (not raw_classes and not sessions):
        raise InputError("classes must be a non-empty list")
    classes = tuple(_request_class(c, f"classes[{i}]", f"class{i}") for i, c in enumerate(raw_classes))
    names = [c.name for c in classes] + [c.name for c in sessions]
    if len(set(names)) != len(names):
        raise InputError(f"classes: duplicate class names {names}")
    names = [c.name for c in classes]
    if classes and sum(c.weight for c in classes) <= 0:
        raise InputError("classes: the weights must not all be 0")
    if "arrival" not in spec and classes:
        raise InputError("arrival is required (e.g. {process: poisson, rate: 5})")
    arrival = _arrival(spec["arrival"]) if "arrival" in spec else ArrivalProcess()

    phases: list[Phase] = []
    raw_phases = spec.get("phases") or []
    if not isinstance(raw_phases, list):
        raise InputError("phases must be a list")
    for i, raw in enumerate(raw_phases):
        where = f"phases[{i}]"
        phase = _mapping(raw, where)
        _only(phase, {"duration", "rate_scale", "rate", "weights"}, where)
        if "duration" not in phase:
            raise InputError(f"{where}.duration is required")
        weights = None
        if phase.get("weights") is not None:
            given = _mapping(phase["weights"], f"{where}.weights")
            for key in given:
                if key not in names:
                    raise InputError(f"{where}.weights.{key} is not a class (classes: {', '.join(names)})")
            weights = tuple(_num(given.get(n, 0.0), f"{where}.weights.{n}") for n in names)
            if sum(weights) <= 0:
                raise InputError(f"{where}.weights must not all be 0")
        rate = None
        if "rate" in phase:
            if arrival.process != "poisson":
                raise InputError(f"{where}.rate needs a poisson arrival process; use rate_scale")
            rate = _num(phase["rate"], f"{where}.rate")
        phases.append(
            Phase(
                duration=_num(phase["duration"], f"{where}.duration", minimum=0, strict=True),
                rate_scale=_num(phase.get("rate_scale", 1.0), f"{where}.rate_scale"),
                rate=rate,
                weights=weights,
            )
        )
    phases_repeat = spec.get("phases_repeat", True)
    if not isinstance(phases_repeat, bool):
        raise InputError(f"phases_repeat must be true or false, got {phases_repeat!r}")

    spikes: list[Spike] = []
    raw_spikes = spec.get("spikes") or []
    if not isinstance(raw_spikes, list):
        raise InputError("spikes must be a list")
    for i, raw in enumerate(raw_spikes):
        where = f"spikes[{i}]"
        spike = _mapping(raw, where)
        _only(spike, {"every", "duration", "rate", "start", "class"}, where)
        for required in ("every", "duration", "rate", "class"):
            if required not in spike:
                raise InputError(f"{where}.{required} is required")
        every = _num(spike["every"], f"{where}.every", minimum=0, strict=True)
        duration = _num(spike["duration"], f"{where}.duration", minimum=0, strict=True)
        if duration > every:
            raise InputError(f"{where}.duration ({duration}) must be <= every ({every})")
        raw_class = spike["class"]
        if isinstance(raw_class, str):
            if raw_class not in names:
                raise InputError(f"{where}.class {raw_class!r} is not a class (classes: {', '.join(names)})")
            request_class = classes[names.index(raw_class)]
        else:
            request_class = _request_class(raw_class, f"{where}.class", f"spike{i}")
        spikes.append(
            Spike(
                every=every,
                duration=duration,
                rate=_num(spike["rate"], f"{where}.rate", minimum=0, strict=True),
                start=_num(spike.get("start", every / 2), f"{where}.start"),
                request_class=request_class,
            )
        )
    return Workload(
        name=name,
        description=description,
        server=server,
        arrival=arrival,
        classes=classes,
        phases=tuple(phases),
        phases_repeat=phases_repeat,
        spikes=tuple(spikes),
        sessions=sessions,
    )


def available_workloads() -> list[str]:
    return sorted(path.stem for path in WORKLOADS_DIR.glob("*.yaml"))


def load_workload(path_or_name: str | None) -> Workload:
    """A workload from a YAML file, a shipped name ("bimodal-chat-docs"), or a request log to replay
    (a JSON-lines file); None gives the shipped default."""
    target = path_or_name if path_or_name is not None else DEFAULT_WORKLOAD
    path = Path(target)
    if not path.is_file():
        shipped = WORKLOADS_DIR / f"{target}.yaml"
        if "/" in target or not shipped.is_file():
            raise InputError(
                f"workload {target!r} is neither a file nor a shipped workload ({', '.join(available_workloads())})"
            )
        path = shipped
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"workload {path}: {exc.strerror}") from None
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first.lstrip().startswith("{") or _LINE_TS.match(first):
        # A request log: replay it as is.
        return Workload(name=path.stem, description=f"replay of {path.name}", replay=load_replay(path))
    data = load_yaml(text.encode("utf-8"), f"workload {path.name}", MAX_WORKLOAD_YAML_BYTES)  # no aliases
    try:
        return workload_from_dict(data, name=path.stem, base_dir=path.parent)
    except InputError as exc:
        raise InputError(f"workload {path.name}: {exc}") from None
