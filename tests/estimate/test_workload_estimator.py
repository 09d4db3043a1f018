"""The workload estimator: length-biased L, marginals reconstruction, spikiness, rates, confidence, checkpoint."""

import json

import numpy as np
import pytest

from advisor.estimate.workload import EstimatorSettings, ScrapeSample, WorkloadEstimator, pairs_from_marginals

SETTINGS = EstimatorSettings(half_life_seconds=3600, window_min_requests=20, window_min_seconds=10)


def feed(estimator, lengths, start, seconds, per_step=10):
    t = start
    for i in range(0, len(lengths), per_step):
        estimator.observe_requests(t, lengths[i : i + per_step])
        t += seconds
    return t


def test_point_mass_effective_length_is_input_plus_output():
    est = WorkloadEstimator(SETTINGS)
    feed(est, [(8192, 1024)] * 400, 0.0, 5.0)
    assert est.effective_context_length() == pytest.approx(9216)
    assert est.time_averaged_context() == pytest.approx(9216)
    assert est.spikiness() == pytest.approx(0.0, abs=1e-6)
    summary = est.summary(200.0)
    assert summary.context_length_mean == pytest.approx(9216)
    assert summary.context_length_p50 == pytest.approx(9216, rel=0.06)


def test_heavy_tailed_outputs_weigh_long_requests_more():
    rng = np.random.default_rng(0)
    outputs = rng.lognormal(np.log(300), 1.2, size=2000)
    est = WorkloadEstimator(SETTINGS)
    feed(est, [(1000.0, float(o)) for o in outputs], 0.0, 0.0)  # no decay between samples
    request_mean = 1000 + outputs.mean()
    expected = float(np.sum((1000 + outputs) * outputs) / outputs.sum())
    assert est.effective_context_length() == pytest.approx(expected, rel=1e-6)
    assert est.effective_context_length() > 1.5 * request_mean


def test_marginals_reconstruction_matches_sums():
    bounds = [100, 1000, 10000, float("inf")]
    inputs, outputs, weights = pairs_from_marginals(bounds, [0, 10, 30, 0], bounds, [20, 20, 0, 0], prompt_sum=150_000, generation_sum=12_000)
    assert weights.sum() == pytest.approx(40)
    assert np.dot(inputs, weights) == pytest.approx(150_000)
    assert np.dot(outputs, weights) == pytest.approx(12_000)


def test_regime_swings_raise_spikiness_and_harmonic_mean():
    est = WorkloadEstimator(SETTINGS)
    t = 0.0
    for _ in range(6):
        t = feed(est, [(1500, 500)] * 200, t, 2.0)
        t = feed(est, [(30000, 2000)] * 200, t, 2.0)
    assert est.spikiness() > 0.5
    # equal time in each regime: the time-averaged L sits between the two regimes' L_eff
    low, high = (1500 + 500), (30000 + 2000)
    assert low < est.time_averaged_context() < high
    assert est.time_averaged_context() == pytest.approx((low + high) / 2, rel=0.1)


def test_scrape_rates_and_saturation():
    est = WorkloadEstimator(SETTINGS)
    for step in range(11):
        est.observe_scrape(step * 10.0, ScrapeSample(running_requests=51, queued_requests=8, max_running_requests=51,
                                                     decode_sum_seq_lens=51 * 4000, retracted_requests=2 if step else 0))
    summary = est.summary(100.0)
    assert summary.state_pool_saturation_ratio == pytest.approx(1.0)
    assert summary.kv_blocked_ratio == pytest.approx(0.0)
    assert summary.retractions_per_second == pytest.approx(0.2)
    assert summary.live_context_mean == pytest.approx(4000)


def test_confidence_grows_with_history_and_requests():
    est = WorkloadEstimator(EstimatorSettings(confidence_history_seconds=100, confidence_requests=100))
    assert est.confidence(0.0) == 0.0
    est.observe_requests(0.0, [(100, 100)] * 50)
    assert est.confidence(50.0) == pytest.approx(0.5)
    est.observe_requests(60.0, [(100, 100)] * 150)
    assert est.confidence(200.0) >= 1.0


def test_checkpoint_round_trip_through_json():
    est = WorkloadEstimator(SETTINGS)
    feed(est, [(2000, 300)] * 100, 0.0, 3.0)
    est.observe_scrape(0.0, ScrapeSample(10, 0, 51))
    est.observe_scrape(5.0, ScrapeSample(51, 3, 51))
    restored = WorkloadEstimator.from_dict(json.loads(json.dumps(est.to_dict())))
    assert restored.summary(40.0) == est.summary(40.0)
    assert restored.confidence(40.0) == est.confidence(40.0)
    with pytest.raises(ValueError):
        WorkloadEstimator.from_dict({"version": 99})


def test_kv_blocked_needs_a_queue_below_the_clamp_and_kv_pressure():
    est = WorkloadEstimator(SETTINGS)
    samples = [
        ScrapeSample(30, 5, 51, kv_used_tokens=900, kv_capacity_tokens=1000),  # blocked: KV 90% full
        ScrapeSample(30, 5, 51, kv_used_tokens=200, kv_capacity_tokens=1000),  # queue, but KV idle: not KV
        ScrapeSample(51, 5, 51, kv_used_tokens=900, kv_capacity_tokens=1000),  # at the clamp: state
        ScrapeSample(30, 0, 51, kv_used_tokens=900, kv_capacity_tokens=1000),  # no queue
    ]
    est.observe_scrape(0.0, samples[-1])
    for i, sample in enumerate(samples):
        est.observe_scrape(10.0 * (i + 1), sample)
    summary = est.summary(40.0)
    assert summary.kv_blocked_ratio == pytest.approx(0.25, rel=0.01)
    assert summary.state_pool_saturation_ratio == pytest.approx(0.25, rel=0.01)
