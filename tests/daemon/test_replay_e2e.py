"""The what-if replay inside the daemon's cycle, against the emulated server on a shared manual clock: the traffic
picture fills from request logs or, without them, from /metrics alone; the step-time fit finds the emulated
server's own costs; the recommendation then comes from the replayed curve."""

import json

import numpy as np
import pytest
from test_daemon_e2e import STEP_SECONDS, cycles, make_advisor

from advisor.config import config_from_dict
from advisor.daemon.pipeline import REPLAY_SHIFT_MIN_SHARE, YOUNG_REGIME_WINDOW_SHARE
from advisor.daemon.runner import Advisor
from advisor.scheduler.costmodel import CostModel
from advisor.sim.clock import ManualClock
from advisor.sim.config import load_server_config
from advisor.sim.emulator import EmulatedServer
from advisor.sim.workload import load_workload, workload_from_dict


@pytest.mark.parametrize("request_logs", [True, False], ids=["request-logs", "metrics-only"])
def test_the_daemon_replays_the_observed_traffic(tmp_path, request_logs):
    clock = ManualClock()
    log_path = tmp_path / "sglang.log"
    config = load_server_config("default")
    server = EmulatedServer(config, load_workload("demo"), log_path=str(log_path),
                            request_log_path=str(log_path) if request_logs else None, clock=clock)
    server.start()
    server_start = clock.time()
    try:
        # a replay every 150 s: windows of 300, 450 and 600 s by the 20th cycle
        advisor = make_advisor(server.url, log_path, tmp_path, clock, replay_interval_seconds=150.0)
        replays = []  # (window, draws) of each replay, as the cycles showed them
        for _ in range(24):
            rec = cycles(advisor, server, clock, 1).recommendation
            if rec.replay_window_seconds is not None and (not replays or replays[-1][0] != rec.replay_window_seconds):
                replays.append((rec.replay_window_seconds, rec.replay_draws))
        assert rec.replay_source == ("request_log" if request_logs else "metrics")
        assert rec.replay_requests is not None and rec.replay_requests > 100
        assert len(rec.goodput_curve) >= 7  # five candidates, two refining points, the live ratio
        # the decode lines the emulator printed give its own step times back (at the batch it ran: its clamp)
        fitted = CostModel(**rec.step_time_coefficients)
        batch, kv_tokens = rec.predicted_max_running_requests_live, 4e5
        assert fitted.decode_linear(batch, kv_tokens, 0.0)[0] == pytest.approx(
            config.cost.decode_linear(batch, kv_tokens, 0.0)[0], rel=0.1)
        # demo traffic at 0.9 is state-bound: the replayed curve says to raise r, and by how much it gains
        assert rec.decision == "raise_ratio", rec.reason
        assert rec.predicted_goodput_gain_ratio is not None and rec.predicted_goodput_gain_ratio > 1.03
        assert rec.ratio_lower <= rec.ratio <= rec.ratio_upper
        # a metrics-only replay is read with the last one's draw where that one's window held three quarters of its
        # own: the third (600 s against 450), not the second (450 against 300)
        assert [draws for _, draws in replays] == ([1, 1, 1] if request_logs else [1, 1, 2]), replays
        if not request_logs:
            # the prefill lines followed from the log place each prompt at its admission (fcfs: in arrival
            # order): as many requests as the metrics counted, of the lengths the server was sent
            traffic = advisor.pipelines[0].server_state.traffic
            bins = list(traffic.bins)
            prompts = traffic._admitted_prompts(bins)
            admitted = sum(b.arrivals for b in bins) + (bins[0].queued_at_start or 0) - (traffic.last_queued or 0)
            assert len(prompts) == pytest.approx(admitted, rel=0.05), (bins[0].queued_at_start, traffic.last_queued)
            sent = [r.input_tokens for r in load_workload("demo").requests(0, clock.time() - server_start)]
            assert np.mean([p.tokens for p in prompts]) == pytest.approx(np.mean(sent), rel=0.1)
        advisor.close()
    finally:
        server.stop()


