"""The recommender's policy step by step, table-driven over hand-built summaries and outcomes."""

import pytest

from advisor.estimate.summary import WorkloadSummary
from advisor.model.advice import PinChoice, pin_choice
from advisor.model.pools import GIB, PIN_RATIO_THRESHOLD, ByteConstants, optimal_ratio_for
from advisor.model.serving import ServingConfig
from advisor.recommend.policy import (
    PIN_KEEP_FACTOR,
    REASON_CODES,
    closed_loop_nudge,
    decide,
    pin_ratio_threshold,
    pool_outcome,
    pool_outcomes,
)

CONSTANTS = ByteConstants(13.50 * GIB / 258, 15.03 * GIB / 1167553)
REST = 28.53 * GIB
LOOP = {"evidence_threshold": 0.2, "strength": 0.5, "limit": 0.3}


@pytest.mark.parametrize(
    ("summary", "live_binding", "log_factor", "evidence"),
    [
        # the state pool saturates while the model expected balance or KV: up, proportional to saturation
        (WorkloadSummary(state_pool_saturation_ratio=0.4), "kv", 0.2, "state_saturated"),
        (WorkloadSummary(state_pool_saturation_ratio=0.4), "balanced", 0.2, "state_saturated"),
        (WorkloadSummary(state_pool_saturation_ratio=0.9), "kv", 0.3, "state_saturated"),  # bounded at the limit
        # ... but not when the model already says the state pool binds: no contradiction
        (WorkloadSummary(state_pool_saturation_ratio=0.9), "state", 0.0, None),
        # weak evidence (under the threshold, or KV-blocking as large) nudges nothing
        (WorkloadSummary(state_pool_saturation_ratio=0.15), "kv", 0.0, None),
        (WorkloadSummary(state_pool_saturation_ratio=0.4, kv_blocked_ratio=0.3), "kv", 0.0, None),
        # KV-blocked admission with the model expecting the state pool to bind: down
        (WorkloadSummary(kv_blocked_ratio=0.5), "state", -0.25, "kv_blocked"),
        (WorkloadSummary(kv_blocked_ratio=0.9), "state", -0.3, "kv_blocked"),
        # retractions with an idle state pool count as KV evidence, at 0.2
        (WorkloadSummary(retractions_per_second=0.5), "state", -0.1, "kv_blocked"),
        (WorkloadSummary(retractions_per_second=0.5, state_pool_saturation_ratio=0.1), "state", 0.0, None),
        (WorkloadSummary(kv_blocked_ratio=0.9), "kv", 0.0, None),
        # no prediction at the live config: nothing to contradict
        (WorkloadSummary(state_pool_saturation_ratio=0.9), None, 0.0, None),
    ],
)
def test_closed_loop_nudge(summary, live_binding, log_factor, evidence):
    nudge = closed_loop_nudge(summary, live_binding, **LOOP)
    assert nudge.log_factor == pytest.approx(log_factor)
    assert nudge.evidence == evidence


def test_pool_outcome_at_the_seed_example():
    # the seed's TP8 boot: r 0.9 gives clamp 51 at S = 5 (extra_buffer), and the KV pool holds 126.7 requests of 9216
    outcome = pool_outcome(REST, ServingConfig(mamba_full_memory_ratio=0.9), CONSTANTS, 9216, 262144)
    assert outcome.split.max_running_requests == 51
    assert outcome.kv_capacity_requests == pytest.approx(126.7, abs=0.1)
    assert outcome.binding_pool == "state"
    assert outcome.concurrency == 51


