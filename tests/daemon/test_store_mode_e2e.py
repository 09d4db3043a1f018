"""Store mode end to end: a real Prometheus scrapes three emulated SGLang servers with different configs and
workloads; the advisor reading the store (daemon and one-shot) must say what the advisor scraping them
directly says, export the same series, ask a constant number of queries, and follow servers coming and going.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import TESTS

sys.path.insert(0, str(TESTS / "export"))  # the real-Prometheus harness lives beside the exporter's tests
from prom_harness import PrometheusServer, free_loopback_port, require_binary, wait_for  # noqa: E402

from advisor.config import config_from_dict  # noqa: E402
from advisor.daemon.runner import Advisor  # noqa: E402
from advisor.export.collector import AdvisorCollector  # noqa: E402
from advisor.recommend.engine import OFF_PICTURE_BAR_FACTOR, RecommenderSettings  # noqa: E402
from advisor.sim.config import load_server_config  # noqa: E402
from advisor.sim.emulator import EmulatedServer  # noqa: E402
from advisor.sim.workload import load_workload  # noqa: E402
from advisor.sources.http import Received  # noqa: E402
from advisor.sources.prometheus_store import QueryResult  # noqa: E402
from advisor.status import TargetStatus  # noqa: E402

SPEED = 120.0
# (server config, workload): a state-bound chat server, a KV-bound long-document one, a lazy-strategy one.
FLEET = (("default", "steady-chat"), ("default", "steady-long-docs"), ("lazy", "demo"))
# the scenarios run minutes of server time: the replay acts on 300 s of it
COMMON = {"interval_seconds": 1.0, "time_scale": SPEED, "timeout_seconds": 0.9, "replay_min_window_seconds": 300.0}


@dataclass
class Fleet:
    emulators: list[EmulatedServer]
    late_port: int
    prometheus: PrometheusServer
    direct: dict[str, TargetStatus]
    direct_series: set[tuple[str, tuple[tuple[str, str], ...]]]


def host_of(url: str) -> str:
    return url.split("://", 1)[1]


# Advisor seconds the direct advisor watches before its recommendations are the reference: long enough that
# its what-if replay sees most of the traffic window the store's hour of history fills (after 800 s the
# replayed ratio still differs from the store's by ~25%).
WATCHED_SECONDS = 1200.0


def cycles_until_watched(advisor: Advisor, servers: int) -> dict[str, TargetStatus]:
    """Cycle (polling, one cycle per poll) until every server has a recommendation over WATCHED_SECONDS."""
    latest: dict[str, TargetStatus] = {}

    def watched() -> bool:
        latest.update({status.server: status for status in advisor.run_cycle(timeout=20.0)})
        return len(latest) == servers and all(
            status.recommendation is not None and status.recommendation.decision != "insufficient_data"
            and (status.workload.history_seconds or 0.0) >= WATCHED_SECONDS
            for status in latest.values()
        )

    wait_for(watched, 90, interval=0.4, what=f"{servers} servers watched for {WATCHED_SECONDS:g} advisor seconds")
    return latest


def store_config(prometheus: PrometheusServer, **extra: object) -> dict[str, object]:
    target = {"kind": "prometheus", "url": prometheus.url, "selector": '{job="sglang"}', "history": "1h",
              "step": "1s", **extra}
    return {"targets": [target], **COMMON}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require_binary("prometheus")
    emulators = [EmulatedServer(load_server_config(c), load_workload(w), speed=SPEED, seed=i).start()
                 for i, (c, w) in enumerate(FLEET)]
    late_port = free_loopback_port()  # a server that joins later
    prometheus = PrometheusServer(
        tmp_path_factory.mktemp("prometheus"),
        {"sglang": [host_of(e.url) for e in emulators] + [f"127.0.0.1:{late_port}"]},
    )
    try:
        prometheus.start()
        wait_for(lambda: len(prometheus.query("up == 1")) == len(emulators), 30,
                 what="prometheus scraping the emulated servers")
        direct = Advisor(config_from_dict({"targets": [{"url": e.url} for e in emulators], **COMMON}))
        try:
            statuses = cycles_until_watched(direct, len(emulators))
            exported = series_keys(direct)
        finally:
            direct.close()
        yield Fleet(emulators, late_port, prometheus, statuses, exported)
    finally:
        prometheus.stop()
        for emulator in emulators:
            emulator.stop()


def series_keys(advisor: Advisor) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in AdvisorCollector(advisor.store).collect()
        for sample in family.samples
    }


# Gauges a replay exports only where it read something in its window: a regime shift, a rising rate, a server that
# queued more than the replay. Whether a few minutes' sampling shows one is a reading of the traffic, like the
# decision, and two samplings of the same server may read it either side (CI saw a trend in the store's alone).
SITUATIONAL_SERIES = frozenset({
    "sglang_advisor_traffic_regime_age_seconds", "sglang_advisor_traffic_trend_load_ratio",
    "sglang_advisor_replay_queue_load_ratio", "sglang_advisor_replay_work_scale_ratio",
})


def assert_same_series(store: set[tuple[str, tuple[tuple[str, str], ...]]],
                       direct: set[tuple[str, tuple[tuple[str, str], ...]]]) -> None:
    """The store advisor exports every series the direct one does, with the same labels; the situational ones
    may come and go, but only for the servers both watch."""
    assert {key for key in store if key[0] not in SITUATIONAL_SERIES} == {
        key for key in direct if key[0] not in SITUATIONAL_SERIES}
    servers = {dict(labels).get("server") for _, labels in direct}
    assert {dict(labels).get("server") for name, labels in store if name in SITUATIONAL_SERIES} <= servers


KEPT_NOTE = "advised before stands"  # the note of a move kept from an earlier cycle (engine._recommend)
CLIFF_NOTE = "sits close to where the replayed goodput falls off"  # a move for a cliff near the live ratio
# A move whose replayed gain is within this of the recommender's restart bar is at the threshold: two
# independent samplings of one server (the store's 1 s scrapes, the direct advisor's cycles) fall either side. The
# bar is the higher one (a picture that is off), as either sampling's picture may be off where the other's is not.
THRESHOLD_MARGIN = 0.02
RESTART_BAR = RecommenderSettings().min_goodput_gain * OFF_PICTURE_BAR_FACTOR
# What an advisor says of one server: decision, ratio, the replay's plateau, notes, predicted goodput gain.
Advice = tuple[str, "float | None", "tuple[float, float] | None", list[str], "float | None"]


def advice_of(rec: Any) -> Advice:
    """A Recommendation's, or its JSON row's (`recommend --json`, `run --once --json`), advice."""
    get = (lambda name: rec.get(name)) if isinstance(rec, dict) else (lambda name: getattr(rec, name))
    plateau = get("goodput_plateau")
    ratio = get("recommended_ratio") if isinstance(rec, dict) and "recommended_ratio" in rec else get("ratio")
    return (get("decision"), ratio, tuple(plateau) if plateau else None, list(get("notes") or []),
            get("predicted_goodput_gain_ratio"))


def same_decision(a: Advice, b: Advice) -> bool:
    """The same decision; or one advisor holds where the other advises a move that is no clearer than that:
    - a move it advised on an earlier cycle and keeps (hysteresis: the fixture's direct advisor has watched for
      twenty minutes, a store advisor starts fresh), its ratio on the holding advisor's plateau (to 10%);
    - a move whose replayed gain is within THRESHOLD_MARGIN of the restart bar (RESTART_BAR);
    - a move away from a cliff by the live ratio, to a ratio on the holding advisor's plateau."""
    if a[0] == b[0]:
        return True
    for move, held in ((a, b), (b, a)):
        if held[0] != "hold":
            continue
        ratio, plateau, gain = move[1], held[2], move[4]
        if (any(KEPT_NOTE in note for note in move[3]) and ratio is not None and plateau is not None
                and plateau[0] / 1.1 <= ratio <= plateau[1] * 1.1):
            return True
        if gain is not None and gain < 1.0 + RESTART_BAR + THRESHOLD_MARGIN:
            return True
        # a move away from a cliff next to the live ratio, to a ratio on the holding advisor's plateau: both
        # put the target among the good ratios; which sampling sees the cliff inside its margin is a draw
        if (any(CLIFF_NOTE in note for note in move[3]) and ratio is not None and plateau is not None
                and plateau[0] <= ratio <= plateau[1]):
            return True
    return False


