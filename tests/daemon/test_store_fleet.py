"""StoreFleet against a fake Prometheus API on loopback holding genuine SGLang expositions: a constant query
count whatever the fleet size, the history replay, servers coming and going, a failing store, and where the
byte constants come from (/server_info, else the pool gauges, said by a note code)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fake_store import FakeStore, fixture_samples
from replay_server import ReplayServer
from support import closed_port_url

from advisor.config import config_from_dict
from advisor.daemon.store_targets import StoreFleet
from advisor.status import TargetStatus
from advisor.store_config import store_target_from_dict

SINGLE = "sglang-0.5.23-single.prom"
NOW = 1_790_000_000.0


def fleet_of(store: FakeStore, **raw: Any) -> StoreFleet:
    target = store_target_from_dict({"kind": "prometheus", "url": store.url, "history": "1h", "step": "60s",
                                     "server_info_url": "", **raw}, "targets[0]", {})
    return StoreFleet(target, config_from_dict({"targets": []}), wall_clock=lambda: NOW, quiet=True)


def statuses(fleet: StoreFleet, now: float) -> dict[str, TargetStatus]:
    return {result.status.server: result.status for result in fleet.cycle(now)}


@pytest.fixture
def store() -> Iterator[FakeStore]:
    with FakeStore({f"gpu-{i}:30000": fixture_samples(SINGLE) for i in range(5)}) as fake:
        yield fake


def test_a_fixed_set_of_queries_a_cycle_whatever_the_fleet_size(store):
    every = dict(store.servers)
    for size in (1, 5):
        store.servers = dict(list(every.items())[:size])
        fleet = fleet_of(store)
        try:
            fleet.bootstrap(NOW)
            sent = fleet.client.queries_sent
            assert len(statuses(fleet, NOW)) == size
            assert fleet.client.queries_sent - sent == fleet.queries_per_cycle == 5
        finally:
            fleet.close()


def test_the_history_replay_feeds_every_server_before_the_first_cycle(store):
    fleet = fleet_of(store)
    try:
        fed = fleet.bootstrap(NOW)
        # the last replay window (30 min) at 60 s steps, the half hour before it at 1800 s (half-life / 2)
        assert fed == 5 * (30 + 2)
        starts = sorted({(float(form["start"]), float(form["step"])) for path, form, _ in store.posts
                         if path.endswith("/query_range")})
        assert starts[0] == (NOW - 3600, 1800.0) and starts[-1][1] == 60.0
        seen = statuses(fleet, NOW)
    finally:
        fleet.close()
    for status in seen.values():
        assert status.up and not status.last_errors
        assert status.workload.history_seconds == pytest.approx(3600, rel=0.05)
        # the first replayed sample's lifetime histograms: the fixture's 4000 finished requests
        assert status.workload.requests_observed == pytest.approx(4000, rel=0.01)


def test_servers_appear_and_are_forgotten_after_they_leave(store):
    fleet = fleet_of(store, forget_after_seconds="10m")
    try:
        assert len(statuses(fleet, NOW)) == 5
        store.servers["late:30000"] = fixture_samples(SINGLE)
        assert "late:30000" in statuses(fleet, NOW + 60)
        del store.servers["late:30000"]
        gone = statuses(fleet, NOW + 120)
        assert not gone["late:30000"].up and gone["late:30000"].scrape_errors_total["metrics"] == 1
        assert "not in the store's latest samples" in gone["late:30000"].last_errors[0]
        assert "late:30000" not in statuses(fleet, NOW + 60 + 601)
        assert "late:30000" not in fleet.pipelines and len(fleet.pipelines) == 5
    finally:
        fleet.close()


def test_a_failing_store_shows_every_server_down_and_forgets_none(store):
    fleet = fleet_of(store, forget_after_seconds="1m")
    try:
        statuses(fleet, NOW)
        store.mode = "error"
        down = statuses(fleet, NOW + 3600)  # long past forget_after: a store error is no departure
        assert len(down) == 5 and fleet.store_errors_total == 1 and "store down" in (fleet.last_error or "")
        for status in down.values():
            assert not status.up and status.scrape_errors_total["metrics"] == 1
            assert status.last_errors[0].startswith("metrics: store ")
        store.mode = "ok"
        assert all(status.up for status in statuses(fleet, NOW + 3660).values())
    finally:
        fleet.close()


def test_label_values_that_are_not_strings_are_a_counted_store_error(store):
    """The fleet reads labels as the store sent them: a malformed answer (label values that are lists) is a
    store error, every server shown down, not a cycle that raises."""
    fleet = fleet_of(store)
    try:
        statuses(fleet, NOW)
        store.mode = "list_labels"
        down = statuses(fleet, NOW + 15)
        assert len(down) == 5 and fleet.store_errors_total == 1
        assert "malformed result" in (fleet.last_error or "")
        assert not any(status.up for status in down.values())
    finally:
        fleet.close()


def test_byte_constants_from_server_info_else_the_gauges_with_a_note_code(store):
    store.servers = {"gpu-0:30000": fixture_samples(SINGLE)}
    with ReplayServer() as server:
        asked = fleet_of(store, server_info_url=server.url)
        gauges = fleet_of(store)
        dead = fleet_of(store, server_info_url=closed_port_url())
        try:
            (told,) = statuses(asked, NOW).values()
            (stood_in,) = statuses(gauges, NOW).values()
            (fell_back,) = statuses(dead, NOW).values()
        finally:
            for fleet in (asked, gauges, dead):
                fleet.close()
    assert told.recommendation.note_codes == [] and told.scrape_errors_total["server_info"] == 0
    assert stood_in.recommendation.note_codes == ["constants_from_pool_gauges"]
    assert stood_in.scrape_errors_total["server_info"] == 0  # not asked: nothing failed
    assert fell_back.recommendation.note_codes == ["constants_from_pool_gauges"]
    assert fell_back.scrape_errors_total["server_info"] == 1
    assert None not in (told.recommendation.token_equiv, stood_in.recommendation.token_equiv,
                        fell_back.recommendation.token_equiv)


def test_a_resumed_fleet_reads_the_store_only_from_its_checkpoint(store):
    """checkpoint_state() -> resume(): the servers are back before the store answers (with their state, which
    the runner restores), and the history replay starts where the checkpoint had read up to."""
    fleet = fleet_of(store, shard={"index": 0, "total": 1})
    try:
        statuses(fleet, NOW)
        saved = fleet.checkpoint_state()
        states = {name: pipeline.state() for name, pipeline in fleet.pipelines.items()}
    finally:
        fleet.close()
    assert saved["read_until"] == NOW and set(saved["servers"]) == set(store.servers)
    later = NOW + 600
    resumed = StoreFleet(fleet.store, fleet.config, wall_clock=lambda: later, quiet=True)
    try:
        resumed.resume(saved)
        for name, pipeline in resumed.pipelines.items():
            pipeline.restore(states[name])
        assert set(resumed.pipelines) == set(store.servers)
        del store.posts[:]
        fed = resumed.bootstrap(later)
        starts = {float(form["start"]) for path, form, _ in store.posts if path.endswith("/query_range")}
        assert starts == {NOW} and fed == 5 * 11  # ten 60 s steps since the checkpoint, both ends included
        after = statuses(resumed, later)
    finally:
        resumed.close()
    for status in after.values():
        assert status.up and status.workload.requests_observed == pytest.approx(4000, rel=0.01)


def test_a_checkpoint_from_other_shards_or_malformed_starts_cold(store):
    fleet = fleet_of(store)
    try:
        statuses(fleet, NOW)
        saved = fleet.checkpoint_state()
    finally:
        fleet.close()
    halves = []
    for index in (0, 1):
        half = fleet_of(store, shard={"index": index, "total": 2})
        half.resume(saved)
        halves.append(set(half.pipelines))
        half.close()
    assert halves[0] | halves[1] == set(store.servers) and not halves[0] & halves[1]
    for bad in (None, {"servers": []}, {**saved, "read_until": "yesterday"}, {**saved, "read_until_advisor": None}):
        cold = fleet_of(store)
        cold.resume(bad)
        assert cold.read_until is None and not cold.pipelines
        cold.close()


def test_the_collector_pause_nests_and_restores_what_it_found():
    import gc

    from advisor.daemon.store_targets import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # another target's cycle overlapping
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pauser still runs
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()


def test_checkpoint_writes_take_a_bounded_share_of_the_time(store, tmp_path, monkeypatch):
    """A write is followed by the next no sooner than its own duration / CHECKPOINT_TIME_SHARE later: with a
    tiny share the cycles after a write skip it (a large fleet's states are not dumped every cycle), with a
    large one every cycle writes, and shutdown always writes."""
    from advisor.daemon import runner
    from advisor.daemon.runner import Advisor

    writes: list[float] = []
    real_write = runner.write_checkpoint

    def counted(path, state, **kwargs):
        writes.append(state["saved_at"])
        real_write(path, state, **kwargs)

    monkeypatch.setattr(runner, "write_checkpoint", counted)
    config = config_from_dict({"targets": [{"kind": "prometheus", "url": store.url, "history": "10m", "step": "60s",
                                            "server_info_url": ""}],
                               "checkpoint_path": str(tmp_path / "state.json"), "interval_seconds": 5.0})
    for share, expected in ((1e-9, 1), (1e9, 3)):
        writes.clear()
        monkeypatch.setattr(runner, "CHECKPOINT_TIME_SHARE", share)
        advisor = Advisor(config)
        try:
            for _ in range(3):
                advisor.run_cycle(timeout=20.0)
            assert len(writes) == expected, (share, writes)
            advisor.save_checkpoint()  # what shutdown does
            assert len(writes) == expected + 1
        finally:
            advisor.close()
