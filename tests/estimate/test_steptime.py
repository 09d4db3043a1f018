"""The step-time fit: samples printed by a server with known costs give those costs back."""

import dataclasses

import numpy as np
import pytest

from advisor.estimate.steptime import StepSample, StepTimeEstimator, attention_context_of
from advisor.scheduler.costmodel import CostModel


def _samples(truth: CostModel, rng, count: int, *, spread: bool = True) -> list[StepSample]:
    out = []
    for _ in range(count):
        batch = float(rng.integers(4, 120)) if spread else 40.0
        kv = float(rng.uniform(1e4, 8e5)) if spread else 2e5
        prefills = float(rng.integers(0, 4)) if spread else 0.0
        tokens = prefills * float(rng.uniform(500, 8000))
        steps = 40.0
        decode = truth.decode_base_seconds + truth.decode_per_request_seconds * batch + truth.decode_per_kv_token_seconds * kv
        prefill = prefills * truth.prefill_base_seconds + truth.prefill_per_token_seconds * tokens
        seconds_per_step = decode + prefill / steps
        out.append(StepSample(batch=batch, kv_tokens=kv, gen_throughput=batch / seconds_per_step, steps=steps,
                              prefill_batches=prefills, prefill_tokens=tokens))
    return out


def test_a_server_four_times_slower_is_fitted_as_such():
    default = CostModel()
    truth = dataclasses.replace(default, decode_base_seconds=0.05, decode_per_request_seconds=0.0004,
                                decode_per_kv_token_seconds=1.0e-8, prefill_base_seconds=0.03,
                                prefill_per_token_seconds=8.0e-5)
    estimator = StepTimeEstimator()
    assert estimator.observe(100.0, _samples(truth, np.random.default_rng(1), 400)) == 400
    fit = estimator.fit()
    assert fit is not None and fit.speed_factor > 2.5
    for name in ("decode_base_seconds", "decode_per_request_seconds", "decode_per_kv_token_seconds",
                 "prefill_per_token_seconds"):
        assert getattr(fit.cost, name) == pytest.approx(getattr(truth, name), rel=0.1), name


def test_a_per_kv_token_cost_far_from_the_defaults_shape_is_fitted():
    """A memory-bound card decoding a dense hybrid: its per-KV-token cost is 9x the default's where its base step
    is under 2x, and the batches are small (1-33 running, a few long documents among chats). The pull toward the
    default's shape is weighed per coefficient against that coefficient's own evidence, so the per-KV-token
    cost, small beside the base step, is fitted as the server's (a pull weighed by the base step's held it at a
    third of it, and the per-request cost at 1.7x)."""
    truth = dataclasses.replace(CostModel(), decode_base_seconds=0.021, decode_per_request_seconds=0.00025,
                                decode_per_kv_token_seconds=1.8e-8)
    rng = np.random.default_rng(6)
    samples = []
    for _ in range(800):
        batch = float(rng.integers(1, 34))
        documents = float(rng.binomial(int(batch), 0.12))
        kv = (batch - documents) * float(rng.uniform(800, 2500)) + documents * float(rng.uniform(15_000, 45_000))
        seconds = truth.decode_base_seconds + truth.decode_per_request_seconds * batch \
            + truth.decode_per_kv_token_seconds * kv
        samples.append(StepSample(batch=batch, kv_tokens=kv, gen_throughput=batch / seconds, steps=40.0))
    estimator = StepTimeEstimator()
    estimator.observe(0.0, samples)
    fit = estimator.fit()
    assert fit is not None
    for name in ("decode_base_seconds", "decode_per_request_seconds", "decode_per_kv_token_seconds"):
        assert getattr(fit.cost, name) == pytest.approx(getattr(truth, name), rel=0.05), name


def test_a_steady_batch_still_gives_the_overall_speed():
    truth = dataclasses.replace(CostModel(), decode_base_seconds=0.036, decode_per_request_seconds=0.00045,
                                decode_per_kv_token_seconds=6e-9)
    estimator = StepTimeEstimator()
    estimator.observe(0.0, _samples(truth, np.random.default_rng(2), 50, spread=False))
    fit = estimator.fit()
    assert fit is not None
    a, _ = fit.cost.decode_linear(40, 2e5, 0.0)
    b, _ = truth.decode_linear(40, 2e5, 0.0)
    assert a == pytest.approx(b, rel=0.02)  # collinear data: the step time at what was seen is right


def test_unreadable_samples_are_skipped_and_nothing_gives_no_fit():
    estimator = StepTimeEstimator()
    assert estimator.fit() is None
    bad = [StepSample(0, 0, 10.0, 40), StepSample(10, 1e5, 0.0, 40), StepSample(10, float("nan"), 100.0, 40)]
    assert estimator.observe(0.0, bad) == 0 and estimator.fit() is None


def test_checkpoint_round_trip_gives_the_same_fit():
    estimator = StepTimeEstimator()
    estimator.observe(5.0, _samples(CostModel(), np.random.default_rng(3), 30))
    restored = StepTimeEstimator.from_dict(estimator.to_dict())
    assert restored.fit() == estimator.fit()
    with pytest.raises(ValueError):
        StepTimeEstimator.from_dict({**estimator.to_dict(), "version": 99})


