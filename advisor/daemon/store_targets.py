"""The daemon's `kind: prometheus` targets: one store stands for every SGLang server its selector matches.

Each cycle asks the store the fixed query set once (`advisor.sources.fleet_queries.fleet_queries`), whatever the
fleet size, and hands every server its observation; each server then runs the one server cycle
(`ServerPipeline` over a `StoreServerSource`), so estimates, exported series, `/` and `/status` are the same.
At start every server's estimator is replayed from the store's history (VPA's history init); servers appear
with the store and are forgotten `forget_after_seconds` after they leave it. The fleet is checkpointed like a
direct target (each server's `ServerState`) plus the store time read up to: a restart resumes every server
and reads the store only from there on (never further back than `history`).
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any

from advisor.config import AdvisorConfig, TargetConfig
from advisor.daemon.pipeline import InfoAnswer, LogReading, ReplayBudget, ServerPipeline, ServerResult
from advisor.daemon.targets import DirectSource, StandInSource
from advisor.sources.fleet_queries import (
    FleetFrame,
    KnownRows,
    fleet_queries,
    replay_step,
    server_info_from_gauges,
    shard_of,
)
from advisor.sources.http import Received
from advisor.sources.metrics import MetricsObservation
from advisor.sources.prometheus_store import (
    PrometheusClient,
    store_answer_caps,
    too_many_servers,
)
from advisor.sources.server_info import ServerInfo
from advisor.store_config import StoreTargetConfig

log = logging.getLogger("pool_advisor")

# Samples (rows x points) per range query of the history replay: bounds the store's answer and the frame held
# in memory (~100-250 bytes a sample), whatever the fleet size; Prometheus itself refuses > 11000 points a
# series. Each row also costs its labels once, so more points a row make the replay cheaper per sample (1000
# servers x 6 h: 57 s at 400,000, 38 s at 1,200,000, whose peak RSS is 380 MB).
REPLAY_SAMPLES_PER_QUERY = 1_200_000
MAX_POINTS_PER_SERIES = 11_000
# The order the fixed queries are sent in, by kind (`_frame`).
SEND_ORDER = {"counter": 0, "histogram": 1, "rank": 2}
# /server_info requests in flight at once when many servers are due together (start, every server_info_every).
SERVER_INFO_WORKERS = 32


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a fleet's store answers and server cycles: they allocate
    millions of small objects that all survive the cycle, and each allocation-triggered collection rescans
    every live one (1000 servers x 6 h: 35 s of start-up with it, 27 s without). Reference counting still
    frees everything as usual; the collector resumes when the last pauser (targets run on threads) ends."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


class StoreServerSource(StandInSource):
    """One server seen through the store: metrics handed in by the fleet from its one query set; /server_info
    asked of the server when reachable, else stood in for by the pool gauges (with the ratio assumed)."""

    def __init__(self, name: str, target: TargetConfig, store: StoreTargetConfig, config: AdvisorConfig,
                 asks_server: bool) -> None:
        self.name = name
        self.store = store
        self.asks_server = asks_server
        self.direct = DirectSource(target, config) if asks_server else None
        self.pending: MetricsObservation | None = None
        self.pending_error: str | None = None
        self.last_seen: float | None = None
        self.prefetched: tuple[ServerInfo | None, str | None] | None = None

    def hand(self, observation: MetricsObservation | None, error: str | None, seen_at: float | None) -> None:
        self.pending, self.pending_error = observation, error
        if observation is not None and seen_at is not None:
            self.last_seen = seen_at

    def read_logs(self) -> LogReading:
        return LogReading()

    def fetch_metrics(self) -> tuple[MetricsObservation | None, str | None]:
        observation, error = self.pending, self.pending_error
        self.pending, self.pending_error = None, None
        if observation is None:
            return None, error or f"{self.name} is not in the store's latest samples"
        return observation, None

    def prefetch_server_info(self) -> None:
        """Ask /server_info now (the fleet does this for many servers at once); the cycle uses the answer."""
        if self.direct is not None:
            self.prefetched = self.direct.ask_server_info()

    def fetch_server_info(self, latest: MetricsObservation | None) -> InfoAnswer:
        error = None
        if self.direct is not None:
            prefetched, self.prefetched = self.prefetched, None
            info, error = prefetched if prefetched is not None else self.direct.ask_server_info()
            if info is not None:
                return InfoAnswer(info)
        gauges = self.pending or latest
        stand_in = server_info_from_gauges(gauges, assumed_ratio=self.store.assumed_ratio) if gauges else None
        if stand_in is None:
            return InfoAnswer(None, error or "no /server_info and no pool gauges in the store to stand in for it")
        note = (f"byte constants from the store's pool gauges with the live ratio assumed {self.store.assumed_ratio:g} "
                "(no gauge carries it): set assumed_ratio, or let the advisor reach /server_info")
        # counted: the operator asked for /server_info and it did not answer
        return InfoAnswer(stand_in, f"{error}; using the pool gauges" if error else None,
                          note=("constants_from_pool_gauges", note))



class StoreFleet:
    """Every server one store holds (a `Target`): a constant number of queries per cycle, then each server's
    own cycle, the same as a direct server's."""

    checkpointed = True  # each server's ServerState, and the store time read up to (`checkpoint_state`)

    def __init__(self, store: StoreTargetConfig, config: AdvisorConfig,
                 wall_clock: Callable[[], float] = time.time, *, quiet: bool = False) -> None:
        self.store = store
        self.name = f"store:{store.name}"
        self.quiet = quiet  # the one-shot reports store errors itself, in one line
        self.config = config
        max_series, max_body_bytes = store_answer_caps(store.max_servers_per_store)
        self.client = PrometheusClient(store.url, timeout_seconds=store.timeout_seconds, auth=store.auth,
                                       max_series=max_series, max_body_bytes=max_body_bytes)
        self.queries = fleet_queries(store.matchers, store.server_labels)
        # Each query's last instant answer as resolved to servers and slots (reused while its labels stay the same)
        self.known_rows = {query.name: KnownRows() for query in self.queries}
        self.pipelines: dict[str, ServerPipeline] = {}
        self.sources: dict[str, StoreServerSource] = {}
        self.labels: dict[str, dict[str, str]] = {}  # each server's server-label values
        self.bootstrapped = False
        self.last_error: str | None = None
        self.store_errors_total = 0
        # (store time, advisor time) of the last store evaluation every server's state has read: the checkpoint
        # keeps it, and a restart's history replay starts there instead of `history` back.
        self.read_until: tuple[float, float] | None = None
        self.resumed_from: float | None = None  # the store time a restart resumed from (None: a cold start)
        self.last_replay_budget: ReplayBudget | None = None  # what the last cycle's replays spent and deferred
        self._wall_clock = wall_clock

    @property
    def queries_per_cycle(self) -> int:
        return len(self.queries)

    def servers(self) -> list[ServerPipeline]:
        return [self.pipelines[name] for name in sorted(list(self.pipelines))]

    def _pipeline(self, name: str, frame: FleetFrame) -> ServerPipeline:
        return self._pipeline_of(name, frame.server_label_values.get(name, {}))

    def _pipeline_of(self, name: str, labels: dict[str, str]) -> ServerPipeline:
        pipeline = self.pipelines.get(name)
        if pipeline is None:
            base = self.store.server_info_base(labels)
            target = TargetConfig(name=name, url=base or self.store.url, api_key=self.store.server_api_key)
            source = self.sources[name] = StoreServerSource(name, target, self.store, self.config, bool(base))
            pipeline = self.pipelines[name] = ServerPipeline(target, self.config, source)
            self.labels[name] = dict(labels)
        return pipeline

    # -- checkpoint -----------------------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        """What the checkpoint keeps of the fleet beside each server's state: the store time read up to and
        every server's labels and last sighting (so a restart knows its servers before the store answers)."""
        return {
            "read_until": self.read_until[0] if self.read_until else None,
            "read_until_advisor": self.read_until[1] if self.read_until else None,
            "servers": {name: {"labels": self.labels.get(name, {}), "last_seen": self.sources[name].last_seen}
                        for name in sorted(self.pipelines)},
        }

    def resume(self, saved: Any) -> None:
        """Take the fleet's checkpoint entry (before the servers' own entries are restored): recreate its
        servers (those still in this shard) and the store time to read on from. Anything malformed: a cold
        start, replaying the whole history."""
        if not isinstance(saved, dict) or not isinstance(saved.get("servers"), dict):
            return
        wall: Any = saved.get("read_until")
        advisor: Any = saved.get("read_until_advisor")
        if not (_finite(wall) and _finite(advisor)):
            return
        shard = self.store.shard
        for name, entry in saved["servers"].items():
            labels = entry.get("labels") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not isinstance(labels, dict):
                continue
            labels = {str(k): str(v) for k, v in labels.items() if k in self.store.server_labels}
            if shard is not None and shard_of([labels.get(k, "") for k in self.store.server_labels],
                                              shard.total) != shard.index:
                continue  # the shards were redrawn: another advisor owns it now
            self._pipeline_of(name, labels)
            if _finite(entry.get("last_seen")):
                self.sources[name].last_seen = float(entry["last_seen"])
        self.read_until = (float(wall), float(advisor))

    def _forget(self, name: str) -> None:
        self.pipelines.pop(name).close()
        del self.sources[name]
        self.labels.pop(name, None)

    def _frame(self, send: Callable[[str], Received]) -> tuple[FleetFrame, str | None]:
        """The fixed queries' answers read into one frame, in order. Each query is sent (and its answer
        received, undecoded) on a helper thread one query ahead: the store works out the next answer while
        this thread decodes the last one, and at most one undecoded answer waits beside it."""
        frame = self._empty_frame()
        # The small counters answer first (the store's work on it cannot overlap ours) and the rank gauges
        # last (nor can our decoding of it): the two large histogram answers overlap both ways.
        queries = sorted(self.queries, key=lambda query: SEND_ORDER.get(query.kind, len(SEND_ORDER)))
        ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-ahead")
        try:
            pending = ahead.submit(send, queries[0].expr)
            for index, query in enumerate(queries):
                received = pending.result()
                if index + 1 < len(queries):
                    pending = ahead.submit(send, queries[index + 1].expr)
                # Rows go into the frame as they are decoded, their labels as the store sent them (the frame
                # scrubs the few it keeps: server and model names); a label value that is no string fails
                # the answer as malformed.
                known = self.known_rows[query.name]
                result = self.client.read(received, scrub_labels=False, take=partial(frame.add, query),
                                          take_texts=partial(frame.add_texts, query, known=known),
                                          known_digest=known.digest)
                del received
                if not result.ok:
                    return self._empty_frame(), result.error or "store query failed"
                cap = self.store.max_servers_per_store
                if too_many_servers(len(frame.samples), cap):  # each server would get its own pipeline: refuse, counted
                    return self._empty_frame(), too_many_servers(len(frame.samples), cap)
            return frame, None
        finally:
            ahead.shutdown(wait=False)  # a failed frame does not wait for the query already sent

    def _empty_frame(self) -> FleetFrame:
        shard = self.store.shard
        return FleetFrame(self.store.server_labels, (shard.index, shard.total) if shard is not None else None)

    def history_windows(self, end: float, points: int, since: float | None = None) -> Iterator[tuple[float, float, float]]:
        """(start, end, step) of the range queries that replay `history_seconds` up to `end` (from `since`
        when that is later: a resumed checkpoint's store time), `points` a query. The last replay window
        (`replay_window_seconds`, what the what-if replay and the spikiness windows read closely) comes at
        `step`; older history only feeds the decaying histograms, so it comes at `coarse_history_step`
        (half the half-life): its counter deltas carry the same requests in a fraction of the samples, each
        chunk decayed as of its end (its oldest requests weigh up to 41% more than sample by sample would
        give them, in history that already weighs less than 71% of now's)."""
        history = self.store.history_seconds
        step = self.store.step_seconds or replay_step(history)
        start = end - history if since is None else max(end - history, since)
        coarse = max(step, self.coarse_history_step)
        fine_from = end - self.config.replay_window_seconds / self.config.time_scale
        segments = []
        if coarse > step and fine_from - start >= coarse:
            boundary = start + coarse * math.floor((fine_from - start) / coarse)
            segments.append((start, boundary, coarse))
            start = boundary + step
        segments.append((start, end, step))
        for first, last, every in segments:
            span = every * max(1, points - 1)
            while first <= last:
                stop = min(last, first + span)
                yield first, stop, every
                if stop >= last:
                    break
                first = stop + every

    @property
    def coarse_history_step(self) -> float:
        """Store seconds between the samples of history older than the replay window (half-life / 2)."""
        return self.config.half_life_seconds / 2 / self.config.time_scale

    def bootstrap(self, now: float) -> int:
        """`_bootstrap` with the garbage collector paused (`gc_paused`)."""
        with gc_paused():
            return self._bootstrap(now)

    def _bootstrap(self, now: float) -> int:
        """Replay the store's history into every server's estimator, the last sample at advisor time `now`
        (history runs `time_scale` times faster in advisor time, as live cycles do). After a checkpoint the
        replay starts at the store time the checkpoint had read up to: its sample there is each resumed
        server's baseline, and store time from there to now maps onto advisor time from the checkpoint's to
        `now`. Returns the samples fed; a failed query stops the replay with what was read."""
        self.bootstrapped = True
        wall_end = self._wall_clock()
        scale = self.config.time_scale
        since, resume_at, resume_scale = None, 0.0, 1.0
        if self.read_until is not None and self.read_until[0] < wall_end and self.read_until[1] < now:
            since = self.resumed_from = max(self.read_until[0], wall_end - self.store.history_seconds)
            resume_at = max(self.read_until[1], now - (wall_end - since) * scale)
            resume_scale = (now - resume_at) / (wall_end - since)
        # One instant look sizes the range queries: rows now x points per query stays within the budget.
        probe, error = self._frame(lambda expr: self.client.send_query(expr, at=wall_end))
        if error:
            self._store_error(error)
            return 0
        points = max(2, min(MAX_POINTS_PER_SERIES, REPLAY_SAMPLES_PER_QUERY // max(1, probe.values_added)))
        del probe
        fed = 0
        for start, stop, step in self.history_windows(wall_end, points, since):
            frame, error = self._frame(partial(self._range, start=start, end=stop, step=step))
            if error:
                self._store_error(error)
                break
            self._prefetch_server_info([name for name in frame.servers()
                                        if name not in self.pipelines or self.pipelines[name].server_info is None],
                                       frame)
            for name in frame.servers():
                pipeline = self._pipeline(name, frame)
                for t, observation in frame.pop_observations(name):
                    at = now - (wall_end - t) * scale if since is None else resume_at + (t - since) * resume_scale
                    self.sources[name].hand(observation, None, at)
                    pipeline.feed_history(at)
                    fed += 1
        return fed

    def _prefetch_server_info(self, names: list[str], frame: FleetFrame | None = None) -> None:
        """/server_info of many servers side by side: unreachable ones cost one timeout per batch of
        SERVER_INFO_WORKERS, not one each."""
        if frame is not None:
            for name in names:
                self._pipeline(name, frame)
        due = [self.sources[name] for name in names if self.sources[name].asks_server]
        if len(due) < 2:
            return  # one server asks in its own cycle
        with ThreadPoolExecutor(max_workers=min(SERVER_INFO_WORKERS, len(due)), thread_name_prefix="server-info") as pool:
            list(pool.map(StoreServerSource.prefetch_server_info, due))

    def _range(self, expr: str, *, start: float, end: float, step: float) -> Received:
        return self.client.send_query_range(expr, start, end, step)

    def _store_error(self, error: str) -> None:
        self.last_error = error
        self.store_errors_total += 1
        if not self.quiet:
            log.warning("store %s: %s", self.store.name, error)

    def cycle(self, now: float) -> list[ServerResult]:
        """One cycle (`_cycle`) with the garbage collector paused (`gc_paused`)."""
        with gc_paused():
            return self._cycle(now)

    def _cycle(self, now: float) -> list[ServerResult]:
        """One cycle: the fixed queries at the store's now, then every known server's own cycle."""
        if not self.bootstrapped:
            self.bootstrap(now)
        at = self._wall_clock()  # one evaluation time: every query's rows share the server's timestamp
        frame, error = self._frame(lambda expr: self.client.send_query(expr, at=at))
        if error:  # a partial answer would read as vanished families (a restart): use none of it
            self._store_error(error)
            frame = self._empty_frame()
        else:
            self.last_error = None
            self.read_until = (at, now)
        seen = set(frame.servers())
        for name in seen:
            observations = frame.pop_observations(name)
            self._pipeline(name, frame)
            self.sources[name].hand(observations[-1][1] if observations else None, None, now)
        self._prefetch_server_info([name for name, p in self.pipelines.items() if p.server_info_due_next()])
        results = []
        # The what-if replays share one budget: the servers whose curve is oldest (or missing) go first.
        budget = self.last_replay_budget = ReplayBudget(self.config.replay_budget)
        for name in sorted(self.pipelines, key=self._replay_age_key):
            source = self.sources[name]
            if name not in seen:
                source.hand(None, f"store {self.store.name}: {error}" if error else None, None)
                last = source.last_seen
                if error is None and (last is None or now - last > self.store.forget_after_seconds):
                    self._forget(name)
                    continue
            results.append(self.pipelines[name].run(now, budget))
        results.sort(key=lambda result: result.status.server)
        return results

    def _replay_age_key(self, name: str) -> tuple[float, str]:
        replayed = self.pipelines[name].replay_time
        return (-math.inf if replayed is None else replayed, name)

    def close(self) -> None:
        for name in list(self.pipelines):
            self._forget(name)
        self.client.close()


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


__all__ = ["StoreFleet", "StoreServerSource", "gc_paused"]