def assert_same_recommendation(direct: TargetStatus, store: TargetStatus) -> None:
    a, b = direct.recommendation, store.recommendation
    assert a is not None and b is not None
    assert same_decision(advice_of(a), advice_of(b)), (store.server, a.reason, a.notes, b.reason)
    assert b.live_ratio == pytest.approx(a.live_ratio)
    # The store samples each server on its own 1 s scrape clock, the direct advisor on its cycle: the
    # closed loop's saturation fractions differ by a few scrapes, the ratio by a few percent.
    assert a.ratio is not None and b.ratio is not None
    replayed = bool(a.replay_source and b.replay_source)
    a_band = (a.ratio, *(a.goodput_plateau or (a.ratio_lower, a.ratio_upper)))
    b_band = (b.ratio, *(b.goodput_plateau or (b.ratio_lower, b.ratio_upper)))
    # (where the decisions differ, same_decision has judged the move against the hold)
    assert a.decision != b.decision or same_ratio(a_band, b_band, replayed, a.decision == "hold"), (a.reason, b.reason)
    assert store.model_name == direct.model_name


Band = tuple[float, "float | None", "float | None"]  # a ratio and its band


def same_ratio(a: Band, b: Band, replayed: bool, both_hold: bool = False) -> bool:
    """Two recommendations say the same: within 10%, or, when both come from the what-if replay, one ratio on the
    other's band (the replay's plateau, to 10%: on a flat curve the prior decides anywhere inside it). Two holds
    say the same where their bands overlap: both keep the live ratio, and the ratio a hold shows is only where
    its redrawn plateau's middle or its sub-threshold gain fell."""
    def on_band(ratio: float, band: Band) -> bool:
        return band[1] is not None and band[2] is not None and band[1] / 1.1 <= ratio <= band[2] * 1.1

    if both_hold and None not in (a[1], a[2], b[1], b[2]):
        return max(a[1], b[1]) <= min(a[2], b[2]) * 1.1  # type: ignore[type-var]
    return a[0] == pytest.approx(b[0], rel=0.10) or (replayed and (on_band(a[0], b) or on_band(b[0], a)))


