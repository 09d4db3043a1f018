"""Where the observed traffic changed character: a regime shift is found, bursts and noise are not."""

import numpy as np
import pytest

from advisor.estimate.regime import RegimeSettings, regime_start
from advisor.scheduler.types import RequestSpec


def _traffic(rng, start, end, rate, docs_share, chat=1200, docs=30000):
    """Poisson arrivals over [start, end): chat prompts, and documents at `docs_share` of them."""
    count = rng.poisson(rate * (end - start))
    times = np.sort(rng.uniform(start, end, count))
    requests = []
    for t in times:
        median = docs if rng.random() < docs_share else chat
        prompt = int(max(16, rng.lognormal(np.log(median), 0.6)))
        requests.append(RequestSpec(float(t), prompt, int(max(1, rng.lognormal(np.log(300), 0.7))), 4096))
    return requests


def test_a_chat_server_turned_document_server_is_a_regime_from_where_it_turned():
    rng = np.random.default_rng(1)
    requests = _traffic(rng, 0, 1200, 3.0, 0.05) + _traffic(rng, 1200, 1500, 1.0, 0.7)
    start = regime_start(requests, 1500.0)
    assert start is not None and abs(start - 1200) <= 60


def test_a_document_server_turned_chat_server_is_one_too():
    rng = np.random.default_rng(2)
    requests = _traffic(rng, 0, 1100, 1.0, 0.7) + _traffic(rng, 1100, 1800, 3.0, 0.05)
    start = regime_start(requests, 1800.0)
    assert start is not None and abs(start - 1100) <= 60


@pytest.mark.parametrize("seed", range(6))
def test_steady_bimodal_traffic_holds_one_regime(seed):
    rng = np.random.default_rng(seed)
    assert regime_start(_traffic(rng, 0, 1800, 1.0, 0.15), 1800.0) is None


@pytest.mark.parametrize("seed", range(4))
def test_bursts_of_documents_the_window_has_seen_before_are_no_regime(seed):
    """Chat with 30 s of documents every 300 s, one of them just before the window's end: every earlier stretch as
    long as the last minutes holds a burst too."""
    rng = np.random.default_rng(seed)
    requests = _traffic(rng, 0, 1800, 3.0, 0.0)
    for burst in range(150, 1800, 300):
        requests += _traffic(rng, burst, burst + 30, 1.0, 1.0, docs=60000)
    requests.sort(key=lambda r: r.time)
    assert regime_start(requests, 1800.0) is None


def test_a_burst_that_fills_only_the_last_minutes_is_no_regime():
    """A flood of documents in the last 150 s of chat: the last minutes' mean is beyond anything before, but the
    first half of them is chat as before."""
    rng = np.random.default_rng(3)
    requests = _traffic(rng, 0, 1800, 3.0, 0.02) + _traffic(rng, 1650, 1800, 2.0, 1.0)
    requests.sort(key=lambda r: r.time)
    assert regime_start(requests, 1800.0) is None


def test_a_regime_younger_than_its_minimum_is_not_told_yet():
    rng = np.random.default_rng(4)
    young = _traffic(rng, 0, 1620, 3.0, 0.05) + _traffic(rng, 1620, 1800, 1.0, 0.7)  # 180 s < 240 s
    assert regime_start(young, 1800.0) is None
    start = regime_start(young, 1800.0, RegimeSettings(min_seconds=120.0))
    assert start is not None and abs(start - 1620) <= 60


def test_a_regime_older_than_half_the_window_is_told_from_the_windows_middle():
    """The regime is compared with an earlier stretch at least as long: where it began before the window's middle,
    the last half (all of it the new traffic) is what is told."""
    rng = np.random.default_rng(4)
    old = _traffic(rng, 0, 600, 3.0, 0.05) + _traffic(rng, 600, 1800, 1.0, 0.7)
    assert regime_start(old, 1800.0) == pytest.approx(900.0)


def test_the_settings_say_what_is_wrong():
    with pytest.raises(ValueError, match="min_seconds"):
        RegimeSettings(min_seconds=0)