def test_a_restart_keeps_the_last_curve_and_decision_until_its_replay_is_due(tmp_path):
    """The checkpoint holds the last replayed curve and decision: a restarted advisor answers from that curve (not
    from the closed form) until its next replay is due, and a curve it cannot read is counted and replayed afresh."""
    clock = ManualClock()
    log_path = tmp_path / "sglang.log"
    server = EmulatedServer(load_server_config("default"), load_workload("demo"), log_path=str(log_path),
                            request_log_path=str(log_path), clock=clock)
    server.start()
    try:
        advisor = make_advisor(server.url, log_path, tmp_path, clock)
        before = cycles(advisor, server, clock, 24).recommendation
        curve = advisor.pipelines[0].replay_result
        assert before.decision == "raise_ratio" and curve is not None, before.reason
        advisor.save_checkpoint()
        advisor.close()

        # the next replay is an hour away: the restart's cycles answer from the checkpoint's curve
        restarted = make_advisor(server.url, log_path, tmp_path, clock, replay_interval_seconds=3600.0)
        assert restarted.load_checkpoint() is None
        pipeline = restarted.pipelines[0]
        assert pipeline.replay_result == curve
        kept = pipeline.last_recommendation
        assert kept is not None and (kept.decision, kept.ratio) == (before.decision, before.ratio)
        after = cycles(restarted, server, clock, 2).recommendation
        restarted.close()
        assert after.replay_source == before.replay_source and after.goodput_curve == before.goodput_curve
        assert (after.decision, after.ratio) == (before.decision, pytest.approx(before.ratio)), after.reason

        # a garbled curve costs the curve only: the estimate is restored, the error counted, the replay runs again
        saved = json.loads((tmp_path / "ckpt.json").read_text())
        entry = saved["state"]["targets"]["emu"]
        entry["replay"]["curve"]["points"] = "garbled"
        (tmp_path / "ckpt.json").write_text(json.dumps(saved))
        garbled = make_advisor(server.url, log_path, tmp_path, clock)
        assert garbled.load_checkpoint() is None
        pipeline = garbled.pipelines[0]
        assert pipeline.server_state.restored and pipeline.replay_result is None
        assert pipeline.errors_total.get("checkpoint") == 1
        assert any("last curve unusable" in message for message in pipeline.ledger.messages)
        again = cycles(garbled, server, clock, 1).recommendation
        garbled.close()
        assert again.replay_source == before.replay_source and again.decision == before.decision, again.reason
    finally:
        server.stop()


@pytest.mark.parametrize("server_config", ["default", "single-gpu-moe"])
def test_without_logs_the_gauges_give_the_decode_step_time_less_the_prefills(tmp_path, server_config):
    """`gen_throughput` holds the prefills run between two decode lines: from /metrics alone, the scrape interval's
    admissions stand for them, so the decode costs fitted are the server's own at the batch it ran (where they
    once held the prefills too, ~25% over, and a replay then stepped every prefill twice)."""
    clock = ManualClock()
    config = load_server_config(server_config)
    server = EmulatedServer(config, load_workload("steady-chat"), log_path=str(tmp_path / "sglang.log"), clock=clock)
    server.start()
    try:
        advisor = Advisor(config_from_dict({
            "targets": [{"name": "emu", "url": server.url}], "interval_seconds": STEP_SECONDS, "timeout_seconds": 5.0,
            "replay_min_window_seconds": 300.0}), wall_clock=clock.time)
        rec = cycles(advisor, server, clock, 24).recommendation
        advisor.close()
    finally:
        server.stop()
    assert rec.replay_source == "metrics" and not advisor.pipelines[0].uses_decode_lines
    fitted = CostModel(**rec.step_time_coefficients)
    batch, kv_tokens = rec.predicted_max_running_requests_live, 1e5
    assert fitted.decode_linear(batch, kv_tokens, 0.0)[0] == pytest.approx(
        config.cost.decode_linear(batch, kv_tokens, 0.0)[0], rel=0.08)