def test_store_mode_matches_direct_mode(fleet: Fleet) -> None:
    advisor = Advisor(config_from_dict(store_config(fleet.prometheus)))
    try:
        first = {s.server: s for s in advisor.run_cycle(timeout=60.0)}
        # bootstrapped from history: a recommendation on the first cycle, not insufficient_data
        assert set(first) == set(fleet.direct)
        for status in first.values():
            assert status.recommendation and status.recommendation.decision != "insufficient_data", status
        (store_fleet,) = advisor.fleets
        sent = store_fleet.client.queries_sent
        for _ in range(2):
            statuses = {status.server: status for status in advisor.run_cycle(timeout=20.0)}
        assert store_fleet.client.queries_sent - sent == 2 * store_fleet.queries_per_cycle == 2 * 5
        # the fleet's servers do differ: chat and long documents put contexts an order of magnitude apart (their
        # decisions usually differ too, but the long-document server sits near its optimum, where a hold and a
        # small move are both right, so the traffic, not the decision, is what shows they differ)
        contexts = [s.workload.effective_context_length or 0.0 for s in fleet.direct.values()]
        assert min(contexts) > 0 and max(contexts) > 5 * min(contexts), contexts
        for server, direct in fleet.direct.items():
            assert_same_recommendation(direct, statuses[server])
            assert statuses[server].up and not statuses[server].last_errors
        assert_same_series(series_keys(advisor), fleet.direct_series)
    finally:
        advisor.close()


def test_gauge_only_constants_when_servers_are_unreachable(fleet: Fleet) -> None:
    advisor = Advisor(config_from_dict(store_config(fleet.prometheus, server_info_url="")))
    try:
        statuses = {s.server: s for s in advisor.run_cycle(timeout=60.0)}
    finally:
        advisor.close()
    chat = host_of(fleet.emulators[0].url)  # default config: SGLang's ratio 0.9, the assumed one
    rec = statuses[chat].recommendation
    assert rec is not None and rec.ratio is not None
    assert "constants_from_pool_gauges" in rec.note_codes
    direct = fleet.direct[chat].recommendation
    assert direct is not None and direct.token_equiv is not None
    assert rec.token_equiv == pytest.approx(direct.token_equiv, rel=0.01)
    assert rec.decision == direct.decision


