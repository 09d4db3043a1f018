"""export.snapshot: what the daemon publishes once per cycle and every page renders from. A `Snapshot` holds
each server's `ServerView`: its status (/metrics, /status, the table of `/`) and what only `/` draws (the pool
model, the context-length histogram, the recommendation history). `SnapshotStore` holds the last one for the
readers, and the daemon's cycle-step latency histogram."""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prometheus_client import Histogram

from advisor.recommend.types import Recommendation
from advisor.status import TargetStatus

if TYPE_CHECKING:
    from advisor.recommend.engine import ServerModel

log = logging.getLogger(__name__)

METRIC_PREFIX = "sglang_advisor"


def metric_name(suffix: str) -> str:
    return f"{METRIC_PREFIX}_{suffix}"


# The daemon's cycle steps timed into sglang_advisor_cycle_step_duration_seconds (pre-created at 0 so
# every step has a series from the first scrape). Per-target steps come from the pipeline when it reports
# them; `target` is one target's whole cycle, `cycle` all targets plus the checkpoint.
CYCLE_STEPS = ("logs", "metrics", "server_info", "recommend", "target", "checkpoint", "cycle")
STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Points of recommendation history kept per server for the landing page (a day at the 15 s default
# would be 5760; 720 is three hours, enough to see a trend without holding much).
HISTORY_POINTS = 720


@dataclass(frozen=True)
class HistoryPoint:
    """One cycle's recommendation for one server, as the landing page's history chart draws it."""

    time: float
    ratio: float | None
    ratio_lower: float | None
    ratio_upper: float | None
    live_ratio: float | None
    decision: str | None


def history_point(rec: Recommendation | None, now: float) -> HistoryPoint:
    return HistoryPoint(
        time=float(now),
        ratio=rec.ratio if rec else None,
        ratio_lower=rec.ratio_lower if rec else None,
        ratio_upper=rec.ratio_upper if rec else None,
        live_ratio=rec.live_ratio if rec else None,
        decision=rec.decision if rec else None,
    )


@dataclass(frozen=True)
class ServerView:
    """Everything the exporter shows of one server after a cycle: its status (/metrics, /status, the table of
    `/`) and what only `/` draws: the pool model (an advisor.recommend.engine.ServerModel), the context-length
    histogram's weights and the recommendation history."""

    status: TargetStatus
    model: ServerModel | None = None
    context_weights: tuple[float, ...] | None = None
    history: tuple[HistoryPoint, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """One published cycle: every server's view, when it was published, how many publishes so far."""

    views: tuple[ServerView, ...]
    generated_at: float | None
    publishes: int

    @property
    def targets(self) -> tuple[TargetStatus, ...]:
        return tuple(view.status for view in self.views)

    def view(self, server: str) -> ServerView | None:
        return next((view for view in self.views if view.status.server == server), None)


class SnapshotStore:
    """Thread-safe holder of the last published snapshot. The daemon writes, scrapes and pages read.

    `publish` stores copies of the statuses and models (once per ServerView given: the same view published
    again keeps its copy), so the daemon may keep mutating its own statuses; readers get the stored objects and
    must treat them as read-only. The store also holds the daemon's
    cycle-step latency histogram (sglang_advisor_cycle_step_duration_seconds).
    """

    def __init__(self) -> None:
        self._cycle_listeners: list[Callable[[], None]] = []
        self._copies: dict[str, tuple[object, ServerView]] = {}  # server -> (the entry last given, its copy)
        self._lock = threading.Lock()
        self._snapshot = Snapshot(views=(), generated_at=None, publishes=0)
        self._published_monotonic: float | None = None
        self._created_monotonic = time.monotonic()
        self.step_durations = Histogram(
            metric_name("cycle_step_duration_seconds"),
            "Wall-clock seconds of one step of the advisor's cycle (logs, metrics, server_info and "
            "recommend per target; target = one target's whole cycle; checkpoint; cycle = all targets).",
            labelnames=("step",), buckets=STEP_BUCKETS, registry=None,
        )
        for step in CYCLE_STEPS:
            self.step_durations.labels(step=step)

    def observe_step(self, step: str, seconds: float) -> None:
        """One timed step into the latency histogram (negative or non-finite durations are dropped)."""
        if isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0:
            self.step_durations.labels(step=str(step)).observe(float(seconds))

    def observe_steps(self, step_seconds: Mapping[str, float]) -> None:
        for step, seconds in step_seconds.items():
            self.observe_step(step, seconds)

    def history(self, server: str) -> list[HistoryPoint]:
        view = self.snapshot().view(server)
        return list(view.history) if view else []

    def model(self, server: str) -> ServerModel | None:
        view = self.snapshot().view(server)
        return view.model if view else None

    def context_weights(self, server: str) -> Sequence[float] | None:
        view = self.snapshot().view(server)
        return view.context_weights if view else None

    def seconds_since_publish(self) -> float:
        """Wall seconds since the last publish (since the store was made, before the first)."""
        with self._lock:
            since = self._published_monotonic if self._published_monotonic is not None else self._created_monotonic
        return time.monotonic() - since

    def publish(self, entries: Sequence[ServerView | TargetStatus], now: float) -> None:
        """Replace the snapshot with these servers' views (a bare status is a view without page data) as
        computed at `now` (unix seconds)."""
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise ValueError(f"publish: now must be a finite unix time in seconds, got {now!r}")
        with self._lock:
            earlier = self._copies
        copies: dict[str, tuple[object, ServerView]] = {}
        for entry in entries:
            view = ServerView(status=entry) if isinstance(entry, TargetStatus) else entry
            if not isinstance(view, ServerView) or not isinstance(view.status, TargetStatus):
                raise ValueError(f"publish: expected TargetStatus or ServerView, got {type(entry).__name__}")
            server = view.status.server
            if server in copies:
                raise ValueError(f"publish: server {server!r} appears twice in one snapshot")
            given, stored = earlier.get(server, (None, None))
            # The same ServerView given again is the same cycle's view (views are never changed once given):
            # it keeps its copy. A bare status may have been changed in place since: it is copied every time.
            if given is not entry or stored is None or not isinstance(entry, ServerView):
                stored = replace(view, status=copy.deepcopy(view.status), model=copy.deepcopy(view.model))
            copies[server] = (entry, stored)
        with self._lock:
            self._copies = copies
            self._snapshot = Snapshot(views=tuple(stored for _, stored in copies.values()), generated_at=float(now),
                                      publishes=self._snapshot.publishes + 1)
            self._published_monotonic = time.monotonic()

    def on_cycle_end(self, listener: Callable[[], None]) -> None:
        """Call `listener` when the daemon ends a cycle (the exporter renders its exposition then, not on a scrape)."""
        self._cycle_listeners.append(listener)

    def cycle_ended(self) -> None:
        """The daemon's cycle is over: its last publish stands until the next cycle. Listeners never raise."""
        for listener in list(self._cycle_listeners):
            try:
                listener()
            except Exception:
                log.exception("a cycle-end listener failed")

    def latest(self) -> list[TargetStatus]:
        """The statuses of the last publish (empty before the first)."""
        return list(self.snapshot().targets)

    def snapshot(self) -> Snapshot:
        """The whole last publish, with its daemon-level values (generated_at, publishes)."""
        with self._lock:
            return self._snapshot

    @property
    def generated_at(self) -> float | None:
        """The `now` of the last publish, or None before the first."""
        return self.snapshot().generated_at
