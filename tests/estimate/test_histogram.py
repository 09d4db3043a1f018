"""The decaying histogram: percentiles, decay by half-life, overflow-safe reference shifts, round trip."""

import numpy as np
import pytest

from advisor.estimate.histogram import DecayingHistogram, DecayingMoments, bucket_indices


def test_percentiles_round_up_to_bucket_end():
    hist = DecayingHistogram(3600)
    for value in range(1, 1001):
        hist.add(value * 10.0, 1.0, now=0.0)
    assert hist.percentile(0.5) == pytest.approx(5000, rel=0.06)
    assert hist.percentile(0.5) >= 5000
    assert hist.percentile(0.99) == pytest.approx(9900, rel=0.06)
    assert hist.mean() == pytest.approx(5005)


def test_half_life_halves_old_samples():
    hist = DecayingHistogram(60)
    hist.add(1000, 1.0, now=0.0)
    hist.add(100_000, 1.0, now=60.0)
    # the newer sample weighs twice the older: the mean sits 2/3 of the way to it
    assert hist.mean() == pytest.approx((1000 + 2 * 100_000) / 3)
    assert hist.total_weight(now=60.0) == pytest.approx(1.5)


def test_reference_time_shift_keeps_relative_weights():
    hist = DecayingHistogram(1.0)
    hist.add(1000, 1.0, now=0.0)
    hist.add(2000, 1.0, now=150.0)  # 2^150 would overflow a naive weight scale
    hist.add(3000, 1.0, now=151.0)
    assert hist.mean() == pytest.approx((2000 + 2 * 3000) / 3, rel=1e-6)


def test_round_trip_and_bad_checkpoint():
    hist = DecayingHistogram(600)
    for t, v in enumerate([100, 2000, 30000]):
        hist.add(v, 1.0, now=float(t))
    restored = DecayingHistogram.from_dict(hist.to_dict())
    assert restored.percentile(0.9) == hist.percentile(0.9)
    assert restored.mean() == pytest.approx(hist.mean())
    data = hist.to_dict()
    data["buckets"] = {"99999": 1.0}
    with pytest.raises(ValueError):
        DecayingHistogram.from_dict(data)


def test_moments_decay_and_spread():
    m = DecayingMoments(10)
    m.add(1.0, 1.0, now=0.0)
    m.add(3.0, 1.0, now=0.0)
    assert m.mean() == pytest.approx(2.0)
    assert m.std() == pytest.approx(1.0)
    m.add(3.0, 1.0, now=10.0)  # the first two now weigh half each
    assert m.mean() == pytest.approx((0.5 + 1.5 + 3.0) / 2.0)


def test_shared_bucket_indices_and_percentiles_in_one_pass_change_nothing():
    """Histograms fed the same lengths may share their bucket indices, and `percentiles` sums once: the
    weights and answers are those of the one-at-a-time path, bit for bit."""
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.lognormal(7, 1.2, 300), [np.nan, np.inf, -3.0, 0.0]])
    weights = np.concatenate([rng.random(300), [1.0, 1.0, 1.0, 0.0]])
    apart, shared = DecayingHistogram(600.0), DecayingHistogram(600.0)
    for step in range(5):
        apart.add_many(values * (1 + step), weights, now=100.0 * step)
        shared.add_many(values * (1 + step), weights, now=100.0 * step, buckets=bucket_indices(values * (1 + step)))
    assert np.array_equal(apart.weights, shared.weights) and apart.weighted_sum == shared.weighted_sum
    fractions = (0.5, 0.9, 0.99)
    assert shared.percentiles(fractions) == [apart.percentile(f) for f in fractions]
    assert DecayingHistogram(600.0).percentiles(fractions) == [None, None, None]
