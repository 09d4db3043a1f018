"""Worker processes for the what-if replay: its candidate ratios are independent scheduler runs, so with
`replay_workers` > 1 they are spread over that many processes (spawned once, reused, shut down at exit).
A pool that breaks is dropped and the batch runs in this process: a replay is never lost to its pool."""

from __future__ import annotations

import atexit
import logging
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from advisor.estimate.traffic import TrafficPicture
from advisor.recommend.replay import ReplaySettings, RunMany, run_ratios
from advisor.scheduler.engine import SimResult
from advisor.scheduler.server import SchedulerServerConfig

log = logging.getLogger("pool_advisor")
_pools: dict[int, ProcessPoolExecutor] = {}


def _pool(workers: int) -> ProcessPoolExecutor:
    pool = _pools.get(workers)
    if pool is None:
        # spawn, not fork: the daemon runs threads (exporter, scheduler) a forked child would inherit mid-lock
        pool = _pools[workers] = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    return pool


def shutdown() -> None:
    for pool in _pools.values():
        pool.shutdown(wait=True, cancel_futures=True)  # waits for a running batch only (a second or so)
    _pools.clear()


atexit.register(shutdown)


def runner(workers: int) -> RunMany:
    """A `RunMany` over `workers` processes (in this process for 1)."""
    if workers <= 1:
        return run_ratios

    def run_many(server: SchedulerServerConfig, picture: TrafficPicture, ratios: Sequence[float],
                 settings: ReplaySettings) -> list[SimResult]:
        if len(ratios) <= 1:
            return run_ratios(server, picture, ratios, settings)
        chunks = [list(ratios[k::workers]) for k in range(workers) if ratios[k::workers]]
        try:
            pool = _pool(workers)
            futures = [pool.submit(run_ratios, server, picture, chunk, settings) for chunk in chunks]
            by_ratio = {r: result for chunk, future in zip(chunks, futures, strict=True)
                        for r, result in zip(chunk, future.result(), strict=True)}
        except Exception as exc:  # a broken or refused pool: drop it, run here
            log.warning("replay workers failed (%s); running the replay in the daemon's process", exc)
            _pools.pop(workers, None)
            return run_ratios(server, picture, ratios, settings)
        return [by_ratio[r] for r in ratios]

    return run_many