def test_the_decode_lines_interval_is_the_servers_own(tmp_path):
    """An operator who raised --decode-log-interval to quiet the log prints a decode line every 100 steps: the
    prefills between two lines are spread over that many steps (from /server_info), where the default 40 would
    read them at 0.4x their cost and the replay would run a prefill-heavy server too fast."""
    import dataclasses

    clock = ManualClock()
    config = dataclasses.replace(load_server_config("default"), decode_log_interval=100)
    log_path = str(tmp_path / "sglang.log")
    server = EmulatedServer(config, load_workload("bimodal-chat-docs"), log_path=log_path, clock=clock)
    server.start()
    try:
        advisor = Advisor(config_from_dict({
            "targets": [{"name": "emu", "url": server.url, "log_paths": [log_path]}], "interval_seconds": STEP_SECONDS,
            "timeout_seconds": 5.0, "replay_min_window_seconds": 300.0}), wall_clock=clock.time)
        rec = cycles(advisor, server, clock, 24).recommendation
        advisor.close()
    finally:
        server.stop()
    assert advisor.pipelines[0].uses_decode_lines and advisor.pipelines[0].decode_log_interval() == 100
    fitted = CostModel(**rec.step_time_coefficients)
    assert fitted.prefill_seconds(2000, 2e6) == pytest.approx(config.cost.prefill_seconds(2000, 2e6), rel=0.15)
    batch, kv_tokens = rec.predicted_max_running_requests_live, 1e5
    assert fitted.decode_linear(batch, kv_tokens, 0.0)[0] == pytest.approx(
        config.cost.decode_linear(batch, kv_tokens, 0.0)[0], rel=0.1)


def test_a_slow_servers_first_replay_waits_for_as_many_requests_as_a_recommendation_needs(tmp_path):
    """A curve from a few dozen requests moves by more than its noise from one replay to the next: the first
    replay waits (and says so) until its window holds the recommender's minimum, trying again every cycle."""
    clock = ManualClock()
    log_path = tmp_path / "sglang.log"
    workload = load_workload("steady-long-docs").scaled(0.2)  # ~0.1 requests/s: ~60 in the first 600 s
    server = EmulatedServer(load_server_config("default"), workload, log_path=str(log_path),
                            request_log_path=str(log_path), clock=clock)
    server.start()
    try:
        advisor = make_advisor(server.url, log_path, tmp_path, clock, replay_min_window_seconds=600.0)
        pipeline = advisor.pipelines[0]
        reasons = []
        for _ in range(60):
            rec = cycles(advisor, server, clock, 1).recommendation
            if pipeline.replay_result is not None:
                break
            assert pipeline.replay_time is None  # no curve yet: tried again next cycle, not an interval later
            reasons.append(rec.reason)
        advisor.close()
    finally:
        server.stop()
    assert pipeline.replay_result is not None and pipeline.replay_result.requests >= 100, reasons[-3:]
    assert rec.replay_source == "request_log" and rec.decision != "insufficient_data", rec.reason
    # while it waited, each cycle said for what: the history's hundred finished requests, or the window's hundred
    # (which holds what the server runs and queues past the request log's cut too, so it has them about when the
    # history does)
    assert reasons and all("need 100" in reason or "waits for 100 requests in its window" in reason
                           for reason in reasons), reasons[-3:]


def _chat_then_documents():
    """Chat for 10 minutes, then 50 of a document-heavy regime."""
    chat = {"name": "chat", "input": {"median": 1200, "sigma": 0.8, "min": 16, "max": 16000},
            "output": {"median": 300, "sigma": 0.7, "min": 1, "max": 4096}, "max_new_tokens": {"fixed": 4096}}
    docs = {"name": "docs", "input": {"median": 30000, "sigma": 0.4, "min": 4000, "max": 120000},
            "output": {"median": 700, "sigma": 0.6, "min": 1, "max": 8192}, "max_new_tokens": {"fixed": 8192}}
    return workload_from_dict({
        "name": "shift", "arrival": {"process": "poisson", "rate": 2.0}, "classes": [chat, docs],
        "phases": [{"duration": 600, "weights": {"chat": 0.95, "docs": 0.05}},
                   {"duration": 3000, "rate": 0.6, "weights": {"chat": 0.3, "docs": 0.7}}],
    })