def test_one_shot_prints_one_recommendation_per_server(fleet: Fleet) -> None:
    command = [sys.executable, "-m", "advisor", "recommend", "--prometheus-url", fleet.prometheus.url,
               "--selector", '{job="sglang"}', "--history", "1h", "--step", "1s", "--time-scale", str(SPEED)]
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    rows = {row["server"]: row for row in json.loads(done.stdout)["servers"]}
    assert set(rows) == set(fleet.direct)
    for server, direct in fleet.direct.items():
        assert direct.recommendation is not None and direct.recommendation.ratio is not None
        rec, row = direct.recommendation, rows[server]
        assert same_decision(advice_of(rec), advice_of(row)), (rec.reason, row["reason"])
        assert rec.decision != row["decision"] or same_ratio((rec.ratio, *(rec.goodput_plateau or (rec.ratio_lower, rec.ratio_upper))),
                          (row["recommended_ratio"], *(row["goodput_plateau"] or (row["ratio_lower"], row["ratio_upper"]))),
                          bool(rec.replay_source and row["replay_source"]),
                          rec.decision == row["decision"] == "hold"), (rec.reason, row["reason"])
    table = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["SERVER", "MODEL", "LIVE"]
    assert {line.split()[0] for line in lines[1:4]} == set(fleet.direct)


