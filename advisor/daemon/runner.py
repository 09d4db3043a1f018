"""The daemon: APScheduler in the main thread runs one cycle job (all targets, no overlap, coalesced misfires);
targets run side by side on daemon threads so one that never answers cannot delay the others (a target still
busy when its cycle's time is up is abandoned for that cycle, counted under source=deadline and shown as down);
each result is published to the exporter as soon as it is ready; the checkpoint is written atomically after
every cycle and on shutdown. SIGTERM wakes the cycle wait at once: nothing left running keeps the process.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from advisor.config import AdvisorConfig
from advisor.daemon.checkpoint import read_checkpoint, write_checkpoint
from advisor.daemon.pipeline import CycleReport, TargetPipeline
from advisor.daemon.store_targets import StoreFleet
from advisor.export.collector import SnapshotStore
from advisor.status import TargetStatus

log = logging.getLogger("pool_advisor")
CYCLE_BUDGET_SHARE = 0.9  # of interval_seconds: how long a cycle waits for its targets


class Advisor:
    def __init__(self, config: AdvisorConfig, *, store: SnapshotStore | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store or SnapshotStore()
        self._wall_clock = wall_clock
        self._wall_start = wall_clock()
        self._time_base = self._wall_start  # advisor time at _wall_start
        self.pipelines = [TargetPipeline(target, config) for target in config.targets]
        self.fleets = [StoreFleet(store, config, wall_clock) for store in config.store_targets]
        self.fleet_latest: dict[str, list[TargetStatus]] = {}  # store name -> its servers' statuses
        self.latest: dict[str, TargetStatus] = {}
        self.reports: dict[str, CycleReport] = {}
        self._lock = threading.Lock()
        self._done = threading.Condition()  # notified when a target's task ends, and on stop
        self._stopping = threading.Event()
        self._busy: dict[str, _Task] = {}
        self._snapshots: dict[str, Any] = {}  # target name -> its state() taken when its last cycle ended
        self._loaded: dict[str, Any] = {}  # target name -> its entry in the checkpoint read at start
        for pipeline in self.pipelines:
            pipeline.errors_total.setdefault("deadline", 0)

    def now(self) -> float:
        """Advisor time: the wall clock, optionally running `time_scale` times faster (demo, bench)."""
        wall = self._wall_clock()
        return self._time_base + (wall - self._wall_start) * self.config.time_scale

    # -- checkpoint -----------------------------------------------------------------------------------

    def load_checkpoint(self) -> str | None:
        path = self.config.checkpoint_path
        if not path:
            return None
        state, problem = read_checkpoint(path, now=self._wall_clock())
        if problem:
            for pipeline in self.pipelines:
                pipeline.errors_total["checkpoint"] += 1
            log.warning("%s", problem)
        if state:
            saved_at = state.get("saved_at")
            if isinstance(saved_at, (int, float)) and saved_at > self.now():
                # a sped-up clock (demo, bench) ran ahead of the wall: resume advisor time where it stopped
                self._wall_start, self._time_base = self._wall_clock(), float(saved_at)
            targets = state.get("targets")
            if not isinstance(targets, dict):
                targets = {}
            for pipeline in self.pipelines:
                saved = targets.get(pipeline.target.name)
                if not isinstance(saved, dict):
                    continue
                self._loaded[pipeline.target.name] = saved
                try:
                    pipeline.restore(saved)
                except Exception as exc:  # a well-formed file with the wrong shapes inside: start this one cold
                    pipeline.errors_total["checkpoint"] += 1
                    log.warning("checkpoint entry of %s unusable (%s); starting cold", pipeline.target.name,
                                type(exc).__name__)
        return problem

    def save_checkpoint(self) -> None:
        path = self.config.checkpoint_path
        if not path:
            return
        targets: dict[str, Any] = {}
        with self._lock:
            for pipeline in self.pipelines:
                saved = self._target_state(pipeline)
                if saved is not None:
                    targets[pipeline.target.name] = saved
            state = {"saved_at": self.now(), "targets": targets}
        try:
            write_checkpoint(path, state)
        except OSError as exc:
            log.warning("cannot write checkpoint %s: %s", path, exc.strerror or exc)
            for pipeline in self.pipelines:
                pipeline.errors_total["checkpoint"] += 1

    def _target_state(self, pipeline: TargetPipeline) -> Any:
        """A pipeline's state for the checkpoint: fresh when it is idle, else the snapshot its last cycle left
        (never read a state a running cycle is changing), else what the checkpoint held at start."""
        name = pipeline.target.name
        task = self._busy.get(name)
        if task is None or task.done():
            try:
                return pipeline.state()
            except Exception:  # a state that cannot be taken must not cost the other targets their checkpoint
                log.exception("state of %s could not be taken", name)
        return self._snapshots.get(name, self._loaded.get(name))

    # -- cycles ---------------------------------------------------------------------------------------

    def _run_one(self, pipeline: TargetPipeline) -> None:
        started = time.monotonic()
        try:
            status, report = pipeline.cycle(self.now())
        except Exception as exc:  # a bug in one target's cycle must not kill the daemon
            log.exception("cycle of %s failed", pipeline.target.name)
            pipeline.errors_total["internal"] += 1
            status = TargetStatus(server=pipeline.target.name, up=False, last_errors=[f"internal error: {exc}"],
                                  scrape_errors_total=dict(pipeline.errors_total))
            report = CycleReport(errors=[str(exc)])
        self._record_page_data(pipeline, status, report, time.monotonic() - started)
        try:
            snapshot = pipeline.state()
        except Exception:
            snapshot = None
        with self._lock:
            if snapshot is not None:
                self._snapshots[pipeline.target.name] = snapshot
            self.latest[pipeline.target.name] = status
            self.reports[pipeline.target.name] = report
            self.store.publish(self._statuses(), self.now())

    def _record_page_data(self, pipeline: TargetPipeline, status: TargetStatus, report: CycleReport,
                          seconds: float) -> None:
        """The exporter's extras: what the landing page draws (pool model, context histogram, history)
        and the step timings (the pipeline's own when it reports them, plus the whole target)."""
        steps = dict(getattr(report, "step_seconds", None) or {})
        steps["target"] = seconds
        try:
            model = pipeline.server_model()
            weights = pipeline.estimator.request_context.weights.tolist()
        except Exception:  # page data is optional: never let it cost the cycle
            model, weights = None, None
        self.store.record_cycle(status, self.now(), model=model, context_weights=weights, step_seconds=steps)

    def _statuses(self) -> list[TargetStatus]:
        direct = [self.latest[p.target.name] for p in self.pipelines if p.target.name in self.latest]
        return direct + [status for fleet in self.fleets for status in self.fleet_latest.get(fleet.store.name, [])]

    def _run_fleet(self, fleet: StoreFleet) -> None:
        try:
            statuses = fleet.cycle(self.now())
        except Exception:  # a bug in the store path must not kill the daemon; the last statuses stay
            log.exception("cycle of store %s failed", fleet.store.name)
            return
        with self._lock:
            self.fleet_latest[fleet.store.name] = statuses
            self.store.publish(self._statuses(), self.now())

    def _start(self, key: str, action: Callable[[], None]) -> _Task | None:
        """Run `action` on a daemon thread unless the same key is still busy from an earlier cycle."""
        busy = self._busy.get(key)
        if busy is not None and not busy.done():
            return None
        task = self._busy[key] = _Task(action, self._done, name=f"target-{key}")
        task.start()
        return task

    def run_cycle(self, timeout: float | None = None) -> list[TargetStatus]:
        """One cycle over all targets, within `timeout` (default: 90% of the interval). A target still busy then (from
        this cycle or an earlier one) is abandoned for this cycle: counted under source=deadline and shown as
        down with the reason; the others are not delayed and keep their rate."""
        # Default: most of the interval, leaving time to publish and checkpoint before the next run is due
        # (a job still running then makes APScheduler skip that run: every target's rate would halve).
        budget = timeout if timeout is not None else CYCLE_BUDGET_SHARE * self.config.interval_seconds
        cycle_started = time.monotonic()
        deadline = cycle_started + budget
        started = [self._start(pipeline.target.name, partial(self._run_one, pipeline)) for pipeline in self.pipelines]
        started += [self._start(f"store:{fleet.store.name}", partial(self._run_fleet, fleet)) for fleet in self.fleets]
        # Wait for this cycle's tasks only: one still stuck from an earlier cycle must not make every cycle
        # last its whole budget (the scheduler would then skip runs and halve the healthy targets' rate).
        waiting = [task for task in started if task is not None]
        with self._done:
            while not self._stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or all(task.done() for task in waiting):
                    break
                self._done.wait(remaining)
        self._mark_overruns(budget)
        checkpoint_started = time.monotonic()
        self.save_checkpoint()
        finished = time.monotonic()
        self.store.observe_step("checkpoint", finished - checkpoint_started)
        self.store.observe_step("cycle", finished - cycle_started)
        with self._lock:
            statuses = self._statuses()
        log.info("%s", cycle_summary(statuses, finished - cycle_started))
        return statuses

    def _mark_overruns(self, budget: float) -> None:
        overran = False
        for pipeline in self.pipelines:
            name = pipeline.target.name
            task = self._busy.get(name)
            if task is None or task.done():
                continue
            overran = True
            pipeline.errors_total["deadline"] = pipeline.errors_total.get("deadline", 0) + 1
            message = (f"deadline: cycle still running after {time.monotonic() - task.started:.1f}s "
                       f"(budget {budget:g}s); abandoned for this cycle")
            log.warning("%s: %s", name, message)
            with self._lock:
                previous = self.latest.get(name)
                if previous is None:
                    previous = TargetStatus(server=name)
                self.latest[name] = replace(previous, up=False, last_errors=[message],
                                            scrape_errors_total=dict(pipeline.errors_total))
        if overran:
            with self._lock:
                self.store.publish(self._statuses(), self.now())

    def stop(self) -> None:
        """Wake a cycle waiting for its targets: it returns at once (shutdown)."""
        self._stopping.set()
        with self._done:
            self._done.notify_all()

    def serve_forever(self, on_cycle: Callable[[list[TargetStatus]], None] | None = None) -> int:
        """Run cycles every `interval_seconds` until SIGTERM/SIGINT; then finish the cycle, flush, return 0."""
        from apscheduler.schedulers.blocking import BlockingScheduler

        scheduler = BlockingScheduler()

        def job() -> None:
            statuses = self.run_cycle()
            if on_cycle is not None:
                on_cycle(statuses)

        scheduler.add_job(job, "interval", seconds=self.config.interval_seconds, id="advisor-cycle",
                          max_instances=1, coalesce=True, misfire_grace_time=None, next_run_time=_now_datetime())

        def stop(signum: int, _frame: Any) -> None:
            log.info("signal %d: finishing the cycle and flushing the checkpoint", signum)
            self.stop()
            scheduler.shutdown(wait=True)

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            scheduler.start()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.save_checkpoint()
            self.close()
        return 0

    def close(self) -> None:
        self.stop()
        for pipeline in self.pipelines:
            pipeline.close()
        for fleet in self.fleets:
            fleet.close()


class _Task(threading.Thread):
    """One target's cycle on a daemon thread (a target stuck in I/O never keeps the process alive)."""

    def __init__(self, action: Callable[[], None], done: threading.Condition, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._action = action
        self._done_condition = done
        self.started = time.monotonic()
        self._finished = False

    def done(self) -> bool:
        """Whether the cycle ended (like Future.done)."""
        return self._finished

    def run(self) -> None:
        try:
            self._action()
        except Exception:
            log.exception("%s failed", self.name)
        finally:
            with self._done_condition:
                self._finished = True
                self._done_condition.notify_all()


def cycle_summary(statuses: list[TargetStatus], seconds: float, detail_up_to: int = 5) -> str:
    """The one log line per cycle: each target's decision and ratios (counts per decision past a few)."""
    up = sum(1 for status in statuses if status.up)
    head = f"cycle {seconds:.2f}s: {len(statuses)} target(s), {up} up"
    if len(statuses) > detail_up_to:
        counts: dict[str, int] = {}
        for status in statuses:
            decision = status.recommendation.decision if status.recommendation else "none"
            counts[decision] = counts.get(decision, 0) + 1
        return head + "; decisions " + " ".join(f"{name}={count}" for name, count in sorted(counts.items()))
    parts = []
    for status in statuses:
        rec = status.recommendation
        if rec is None:
            parts.append(f"{status.server} {'up' if status.up else 'down'}, no recommendation")
            continue
        ratios = ""
        if rec.ratio is not None:
            live = f"{rec.live_ratio:.3g}" if rec.live_ratio is not None else "?"
            ratios = f" r {live} -> {rec.ratio:.3g}"
        parts.append(f"{status.server} {rec.decision}{ratios} (confidence {rec.confidence:.2f})")
    return head + ("; " + "; ".join(parts) if parts else "")


def _now_datetime() -> Any:
    from datetime import datetime

    return datetime.now()