def test_a_regime_shift_is_replayed_on_its_own_and_exported(tmp_path):
    """Chat for 10 minutes, then a document-heavy regime: before the shift the replay holds one regime; from a
    few minutes after it, the recommendation says how long the new regime has lasted and /metrics exports it."""
    from advisor.export.collector import AdvisorCollector

    workload = _chat_then_documents()
    clock = ManualClock()
    log_path = tmp_path / "sglang.log"
    server = EmulatedServer(load_server_config("default"), workload, log_path=str(log_path),
                            request_log_path=str(log_path), clock=clock)
    server.start()
    try:
        advisor = make_advisor(server.url, log_path, tmp_path, clock)
        before = cycles(advisor, server, clock, 19)  # 570 s: one regime so far
        assert before.recommendation.replay_requests is not None
        assert before.recommendation.replay_regime_seconds is None
        after = cycles(advisor, server, clock, 13)  # 960 s: six minutes of documents
        rec = after.recommendation
        assert rec.replay_regime_seconds is not None and 240.0 <= rec.replay_regime_seconds <= 360.0 + 60.0
        assert any("changed character" in note for note in rec.notes)
        exported = {sample.name: sample.value for family in AdvisorCollector(advisor.store).collect()
                    for sample in family.samples if sample.name == "sglang_advisor_traffic_regime_age_seconds"}
        assert exported == {"sglang_advisor_traffic_regime_age_seconds": rec.replay_regime_seconds}
        advisor.close()
    finally:
        server.stop()


@pytest.mark.parametrize("request_logs", [True, False], ids=["request-logs", "metrics-only"])
def test_a_young_regime_followed_by_request_logs_is_replayed_again_sooner(tmp_path, request_logs):
    """After a shift from chat to documents, the replay that the moved context brought on is followed by more, a
    quarter of the interval apart, while the new regime is young (under half the window): each reads it from a
    minute or two more of it. A metrics-only picture is a fresh draw each replay, and keeps the interval."""
    workload = _chat_then_documents()
    clock = ManualClock()
    log_path = tmp_path / "sglang.log"
    server = EmulatedServer(load_server_config("default"), workload, log_path=str(log_path),
                            request_log_path=str(log_path) if request_logs else None, clock=clock)
    server.start()
    try:
        advisor = make_advisor(server.url, log_path, tmp_path, clock)
        pipeline = advisor.pipelines[0]
        replays: list[tuple[float, float | None, bool]] = []  # (when, the regime's age it read, followed)
        for _ in range(40):  # 20 minutes: 10 of chat, 10 of documents
            cycles(advisor, server, clock, 1)
            if pipeline.replay_time is not None and (not replays or replays[-1][0] != pipeline.replay_time):
                assert pipeline.replay_result is not None
                replays.append((pipeline.replay_time, pipeline.replay_result.regime_seconds,
                                pipeline.replay_follow_ups > 0))
        interval = advisor.config.replay_interval_seconds
        assert any(age is not None for _, age, _ in replays)  # the regime was read
        followed = [(when, later) for (when, _, follows), (later, _, _) in zip(replays[:-1], replays[1:], strict=True)
                    if follows]
        if request_logs:
            # every replay of the young regime is followed, a quarter of the interval later (the next cycle after it)
            young_below = YOUNG_REGIME_WINDOW_SHARE * advisor.config.replay_window_seconds
            young = [when for when, age, _ in replays[:-1] if age is not None and age < young_below]
            assert len(young) >= 3 and set(young) <= {when for when, _ in followed}
            assert all(later - when <= interval * REPLAY_SHIFT_MIN_SHARE + STEP_SECONDS for when, later in followed)
        else:
            assert not followed  # the context's own moves still bring replays on, a draw each
        advisor.close()
    finally:
        server.stop()
