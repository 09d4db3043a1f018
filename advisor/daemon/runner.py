"""The daemon: APScheduler in the main thread runs one cycle job (all targets, no overlap, coalesced misfires);
targets (a direct server, or a store's fleet: advisor.daemon.targets) run side by side on daemon threads so one
that never answers cannot delay the others (a target still busy when its cycle's time is up is abandoned for
that cycle: each of its servers is counted under source=deadline and shown as down); each target's results are
published to the exporter as soon as they are ready; the checkpoint is written atomically after every cycle
and on shutdown, and the exporter renders the cycle's exposition when it ends. SIGTERM wakes the cycle wait at once: nothing left running keeps the process.
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
from advisor.daemon.pipeline import CycleReport, ServerPipeline
from advisor.daemon.store_targets import StoreFleet
from advisor.daemon.targets import DirectTarget, Target
from advisor.export.snapshot import ServerView, SnapshotStore
from advisor.status import TargetStatus

log = logging.getLogger("pool_advisor")
CYCLE_BUDGET_SHARE = 0.9  # of interval_seconds: how long a cycle waits for its targets
# Of the wall time, at most this share goes to writing checkpoints: a write that took t seconds (a large store
# fleet's states and JSON: ~5 s at 1000 servers) is followed by the next one no sooner than t / share later.
# A small config writes after every cycle; every config writes on shutdown.
CHECKPOINT_TIME_SHARE = 0.1


class Advisor:
    def __init__(self, config: AdvisorConfig, *, store: SnapshotStore | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store or SnapshotStore()
        self._wall_clock = wall_clock
        self._wall_start = wall_clock()
        self._time_base = self._wall_start  # advisor time at _wall_start
        self.targets: list[Target] = [DirectTarget(target, config) for target in config.targets]
        self.targets += [StoreFleet(store_target, config, wall_clock) for store_target in config.store_targets]
        self.views: dict[str, ServerView] = {}  # server -> what the exporter shows of it (its status included)
        self.reports: dict[str, CycleReport] = {}
        self._lock = threading.Lock()
        self._done = threading.Condition()  # notified when a target's task ends, and on stop
        self._stopping = threading.Event()
        self._busy: dict[str, _Task] = {}
        self._snapshots: dict[str, Any] = {}  # server -> its state() taken when its last cycle ended
        self._loaded: dict[str, Any] = {}  # server -> its entry in the checkpoint read at start
        # a store target -> its checkpoint_state() when its last cycle ended, else as the checkpoint held it
        self._store_snapshots: dict[str, Any] = {}
        self._next_checkpoint_at = 0.0  # time.monotonic() from which the next cycle writes the checkpoint

    @property
    def latest(self) -> dict[str, TargetStatus]:
        """Every shown server's last status."""
        with self._lock:
            return {name: view.status for name, view in self.views.items()}

    @property
    def pipelines(self) -> list[ServerPipeline]:
        """The directly read servers' pipelines, in configuration order."""
        return [target.pipeline for target in self.targets if isinstance(target, DirectTarget)]

    @property
    def fleets(self) -> list[StoreFleet]:
        return [target for target in self.targets if isinstance(target, StoreFleet)]

    def _checkpointed(self) -> list[ServerPipeline]:
        return [server for target in self.targets if target.checkpointed for server in target.servers()]

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
            for server in self._checkpointed():
                server.ledger.count("checkpoint")
            log.warning("%s", problem)
        if state:
            saved_at = state.get("saved_at")
            if isinstance(saved_at, (int, float)) and saved_at > self.now():
                # a sped-up clock (demo, bench) ran ahead of the wall: resume advisor time where it stopped
                self._wall_start, self._time_base = self._wall_clock(), float(saved_at)
            targets = state.get("targets")
            if not isinstance(targets, dict):
                targets = {}
            stores = state.get("stores")
            for fleet in self.fleets:  # a store's servers exist only once it names them: recreate them first
                saved_fleet = stores.get(fleet.name) if isinstance(stores, dict) else None
                try:
                    fleet.resume(saved_fleet)
                except Exception as exc:  # the servers' entries are restored anyway; the history replay is whole
                    log.warning("checkpoint entry of %s unusable (%s); replaying its whole history", fleet.name,
                                type(exc).__name__)
                else:
                    if saved_fleet is not None:
                        self._store_snapshots[fleet.name] = saved_fleet
            for server in self._checkpointed():
                saved = targets.get(server.name)
                if not isinstance(saved, dict):
                    continue
                self._loaded[server.name] = saved
                try:
                    server.restore(saved)
                except Exception as exc:  # a well-formed file with the wrong shapes inside: start this one cold
                    server.ledger.count("checkpoint")
                    log.warning("checkpoint entry of %s unusable (%s); starting cold", server.name,
                                type(exc).__name__)
        return problem

    def save_checkpoint(self) -> None:
        path = self.config.checkpoint_path
        if not path:
            return
        saved: dict[str, Any] = {}
        stores: dict[str, Any] = {}
        with self._lock:
            for target in self.targets:
                if not target.checkpointed:
                    continue
                idle = target.name not in self._busy or self._busy[target.name].done()
                for server in target.servers():
                    entry = self._server_state(server, idle)
                    if entry is not None:
                        saved[server.name] = entry
                if isinstance(target, StoreFleet):
                    fleet = target.checkpoint_state() if idle else self._store_snapshots.get(target.name)
                    if fleet is not None:
                        stores[target.name] = fleet
            state = {"saved_at": self.now(), "targets": saved, "stores": stores}
        try:
            write_checkpoint(path, state)
        except OSError as exc:
            log.warning("cannot write checkpoint %s: %s", path, exc.strerror or exc)
            for server in self._checkpointed():
                server.ledger.count("checkpoint")

    def _checkpoint_due(self) -> bool:
        """Whether a checkpoint is configured and this cycle's end writes it (`CHECKPOINT_TIME_SHARE`)."""
        return bool(self.config.checkpoint_path) and time.monotonic() >= self._next_checkpoint_at

    def _server_state(self, server: ServerPipeline, idle: bool) -> Any:
        """A server's state for the checkpoint: fresh when its target is idle, else the snapshot its last cycle
        left (never read a state a running cycle is changing), else what the checkpoint held at start."""
        if idle:
            try:
                return server.state()
            except Exception:  # a state that cannot be taken must not cost the other servers their checkpoint
                log.exception("state of %s could not be taken", server.name)
        return self._snapshots.get(server.name, self._loaded.get(server.name))

    # -- cycles ---------------------------------------------------------------------------------------

    def _run_target(self, target: Target) -> None:
        """One target's cycle on its own thread: every server it stands for, then one publish."""
        try:
            results = target.cycle(self.now())
        except Exception:  # a bug in a target (not in one server's cycle) must not kill the daemon
            log.exception("cycle of %s failed", target.name)
            for server in target.servers():
                server.ledger.count("internal", "target cycle failed")
            results = []
        snapshots = {}
        fleet_snapshot = None
        if target.checkpointed and self._checkpoint_due():  # a fleet's states cost: only taken to be saved
            for server in target.servers():
                try:
                    snapshots[server.name] = server.state()
                except Exception:
                    pass
            if isinstance(target, StoreFleet):
                fleet_snapshot = target.checkpoint_state()
        with self._lock:
            self._snapshots.update(snapshots)
            if fleet_snapshot is not None:
                self._store_snapshots[target.name] = fleet_snapshot
            for result in results:
                name = result.status.server
                self.views[name], self.reports[name] = result.view, result.report
            self._forget_gone()
            self._publish()
        for result in results:
            self.store.observe_steps(result.report.step_seconds)

    def _forget_gone(self) -> None:
        """Drop what the advisor holds of servers no target stands for any more (a store's departed servers)."""
        current = {server.name for target in self.targets for server in target.servers()}
        for held in (self.views, self.reports, self._snapshots):
            for name in [name for name in held if name not in current]:
                del held[name]

    def _publish(self) -> None:
        """Publish every server's latest view (caller holds the lock)."""
        self.store.publish([self.views[name] for name in self._shown()], self.now())

    def _shown(self) -> list[str]:
        return [server.name for target in self.targets for server in target.servers() if server.name in self.views]

    def _statuses(self) -> list[TargetStatus]:
        return [self.views[name].status for name in self._shown()]

    def _start(self, target: Target) -> _Task | None:
        """Run the target's cycle on a daemon thread unless it is still busy from an earlier cycle."""
        busy = self._busy.get(target.name)
        if busy is not None and not busy.done():
            return None
        task = self._busy[target.name] = _Task(partial(self._run_target, target), self._done,
                                               name=f"target-{target.name}")
        task.start()
        return task

    def run_cycle(self, timeout: float | None = None) -> list[TargetStatus]:
        """One cycle over all targets, within `timeout` (default: 90% of the interval). A target still busy then
        (from this cycle or an earlier one) is abandoned for this cycle: each of its servers is counted under
        source=deadline and shown as down with the reason; the others are not delayed and keep their rate."""
        # Default: most of the interval, leaving time to publish and checkpoint before the next run is due
        # (a job still running then makes APScheduler skip that run: every target's rate would halve).
        budget = timeout if timeout is not None else CYCLE_BUDGET_SHARE * self.config.interval_seconds
        cycle_started = time.monotonic()
        deadline = cycle_started + budget
        started = [self._start(target) for target in self.targets]
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
        if self._checkpoint_due():
            self.save_checkpoint()
            self._next_checkpoint_at = time.monotonic() + (time.monotonic() - checkpoint_started) / CHECKPOINT_TIME_SHARE
        checkpointed = time.monotonic()
        self.store.cycle_ended()  # the exporter renders this cycle's exposition now, not on a scrape
        finished = time.monotonic()
        self.store.observe_step("checkpoint", checkpointed - checkpoint_started)
        self.store.observe_step("cycle", finished - cycle_started)
        with self._lock:
            statuses = self._statuses()
        log.info("%s", cycle_summary(statuses, finished - cycle_started))
        return statuses

    def _mark_overruns(self, budget: float) -> None:
        overran = False
        for target in self.targets:
            task = self._busy.get(target.name)
            if task is None or task.done():
                continue
            overran = True
            message = (f"cycle still running after {time.monotonic() - task.started:.1f}s "
                       f"(budget {budget:g}s); abandoned for this cycle")
            log.warning("%s: deadline: %s", target.name, message)
            with self._lock:
                for server in target.servers():
                    server.ledger.count("deadline")
                    previous = self.views.get(server.name) or ServerView(status=TargetStatus(server=server.name))
                    status = replace(previous.status, up=False, last_errors=[f"deadline: {message}"],
                                     scrape_errors_total=dict(server.ledger.totals))
                    self.views[server.name] = replace(previous, status=status)
        if overran:
            with self._lock:
                self._publish()

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
        for target in self.targets:
            target.close()


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