def test_speculative_decoding_is_fitted_per_verify_pass():
    """gen throughput counts accepted tokens: a verify pass of `batch` requests yields batch x accept_length of
    them, and the pass's per-request cost holds the verify overhead of the drafts (which the cost model keeps
    apart as spec_verify_per_draft_token)."""
    truth = dataclasses.replace(CostModel(), spec_accept_length=3.0)
    draft_tokens = 4
    overhead = 1.0 + truth.spec_verify_per_draft_token * draft_tokens
    rng = np.random.default_rng(4)
    samples = []
    for _ in range(300):
        batch, kv = float(rng.integers(4, 48)), float(rng.uniform(1e4, 4e5))
        per_pass = truth.decode_base_seconds + truth.decode_per_request_seconds * batch * overhead \
            + truth.decode_per_kv_token_seconds * kv
        samples.append(StepSample(batch=batch, kv_tokens=kv, gen_throughput=batch * 3.0 / per_pass, steps=40.0,
                                  accept_length=3.0))
    estimator = StepTimeEstimator()
    estimator.observe(0.0, samples)
    fit = estimator.fit(draft_tokens=draft_tokens)
    assert fit is not None and fit.cost.spec_accept_length == pytest.approx(3.0)
    for name in ("decode_base_seconds", "decode_per_request_seconds", "decode_per_kv_token_seconds"):
        assert getattr(fit.cost, name) == pytest.approx(getattr(truth, name), rel=0.1), name


def test_prefills_estimated_from_counters_keep_the_defaults_shape_and_leave_the_decode_costs_right():
    """Prefill features estimated per scrape interval are noisy (the interval is not the decode line's): fitted
    freely, their costs shrink into the decode ones; marked as estimated, the prefill costs keep the default's
    shape at the fitted speed and the decode step is the server's own."""
    default = CostModel()  # a server half as fast again as the default, in every part
    truth = dataclasses.replace(default, **{name: 1.5 * getattr(default, name) for name in (
        "decode_base_seconds", "decode_per_request_seconds", "prefill_base_seconds", "prefill_per_token_seconds")})
    rng = np.random.default_rng(5)

    def samples(read: bool) -> list[StepSample]:
        out = []
        for _ in range(300):
            batch, steps = float(rng.integers(45, 52)), 40.0
            ran = float(rng.poisson(6.0))  # prefills the decode line's interval held
            estimated = 6.0 * float(rng.uniform(0.7, 1.3))  # what the scrape interval's counters say
            decode = truth.decode_base_seconds + truth.decode_per_request_seconds * batch
            seconds = decode + ran * (truth.prefill_base_seconds + 1200 * truth.prefill_per_token_seconds) / steps
            out.append(StepSample(batch=batch, kv_tokens=1e5, gen_throughput=batch / seconds, steps=steps,
                                  prefill_batches=estimated, prefill_tokens=1200 * estimated, prefill_read=read))
        return out

    def decode_error(read: bool) -> float:
        estimator = StepTimeEstimator()
        estimator.observe(0.0, samples(read))
        fit = estimator.fit()
        assert fit is not None
        return fit.cost.decode_linear(50, 1e5, 0.0)[0] / truth.decode_linear(50, 1e5, 0.0)[0] - 1.0

    assert abs(decode_error(read=False)) < 0.05
    assert decode_error(read=True) > 0.1  # what a free fit of the same samples makes of them


def test_the_attention_a_prefill_line_does_not_show_is_not_charged_twice():
    """A long-document server (prompts of 40K-90K tokens, none cached, prefilled in chunks of 8192, one to three
    chunks between two decode lines): each chunk also pays its tokens' attention to the chunks before it, which
    the lines do not show, so the per-token cost fitted from them holds it. Told the traffic's mean attention
    context, the fit splits it back: the chunks' prefill time within 1% of the server's and both prefill terms
    within 2%, where without it the per-token cost holds the attention and the attention term is charged on top."""
    truth = CostModel()
    rng = np.random.default_rng(4)
    prompts = [int(rng.uniform(40_000, 90_000)) for _ in range(200)]
    context = attention_context_of((prompt, 0) for prompt in prompts)
    assert context == pytest.approx(sum(p * p / 2 for p in prompts) / sum(prompts))
    every_chunk = [(min(8192, prompt - done), done) for prompt in prompts for done in range(0, prompt, 8192)]
    chunks = list(every_chunk)
    samples = []
    while chunks:
        taken = chunks[:int(rng.integers(1, 4))]
        del chunks[:len(taken)]
        batch, kv, steps = float(rng.integers(20, 60)), float(rng.uniform(1e5, 8e5)), 40.0
        decode = truth.decode_step_seconds(int(batch), kv)
        prefill = sum(truth.prefill_seconds(take, take * (done + take / 2.0)) for take, done in taken)
        samples.append(StepSample(batch=batch, kv_tokens=kv, gen_throughput=batch / (decode + prefill / steps),
                                  steps=steps, prefill_batches=float(len(taken)),
                                  prefill_tokens=float(sum(take for take, _ in taken))))
    estimator = StepTimeEstimator()
    estimator.observe(0.0, samples)
    plain, split = estimator.fit(), estimator.fit(attention_context=context)
    assert plain is not None and split is not None

    def prefill_time(cost: CostModel) -> float:  # what a replay charges for the traffic's chunks
        return sum(cost.prefill_seconds(take, take * (done + take / 2.0)) for take, done in every_chunk)

    assert prefill_time(plain.cost) > 1.03 * prefill_time(truth)  # the attention charged twice
    assert prefill_time(split.cost) == pytest.approx(prefill_time(truth), rel=0.01)
    for name in ("prefill_per_token_seconds", "prefill_per_token_context_seconds"):
        assert getattr(split.cost, name) == pytest.approx(getattr(truth, name), rel=0.02), name
    assert attention_context_of([]) == 0.0
    assert attention_context_of([(1000, 400)]) == pytest.approx(400 + 300)


