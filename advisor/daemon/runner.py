"""The daemon: APScheduler in the main thread runs one cycle job (all targets, no overlap, coalesced misfires);
targets run side by side so one that never answers cannot delay the others; each result is published to the
exporter as soon as it is ready; the checkpoint is written atomically after every cycle and on shutdown.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from advisor.config import AdvisorConfig
from advisor.daemon.checkpoint import read_checkpoint, write_checkpoint
from advisor.daemon.pipeline import CycleReport, TargetPipeline
from advisor.daemon.store_targets import StoreFleet
from advisor.export.collector import SnapshotStore
from advisor.status import TargetStatus

log = logging.getLogger("pool_advisor")


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
        self._executor = ThreadPoolExecutor(max_workers=max(1, len(self.pipelines) + len(self.fleets)), thread_name_prefix="target")
        self._busy: dict[str, Any] = {}

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
            targets = state.get("targets", {})
            for pipeline in self.pipelines:
                saved = targets.get(pipeline.target.name)
                if isinstance(saved, dict):
                    pipeline.restore(saved)
        return problem

    def save_checkpoint(self) -> None:
        path = self.config.checkpoint_path
        if not path:
            return
        with self._lock:
            state = {"saved_at": self.now(), "targets": {p.target.name: p.state() for p in self.pipelines}}
        try:
            write_checkpoint(path, state)
        except OSError as exc:
            log.warning("cannot write checkpoint %s: %s", path, exc.strerror or exc)
            for pipeline in self.pipelines:
                pipeline.errors_total["checkpoint"] += 1

    # -- cycles ---------------------------------------------------------------------------------------

    def _run_one(self, pipeline: TargetPipeline) -> None:
        try:
            status, report = pipeline.cycle(self.now())
        except Exception as exc:  # a bug in one target's cycle must not kill the daemon
            log.exception("cycle of %s failed", pipeline.target.name)
            pipeline.errors_total["internal"] += 1
            status = TargetStatus(server=pipeline.target.name, up=False, last_errors=[f"internal error: {exc}"],
                                  scrape_errors_total=dict(pipeline.errors_total))
            report = CycleReport(errors=[str(exc)])
        with self._lock:
            self.latest[pipeline.target.name] = status
            self.reports[pipeline.target.name] = report
            self.store.publish(self._statuses(), self.now())

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

    def run_cycle(self, timeout: float | None = None) -> list[TargetStatus]:
        """One cycle over all targets; a target still busy from an earlier cycle is skipped, not queued."""
        futures = []
        for pipeline in self.pipelines:
            busy = self._busy.get(pipeline.target.name)
            if busy is not None and not busy.done():
                continue
            future = self._executor.submit(self._run_one, pipeline)
            self._busy[pipeline.target.name] = future
            futures.append(future)
        for fleet in self.fleets:
            busy = self._busy.get(f"store:{fleet.store.name}")
            if busy is None or busy.done():
                future = self._busy[f"store:{fleet.store.name}"] = self._executor.submit(self._run_fleet, fleet)
                futures.append(future)
        wait(futures, timeout=timeout if timeout is not None else self.config.interval_seconds)
        self.save_checkpoint()
        with self._lock:
            return self._statuses()

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
        self._executor.shutdown(wait=False, cancel_futures=True)
        for pipeline in self.pipelines:
            pipeline.close()
        for fleet in self.fleets:
            fleet.close()


def _now_datetime() -> Any:
    from datetime import datetime

    return datetime.now()
