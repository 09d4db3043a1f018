"""The replay's worker processes: the same curve as in the daemon's own process, and a broken pool falls back."""

from advisor.daemon import replay_pool
from advisor.estimate.traffic import TrafficPicture
from advisor.recommend.replay import replay_curve
from advisor.sim.config import load_server_config
from advisor.sim.workload import workload_from_dict

CHAT = {
    "name": "chat",
    "arrival": {"process": "poisson", "rate": 3.0},
    "classes": [{"name": "chat", "input": {"median": 1500, "sigma": 0.6},
                 "output": {"median": 500, "sigma": 0.5, "max": 2048}, "max_new_tokens": {"fixed": 2048}}],
}


def _picture() -> TrafficPicture:
    return TrafficPicture(workload_from_dict(CHAT).requests(3, 600), 600.0, "test")


def test_two_worker_processes_replay_the_same_curve_as_one():
    server, picture = load_server_config("default"), _picture()
    inline = replay_curve(server, picture, prior_ratio=3.0, live_ratio=0.9)
    try:
        spread = replay_curve(server, picture, prior_ratio=3.0, live_ratio=0.9, run_many=replay_pool.runner(2))
        assert replay_pool._pools  # the batches really went to the worker processes
    finally:
        replay_pool.shutdown()
    assert inline is not None and spread == inline


def test_a_pool_that_fails_runs_the_replay_in_the_daemons_process(monkeypatch):
    def broken(workers):
        raise OSError("cannot start worker processes")

    monkeypatch.setattr(replay_pool, "_pool", broken)
    server, picture = load_server_config("default"), _picture()
    curve = replay_curve(server, picture, prior_ratio=3.0, live_ratio=0.9, run_many=replay_pool.runner(2))
    assert curve == replay_curve(server, picture, prior_ratio=3.0, live_ratio=0.9)