def _long_document_gauge_samples(truth: CostModel, rng, count: int, burst_at: int) -> list[StepSample]:
    """What a dozen scrapes of a server of long documents (27K-token prompts at half a request a second) show:
    the gauges' step time covers the last 40 decode steps, which held a prompt's prefill or none; the prefill
    features are the scrape interval's mean. One window caught a burst of eight prompts."""
    out = []
    prompt, steps = 27000.0, 40.0
    for index in range(count):
        batch = float(rng.integers(3, 12))
        ran = 8 if index == burst_at else int(rng.poisson(0.3))
        estimated = 0.3 * float(rng.uniform(0.7, 1.3))
        decode = truth.decode_step_seconds(int(batch), 28000.0 * batch)
        prefill = ran * (truth.prefill_base_seconds + prompt * truth.prefill_per_token_seconds)
        seconds = decode + prefill / steps
        out.append(StepSample(batch=batch, kv_tokens=28000.0 * batch, gen_throughput=batch / seconds, steps=steps,
                              prefill_batches=estimated, prefill_tokens=prompt * estimated, prefill_read=False))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_a_dozen_lumpy_gauge_samples_give_the_servers_speed(seed):
    """A few gauge samples, one of them a burst's window several times slower than the interval's counters say:
    the fit keeps the default's shape at the samples' typical speed instead of following the burst (a replay
    stepping twice as slow as the server queued where it never did)."""
    truth = CostModel()
    estimator = StepTimeEstimator()
    rng = np.random.default_rng(seed)
    for index, sample in enumerate(_long_document_gauge_samples(truth, rng, 12, burst_at=int(rng.integers(3, 12)))):
        estimator.observe(60.0 * index, [sample])
    fit = estimator.fit()
    assert fit is not None

    def step(cost: CostModel, batch: int) -> float:
        return cost.decode_step_seconds(batch, 28000.0 * batch)

    # The speed to within the windows' own noise (a dozen Poisson draws of a 0.3 mean: the prefills the windows
    # held, burst aside, ran 0.0-0.6 per window) ...
    for batch in (4, 8, 12):
        assert step(fit.cost, batch) == pytest.approx(step(truth, batch), rel=0.6), batch
    # ... and no per-request or per-step cost the burst's batch made up: the step grows with the batch as it does.
    assert step(fit.cost, 12) / step(fit.cost, 4) == pytest.approx(step(truth, 12) / step(truth, 4), rel=0.1)


def test_a_checkpoint_from_before_the_outlier_cap_caps_against_the_servers_own_speed():
    """A checkpoint written before the cap kept no typical ratio: restored, the gauge samples' typical ratio is the
    overall one, so a server five times the default's speed keeps its ordinary samples whole (capped against the
    default, each would read 4x: the fit would come out fast)."""
    slow = CostModel(**{name: 5.0 * getattr(CostModel(), name) for name in (
        "decode_base_seconds", "decode_per_request_seconds", "decode_per_kv_token_seconds",
        "prefill_base_seconds", "prefill_per_token_seconds")})

    def sample(batch: float) -> StepSample:
        seconds = slow.decode_step_seconds(int(batch), 1e5)
        return StepSample(batch=batch, kv_tokens=1e5, gen_throughput=batch / seconds, steps=40.0, prefill_read=False)

    estimator = StepTimeEstimator()
    for index in range(10):
        estimator.observe(15.0 * index, [sample(8.0 + index)])
    saved = estimator.to_dict()
    del saved["estimated_log_ratio_sum"]
    restored = StepTimeEstimator.from_dict(saved)
    for each in (estimator, restored):
        each.observe(200.0, [sample(12.0)])
    ours, theirs = estimator.fit(), restored.fit()
    assert ours is not None and theirs is not None
    assert theirs.speed_factor == pytest.approx(ours.speed_factor, rel=1e-6)
    assert ours.speed_factor == pytest.approx(5.0, rel=0.05)