def test_one_shot_against_a_dead_store_is_one_line_and_exit_2() -> None:
    port = free_loopback_port()
    done = subprocess.run([sys.executable, "-m", "advisor", "recommend", "--prometheus-url", f"http://127.0.0.1:{port}",
                           "--history", "1h"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "connection refused" in done.stderr


def test_servers_come_and_go_without_leaks(fleet: Fleet) -> None:
    config = store_config(fleet.prometheus, forget_after_seconds="600s")  # 5 wall seconds at SPEED
    advisor = Advisor(config_from_dict(config))
    late_name = f"127.0.0.1:{fleet.late_port}"
    late = EmulatedServer(load_server_config("default"), load_workload("demo"), speed=SPEED, port=fleet.late_port)
    try:
        advisor.run_cycle(timeout=60.0)
        (store_fleet,) = advisor.fleets
        assert late_name not in store_fleet.pipelines
        late.start()

        def seen() -> bool:
            return late_name in {s.server for s in advisor.run_cycle(timeout=20.0)}

        wait_for(seen, 30, interval=0.5, what="the late server in the store")
        # It goes away: its scrapes fail, Prometheus marks its series stale. (Failing rather than stopping:
        # the emulator's stop() leaves keep-alive connections serving, so Prometheus would keep scraping.)
        late.set_fault("http500")

        def forgotten() -> bool:
            return late_name not in {s.server for s in advisor.run_cycle(timeout=20.0)}

        wait_for(forgotten, 40, interval=0.5, what="the stopped server forgotten")
        assert late_name not in store_fleet.pipelines
        assert set(store_fleet.pipelines) == set(fleet.direct)
        assert late_name not in {s.server for s in advisor.store.latest()}
    finally:
        late.stop()
        advisor.close()


def test_run_once_from_cold_is_not_insufficient_data(fleet: Fleet, tmp_path: Path) -> None:
    """`run --once` against the store recommends on its only cycle: the history replay replaces the warm-up."""
    config = tmp_path / "advisor.yaml"
    config.write_text(json.dumps({**store_config(fleet.prometheus), "timeout_seconds": 5, "interval_seconds": 10}))
    done = subprocess.run([sys.executable, "-m", "advisor", "run", "--once", "--json", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    statuses = {s["server"]: s for s in json.loads(done.stdout)}
    assert set(statuses) == set(fleet.direct)
    for server, direct in fleet.direct.items():
        assert direct.recommendation is not None
        once = statuses[server]["recommendation"]
        assert same_decision(advice_of(direct.recommendation), advice_of(once)), (direct.recommendation.reason,
                                                                                  once["reason"])


def test_unreachable_server_info_falls_back_to_the_gauges_and_is_counted(fleet: Fleet) -> None:
    dead = free_loopback_port()  # every server's /server_info template points at a closed port
    config = store_config(fleet.prometheus, server_info_url=f"http://127.0.0.1:{dead}/{{instance}}")
    advisor = Advisor(config_from_dict(config))
    try:
        statuses = {s.server: s for s in advisor.run_cycle(timeout=60.0)}
    finally:
        advisor.close()
    assert set(statuses) == set(fleet.direct)
    for status in statuses.values():
        assert status.scrape_errors_total["server_info"] >= 1
        assert status.recommendation is not None and status.recommendation.ratio is not None
        assert "constants_from_pool_gauges" in status.recommendation.note_codes


def record_range_queries(advisor: Advisor) -> list[tuple[float, float, int]]:
    """Every range query the advisor's store target sends from now on: (start, end, samples answered)."""
    (store_fleet,) = advisor.fleets
    asked: list[tuple[float, float, int]] = []
    sent: dict[int, tuple[float, float]] = {}  # a received answer (by id) -> the range it asked
    send_query_range, read = store_fleet.client.send_query_range, store_fleet.client.read

    def recorded_send(expr: str, start: float, end: float, step: float) -> Received:
        received = send_query_range(expr, start, end, step)
        sent[id(received)] = (start, end)
        return received

    def recorded_read(received: Received, **options: Any) -> QueryResult:
        asked_range = sent.pop(id(received), None)
        counted = [0]
        take = options.get("take")
        if take is not None:  # the series go to `take` as they are decoded: count them on their way

            def counting(rows: Iterator[tuple[Any, list[tuple[float, float]]]]) -> None:
                def each() -> Iterator[tuple[Any, list[tuple[float, float]]]]:
                    for labels, samples in rows:
                        counted[0] += len(samples)
                        yield labels, samples

                take(each())

            options["take"] = counting
        result = read(received, **options)
        if asked_range is not None:
            asked.append((*asked_range, counted[0] + sum(len(series.samples) for series in result.series)))
        return result

    store_fleet.client.send_query_range = recorded_send  # type: ignore[method-assign]
    store_fleet.client.read = recorded_read  # type: ignore[method-assign]
    return asked


def test_a_restart_resumes_from_the_checkpoint_and_reads_the_store_only_since(fleet: Fleet, tmp_path: Path) -> None:
    config = config_from_dict({**store_config(fleet.prometheus), "checkpoint_path": str(tmp_path / "state.json")})
    cold = Advisor(config)
    try:
        cold_asked = record_range_queries(cold)
        cold.run_cycle(timeout=60.0)
        before = {s.server: s for s in cold.run_cycle(timeout=20.0)}
    finally:
        cold.close()
    saved = json.loads((tmp_path / "state.json").read_text())["state"]
    (store_state,) = saved["stores"].values()
    assert set(store_state["servers"]) == set(saved["targets"]) == set(fleet.direct)
    read_until = store_state["read_until"]

    restarted = Advisor(config)
    try:
        assert restarted.load_checkpoint() is None
        (store_fleet,) = restarted.fleets
        assert set(store_fleet.pipelines) == set(fleet.direct)  # known before the store answers
        asked = record_range_queries(restarted)
        first = {s.server: s for s in restarted.run_cycle(timeout=60.0)}
    finally:
        restarted.close()
    # The cold start read the whole hour of history; the restart only from where the checkpoint left off.
    assert min(start for start, _, _ in cold_asked) <= read_until - 3500
    assert asked and min(start for start, _, _ in asked) == pytest.approx(read_until, abs=0.01)
    assert store_fleet.resumed_from == pytest.approx(read_until, abs=0.01)
    # ... its range queries span the seconds since the checkpoint, not the hour (the cold start folds the older
    # part of that hour in coarse steps, so the sample counts differ less than the spans do)
    resumed_span = max(end for _, end, _ in asked) - min(start for start, _, _ in asked)
    assert resumed_span < 300, resumed_span
    cold_samples, resumed_samples = sum(n for *_, n in cold_asked), sum(n for *_, n in asked)
    assert resumed_samples < cold_samples, (resumed_samples, cold_samples)
    # ... and its first recommendation continues the estimate the checkpoint held, not a cold one.
    for server, status in first.items():
        previous = before[server]
        assert status.up and status.recommendation is not None, status.last_errors
        assert status.recommendation.decision != "insufficient_data"
        assert status.workload.history_seconds >= previous.workload.history_seconds
        assert status.workload.requests_observed >= previous.workload.requests_observed
        rec, was = status.recommendation, previous.recommendation
        assert rec.ratio is not None and was is not None and was.ratio is not None
        # Where the restart's replay is due (and the cycle's budget reaches it), it replays the same traffic afresh
        # (another random draw of the lengths), so its plateau may move by the replay's noise (and a gain near
        # the restart bar may turn a hold into a move): the ratio stays on the band it had, or near it.
        was_band = (was.ratio, *(was.goodput_plateau or (was.ratio_lower, was.ratio_upper)))
        rec_band = (rec.ratio, *(rec.goodput_plateau or (rec.ratio_lower, rec.ratio_upper)))
        # Two holds whose plateaus overlap are the same advice (keep what runs), wherever the prior fell inside
        # each redrawn plateau.
        ends = (was_band[1], was_band[2], rec_band[1], rec_band[2])
        both_hold = (was.decision == rec.decision == "hold" and None not in ends
                     and max(was_band[1], rec_band[1]) <= min(was_band[2], rec_band[2]))
        assert same_ratio(was_band, rec_band, True) or both_hold or rec.ratio == pytest.approx(was.ratio, rel=0.35), (
            server, was.reason, rec.reason)


def test_a_restart_whose_replays_the_budget_defers_answers_from_the_checkpoints_curves(
        fleet: Fleet, tmp_path: Path) -> None:
    """A restarted advisor whose cycle has no replay budget left for a server answers from the curve the
    checkpoint holds, never from the closed form: the advice does not flip because the daemon restarted."""
    saved = {**store_config(fleet.prometheus), "checkpoint_path": str(tmp_path / "state.json")}
    cold = Advisor(config_from_dict(saved))
    try:
        (cold_fleet,) = cold.fleets
        for _ in range(len(fleet.direct) + 1):  # the budget replays at least one server a cycle
            before = {s.server: s.recommendation for s in cold.run_cycle(timeout=60.0)}
            if all(p.replay_result is not None for p in cold_fleet.pipelines.values()):
                break
    finally:
        cold.close()
    restarted = Advisor(config_from_dict({**saved, "replay_budget_seconds": 0}))
    try:
        assert restarted.load_checkpoint() is None
        first = {s.server: s.recommendation for s in restarted.run_cycle(timeout=60.0)}
        (store_fleet,) = restarted.fleets
        budget = store_fleet.last_replay_budget
    finally:
        restarted.close()
    # no replay ran: each server's curve was either not yet due or deferred, and came from the checkpoint
    assert budget is not None and budget.ran == 0, (budget.ran, budget.deferred)
    assert set(first) == set(before) == set(fleet.direct)
    for server, rec in first.items():
        was = before[server]
        assert was is not None and was.replay_source and rec is not None
        assert rec.replay_source == was.replay_source and rec.goodput_curve == was.goodput_curve, (server, rec.reason)
        assert rec.decision == was.decision and rec.ratio == pytest.approx(was.ratio), (server, was.reason, rec.reason)


def test_the_replays_of_a_fleet_share_one_budget_oldest_first(fleet: Fleet) -> None:
    """With a budget smaller than one replay, each cycle replays one server (the one whose curve is oldest or
    missing) and the others keep what they had; within as many cycles as servers, every server has a curve."""
    advisor = Advisor(config_from_dict({**store_config(fleet.prometheus), "replay_budget_seconds": 0.001}))
    replayed: list[set[str]] = []
    try:
        (store_fleet,) = advisor.fleets
        for _ in range(len(fleet.direct)):
            cycle = {status.server: status.recommendation for status in advisor.run_cycle(timeout=60.0)}
            budget = store_fleet.last_replay_budget
            assert budget is not None and budget.ran == 1, (budget.ran, budget.deferred)
            replayed.append({name for name, p in store_fleet.pipelines.items() if p.replay_time is not None})
            # a server the budget has not reached yet answers from the closed form, and says so
            for name, rec in cycle.items():
                waiting = name not in replayed[-1]
                assert rec is not None and rec.replay_source is None if waiting else rec.replay_source, (name, rec)
                assert waiting == any("replay has not reached this server" in note for note in rec.notes), rec.notes
        statuses = {s.server: s for s in advisor.run_cycle(timeout=60.0)}
    finally:
        advisor.close()
    assert [len(names) for names in replayed] == list(range(1, len(fleet.direct) + 1))
    assert all(status.recommendation and status.recommendation.replay_source for status in statuses.values())
    none = Advisor(config_from_dict({**store_config(fleet.prometheus), "replay_budget_seconds": 0}))
    try:
        statuses = {s.server: s for s in none.run_cycle(timeout=60.0)}
        (store_fleet,) = none.fleets
        assert store_fleet.last_replay_budget is not None and store_fleet.last_replay_budget.ran == 0
        assert store_fleet.last_replay_budget.deferred == len(fleet.direct)
    finally:
        none.close()
    assert not any(status.recommendation and status.recommendation.replay_source for status in statuses.values())
