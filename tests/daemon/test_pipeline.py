"""One cycle over genuine SGLang bodies served on loopback, and every failure mode of a target."""


import pytest
from replay_server import ReplayServer
from support import FIXTURES

from advisor.config import config_from_dict
from advisor.daemon.runner import Advisor


def advisor_for(*urls, targets_extra=None, **extra):
    data = {"targets": [{"name": f"t{i}", "url": u, **(targets_extra or {})} for i, u in enumerate(urls)],
            "timeout_seconds": 1.0, "stale_after_cycles": 2, **extra}
    return Advisor(config_from_dict(data))


def test_cycle_on_genuine_fixtures():
    with ReplayServer() as server:
        advisor = advisor_for(server.url)
        first = advisor.run_cycle()[0]
        assert first.up and first.model_name
        report = advisor.reports["t0"]
        assert report.metrics is not None and report.server_info is not None
        # the lifetime histograms of the first scrape feed the estimator (no checkpoint to double count)
        assert first.workload.requests_observed == pytest.approx(4000, rel=0.01)
        assert first.workload.context_length_mean == pytest.approx(7601.7, rel=0.01)
        assert first.recommendation is not None
        assert first.recommendation.token_equiv is not None  # inverted from /server_info
        advisor.close()


@pytest.mark.parametrize("fault", ["http500", "garbage", "truncate"])
def test_bad_scrapes_are_counted_and_the_estimate_kept(fault):
    with ReplayServer() as server:
        advisor = advisor_for(server.url)
        good = advisor.run_cycle()[0]
        server.fault = fault
        bad = [advisor.run_cycle()[0] for _ in range(2)]
        assert not bad[-1].up
        assert bad[-1].stale and bad[-1].recommendation.decision == "inputs_stale"
        assert bad[-1].scrape_errors_total["metrics"] == 2
        assert bad[-1].workload.requests_observed == good.workload.requests_observed
        assert bad[-1].last_errors and len(bad[-1].last_errors[0].splitlines()) == 1
        server.fault = "none"
        assert advisor.run_cycle()[0].up
        advisor.close()


def test_a_hanging_target_does_not_delay_the_others():
    with ReplayServer() as hanging, ReplayServer() as healthy:
        hanging.fault = "hang"
        advisor = advisor_for(hanging.url, healthy.url)
        advisor.run_cycle(timeout=0.5)
        # the cycle returned while the hanging target still waits on its request timeout, and the healthy
        # target's status was published meanwhile
        assert not advisor._busy["t0"].done()
        # the overrunning target is shown (down, with the reason) and counted, not missing (issue 10)
        assert not advisor.latest["t0"].up and "deadline" in advisor.latest["t0"].last_errors[0]
        assert advisor.latest["t0"].scrape_errors_total["deadline"] == 1
        assert advisor.latest["t1"].up
        # next cycle: the busy target is skipped, not queued behind itself
        advisor.run_cycle(timeout=0.5)
        assert advisor.latest["t1"].up
        advisor.close()


def test_a_dead_target_is_an_error_not_a_crash():
    advisor = advisor_for("http://127.0.0.1:9")
    status = advisor.run_cycle()[0]
    assert not status.up and status.scrape_errors_total["metrics"] == 1
    assert "metrics" in status.last_errors[0]
    advisor.close()


def test_request_log_rotation_and_truncation_lose_nothing(tmp_path):
    """The daemon follows a request log that is rotated (renamed, new file) and later truncated."""
    lines = (FIXTURES / "logs" / "requests-json.log").read_text().splitlines(keepends=True)
    log = tmp_path / "requests.log"
    with ReplayServer() as server:
        advisor = advisor_for(server.url, targets_extra={"log_paths": [str(log)]})
        log.write_text("".join(lines[:100]) + lines[100][:50])  # the last line is still being written
        first = advisor.run_cycle()[0]
        assert first.workload.requests_observed == 100
        with log.open("a") as handle:
            handle.write(lines[100][50:] + "".join(lines[101:200]))
        log.rename(tmp_path / "requests.log.1")  # rotation: the old file is finished, a new one starts
        log.write_text("".join(lines[200:300]))
        advisor.run_cycle()
        second = advisor.run_cycle()[0]
        assert second.workload.requests_observed == 300
        log.write_text("".join(lines[300:350]))  # truncated and rewritten in place
        third = advisor.run_cycle()[0]
        assert third.workload.requests_observed == 350
        # request logs win over the metrics histograms: nothing is counted twice
        assert advisor.pipelines[0].server_state.uses_request_logs
        advisor.close()


def test_a_bug_in_one_cycle_is_counted_as_internal_and_the_daemon_goes_on(monkeypatch):
    with ReplayServer() as server:
        advisor = advisor_for(server.url)
        assert advisor.run_cycle()[0].up
        source = advisor.pipelines[0].source
        real_fetch = source.fetch_metrics

        def broken():
            raise RuntimeError("estimator exploded")

        monkeypatch.setattr(source, "fetch_metrics", broken)
        status = advisor.run_cycle()[0]
        assert status.scrape_errors_total["internal"] == 1
        assert status.scrape_errors_total["metrics"] == 0
        assert not status.up and "estimator exploded" in status.last_errors[0]
        monkeypatch.setattr(source, "fetch_metrics", real_fetch)
        assert advisor.run_cycle()[0].up
        advisor.close()


def test_the_configured_decode_lock_skip_sets_s():
    with ReplayServer() as server:
        default = advisor_for(server.url)
        skipping = advisor_for(server.url, targets_extra={"skip_decode_lock": True})
        plain = default.run_cycle()[0].recommendation
        told = skipping.run_cycle()[0].recommendation
        assert told.slots_per_request == plain.slots_per_request - 1
        assert skipping.pipelines[0].server_model().serving.skip_decode_lock_source == "config"
        default.close()
        skipping.close()


def test_a_restart_counts_requests_in_flight_from_its_first_scrape_not_the_checkpoints(tmp_path):
    """The checkpoint's in-flight count is as old as the daemon's downtime: after a restart the first scrape sets
    the traffic baseline (its count and time), so the next interval's arrivals are that interval's."""
    checkpoint = str(tmp_path / "advisor.json")
    with ReplayServer() as server:
        advisor = advisor_for(server.url, checkpoint_path=checkpoint)
        advisor.run_cycle()
        traffic = advisor.pipelines[0].server_state.traffic
        traffic.last_in_system, traffic.last_time = 1000.0, 5.0  # a count long out of date
        advisor.save_checkpoint()
        advisor.close()
        restarted = advisor_for(server.url, checkpoint_path=checkpoint)
        assert restarted.load_checkpoint() is None
        pipeline = restarted.pipelines[0]
        assert pipeline.server_state.restored and pipeline.server_state.traffic.last_in_system == 1000.0
        restarted.run_cycle()
        traffic = pipeline.server_state.traffic
        assert traffic.last_in_system != 1000.0 and traffic.last_time is not None and traffic.last_time > 5.0
        restarted.close()