def test_pool_outcomes_gain_and_balance():
    serving = ServingConfig(strategy="extra_buffer_lazy", mamba_full_memory_ratio=0.9)
    r_star = optimal_ratio_for(serving, CONSTANTS, 9216)
    outcomes = pool_outcomes(REST, serving, CONSTANTS, live=pool_outcome(REST, serving, CONSTANTS, 9216, 262144), context_length=9216, target_ratio=r_star,
                             balanced_ratio=r_star, bias_factor=1.0, model_context_len=262144)
    assert outcomes.pin is None
    assert outcomes.recommended.binding_pool == "balanced"
    assert outcomes.gain == pytest.approx(outcomes.recommended.concurrency / 64)  # clamp 64 live at S = 4
    assert outcomes.gain == pytest.approx(outcomes.balanced_gain)
    assert outcomes.gain > 1.3


def test_pool_outcomes_pin_for_long_context_admits_the_biased_balance():
    serving = ServingConfig(strategy="extra_buffer_lazy")
    r_star = optimal_ratio_for(serving, CONSTANTS, 200_000)
    assert r_star < PIN_RATIO_THRESHOLD
    plain = pool_outcomes(REST, serving, CONSTANTS, live=pool_outcome(REST, serving, CONSTANTS, 200_000, 262144), context_length=200_000, target_ratio=r_star,
                          balanced_ratio=r_star, bias_factor=1.0, model_context_len=262144)
    biased = pool_outcomes(REST, serving, CONSTANTS, live=pool_outcome(REST, serving, CONSTANTS, 200_000, 262144), context_length=200_000, target_ratio=r_star * 1.5,
                           balanced_ratio=r_star, bias_factor=1.5, model_context_len=262144)
    assert plain.pin is not None and plain.pin.why == "fragile_ratio"
    assert plain.recommended.split.max_mamba_cache_size == plain.pin.max_mamba_cache_size
    assert biased.pin.max_mamba_cache_size > plain.pin.max_mamba_cache_size  # the bias favours the state pool


@pytest.mark.parametrize(
    ("ratio", "config", "why"),
    [
        (1.8, ServingConfig(), None),
        (0.1, ServingConfig(), "fragile_ratio"),
        (1.8, ServingConfig(dcp_size=8, tp_size=8), "dcp"),
        (0.16, ServingConfig(), None),  # just above the threshold, with room for many requests
    ],
)
def test_one_pin_rule(ratio, config, why):
    choice = pin_choice(ratio, config, CONSTANTS, REST, 9216)
    assert (choice.why if choice else None) == why


@pytest.mark.parametrize(
    ("previous", "ratio", "why"),
    [
        ((None, None), 0.16, None),
        ((None, None), 0.14, "fragile_ratio"),
        (("pin_state_pool", "pin_fragile_ratio"), 0.16, "fragile_ratio"),  # a pin stands just above 0.15 ...
        (("pin_state_pool", "pin_fragile_ratio"), 0.19, None),  # ... until past the keep factor
        (("lower_ratio", "kv_pool_short"), 0.13, None),  # a lowered ratio stands just under 0.15 ...
        (("lower_ratio", "kv_pool_short"), 0.11, "fragile_ratio"),  # ... until past it
        (("hold", "inside_bounds"), 0.14, "fragile_ratio"),
    ],
)
def test_the_fragile_ratio_pin_keeps_what_was_advised_while_the_ratio_wanders_near_its_threshold(previous, ratio, why):
    threshold = pin_ratio_threshold(*previous)
    assert threshold in (PIN_RATIO_THRESHOLD, PIN_RATIO_THRESHOLD * PIN_KEEP_FACTOR, PIN_RATIO_THRESHOLD / PIN_KEEP_FACTOR)
    choice = pin_choice(ratio, ServingConfig(), CONSTANTS, REST, 9216, threshold)
    assert (choice.why if choice else None) == why


def test_a_small_ratio_is_not_fragile_where_its_state_budget_holds_many_requests():
    """The held-out dense Mamba2 hybrid on TP2: a slot is ~800 KV tokens (12.5 MiB against 16 KiB a token), so r 0.10
    holds ~49 requests' worth of slots (3 a request), and one request's worth is 2% of its clamp: the ratio is set,
    not pinned. The suite's models hold ~10 at r 0.10 (a slot of ~4,000 tokens) and pin."""
    small_slots = ByteConstants(6.25 * GIB / 512, 8.0 * GIB / 524288)
    no_buffer = ServingConfig(tp_size=2, strategy="no_buffer")
    assert pin_choice(0.10, no_buffer, small_slots, 20.0 * GIB, 9216) is None
    assert pin_choice(0.02, no_buffer, small_slots, 20.0 * GIB, 9216).why == "fragile_ratio"  # ~10 requests' worth
    assert pin_choice(0.10, ServingConfig(), CONSTANTS, REST, 9216).why == "fragile_ratio"


def test_pin_rule_thin_state_budget():
    huge_slots = ByteConstants(REST / 20, CONSTANTS.kv_bytes_per_token)  # 20 slots in the whole budget
    choice = pin_choice(0.5, ServingConfig(), huge_slots, REST, 9216)
    assert choice is not None and choice.why == "thin_state_budget"


PIN = PinChoice(max_mamba_cache_size=200, balanced_requests=40, why="fragile_ratio")
BOUNDS = {"ratio_lower": 1.8, "ratio_upper": 2.2}


@pytest.mark.parametrize(
    ("kwargs", "decision", "code"),
    [
        ({"live_ratio": 0.9, "gain": 1.4, "balanced_gain": 1.4}, "raise_ratio", "state_pool_short"),
        ({"live_ratio": 5.0, "gain": 1.3, "balanced_gain": 1.3}, "lower_ratio", "kv_pool_short"),
        ({"live_ratio": 2.1, "gain": 1.01, "balanced_gain": 1.01}, "hold", "inside_bounds"),
        # outside the bounds, but moving gains under 10% of concurrency: a restart is not worth it
        ({"live_ratio": 1.5, "gain": 1.06, "balanced_gain": 1.08}, "hold", "gain_below_threshold"),
        ({"live_ratio": 3.0, "gain": 1.02, "balanced_gain": 1.02}, "hold", "gain_below_threshold"),
        # the biased target's own gain is small, the balanced split's is not: move
        ({"live_ratio": 0.9, "gain": 1.05, "balanced_gain": 1.3}, "raise_ratio", "state_pool_short"),
        # no pool sizes (no gain known): only the bounds decide
        ({"live_ratio": 0.9, "gain": None, "balanced_gain": None}, "raise_ratio", "state_pool_short"),
        ({"live_ratio": None, "gain": None, "balanced_gain": None}, "hold", "live_ratio_unknown"),
        ({"live_ratio": 0.9, "gain": 1.4, "balanced_gain": 1.4, "pin": PIN}, "pin_state_pool", "pin_fragile_ratio"),
        ({"live_ratio": 0.9, "gain": 1.0, "balanced_gain": 1.0, "pin": PIN, "live_pin": 190}, "hold", "pinned_as_recommended"),
        ({"live_ratio": 0.9, "gain": 1.4, "balanced_gain": 1.4, "pin": PIN, "live_pin": 150}, "pin_state_pool", "pin_fragile_ratio"),
    ],
)
def test_decide(kwargs, decision, code):
    args = {"target_ratio": 2.0, "live_pin": None, "pin": None, "min_gain": 0.10, **BOUNDS, **kwargs}
    result = decide(**args)
    assert (result.decision, result.reason_code) == (decision, code)
    assert result.reason_code in REASON_CODES


def test_min_gain_is_the_knob_of_the_hold():
    args = {"target_ratio": 2.0, "live_pin": None, "pin": None, "live_ratio": 1.5, "gain": 1.06, "balanced_gain": 1.06,
            **BOUNDS}
    assert decide(min_gain=0.10, **args).decision == "hold"
    assert decide(min_gain=0.05, **args).decision == "raise_ratio"
    assert decide(min_gain=0.0, **args).reason_code == "state_pool_short"
