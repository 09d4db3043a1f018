"""The traffic picture: what a replay is fed, from request logs or from per-interval metrics."""

import json
from dataclasses import replace

import numpy as np
import pytest

from advisor.estimate.traffic import (
    MIN_LIVE_SAMPLES,
    UNSET_MAX_NEW_TOKENS,
    ExactRequest,
    TrafficEstimator,
    TrafficPicture,
    TrafficSettings,
    _sample_lengths,
    _split_batch,
    admitted_prompts,
    live_context,
    paired_to_live_context,
    pairing_axis,
    picture_since,
    queue_share_over,
    redrawn,
    tiled,
)
from advisor.scheduler.types import RequestSpec

PROMPT_BOUNDS = (1000.0, 4000.0, 16000.0, 64000.0, float("inf"))
OUTPUT_BOUNDS = (128.0, 512.0, 2048.0, float("inf"))


def test_bins_keep_arrivals_and_each_bins_own_lengths():
    traffic = TrafficEstimator(TrafficSettings(window_seconds=600))
    traffic.observe_interval(0.0, 30.0, finished=0, in_system=4)  # the baseline
    # 10 bins of chat, then 10 bins of long documents: a burst the picture must keep in time
    for index in range(20):
        docs = index >= 10
        prompt_counts = [0, 0, 0, 30, 0] if docs else [30, 0, 0, 0, 0]
        traffic.observe_interval(30.0 * (index + 1), 30.0, finished=30, in_system=4 + index % 2,
                                 prompt_bounds=PROMPT_BOUNDS, prompt_counts=prompt_counts,
                                 prompt_sum=30 * (40000 if docs else 600),
                                 generation_bounds=OUTPUT_BOUNDS, generation_counts=[0, 30, 0, 0], generation_sum=30 * 300)
    picture = traffic.picture(seed=1)
    assert picture is not None and picture.source == "metrics"
    times = np.array([r.time for r in picture.requests])
    inputs = np.array([r.input_tokens for r in picture.requests])
    assert len(picture.requests) == pytest.approx(20 * 30 + 4, abs=2)  # arrivals = finished + change in flight
    assert picture.backlog == 4
    # the four in flight at the switch finish among the documents: fcfs, they are the chat's last; each draw's
    # mean is the bucket's, near the exact one (a 4x bucket: 300 draws' mean within 3 standard errors, 7%)
    early, late = inputs[times < 270], inputs[times > 310]
    assert early.mean() == pytest.approx(600, rel=0.07) and late.mean() == pytest.approx(40000, rel=0.07)
    assert all(r.max_new_tokens == UNSET_MAX_NEW_TOKENS for r in picture.requests)


def test_a_queued_burst_gets_its_lengths_where_it_came_not_where_it_finished():
    """Chat at 10 a bin; in bin 5, 40 documents come behind 10 chat and finish, queued, over bins 6 and 7, 20 a
    bin, while the chat that came meanwhile waits behind them. Each arrival's lengths are those of the interval it
    finished in, fcfs: the documents are replayed in bin 5, not in the chat of bins 6 and 7."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=1000))
    traffic.observe_interval(0.0, 30.0, finished=0, in_system=0)
    in_system = 0
    for index in range(12):
        arrivals = 50 if index == 5 else 10
        finishes = {6: (0, 20), 7: (0, 20), 8: (20, 0), 9: (20, 0)}.get(index, (10, 0))
        finished = sum(finishes)
        in_system += arrivals - finished
        chat, docs = finishes
        traffic.observe_interval(30.0 * (index + 1), 30.0, finished=finished, in_system=in_system,
                                 prompt_bounds=PROMPT_BOUNDS, prompt_counts=[chat, 0, 0, docs, 0],
                                 prompt_sum=chat * 600 + docs * 40000, generation_bounds=OUTPUT_BOUNDS,
                                 generation_counts=[0, finished, 0, 0], generation_sum=finished * 300)
    picture = traffic.picture(seed=3)
    assert picture is not None
    times = np.array([r.time for r in picture.requests])
    inputs = np.array([r.input_tokens for r in picture.requests])
    burst = (times >= 150) & (times < 180)
    after = (times >= 180) & (times < 240)
    assert burst.sum() == 50 and after.sum() == 20
    assert np.sum(inputs[burst] > 16000) == 40  # every document where it came
    assert inputs[after].max() <= 1000 and inputs[times < 150].max() <= 1000  # chat's bucket


def test_the_window_drops_old_bins():
    traffic = TrafficEstimator(TrafficSettings(window_seconds=100))
    traffic.observe_interval(0.0, 10.0, finished=0, in_system=0)
    for index in range(50):
        traffic.observe_interval(10.0 * (index + 1), 10.0, finished=5, in_system=0, prompt_bounds=PROMPT_BOUNDS,
                                 prompt_counts=[5, 0, 0, 0, 0], prompt_sum=2500, generation_bounds=OUTPUT_BOUNDS,
                                 generation_counts=[5, 0, 0, 0], generation_sum=300)
    picture = traffic.picture()
    assert picture is not None and picture.window_seconds == pytest.approx(100.0)
    assert len(picture.requests) == pytest.approx(50, abs=1)


def test_exact_requests_are_replayed_in_arrival_order_with_their_own_lengths():
    traffic = TrafficEstimator(TrafficSettings(window_seconds=100))
    # finish order differs from arrival order (a long request that arrived first finishes last)
    records = [ExactRequest(arrival=1000.0 + t, input_tokens=100 + t, output_tokens=10, max_new_tokens=None)
               for t in range(90, 0, -1)]
    records.append(ExactRequest(arrival=1000.0, input_tokens=50000, output_tokens=4000, max_new_tokens=8192))
    assert traffic.observe_requests(records) == 91
    picture = traffic.picture()
    assert picture is not None and picture.source == "request_log"
    assert [r.time for r in picture.requests] == sorted(r.time for r in picture.requests)
    assert picture.requests[0].time == 0.0 and picture.requests[0].input_tokens == 50000
    assert picture.requests[0].max_new_tokens == 8192
    assert picture.requests[1].max_new_tokens == UNSET_MAX_NEW_TOKENS


def test_checkpoint_round_trip_keeps_the_picture():
    traffic = TrafficEstimator()
    traffic.observe_interval(0.0, 30.0, finished=0, in_system=2)
    traffic.observe_interval(30.0, 30.0, finished=40, in_system=3, prompt_bounds=PROMPT_BOUNDS,
                             prompt_counts=[40, 0, 0, 0, 0], prompt_sum=20000, generation_bounds=OUTPUT_BOUNDS,
                             generation_counts=[0, 40, 0, 0], generation_sum=8000)
    restored = TrafficEstimator.from_dict(traffic.to_dict())
    assert restored.picture(seed=3) == traffic.picture(seed=3)


def test_a_busy_servers_picture_keeps_its_most_recent_requests():
    traffic = TrafficEstimator(TrafficSettings(window_seconds=1000, max_replay_requests=100))
    traffic.observe_requests([ExactRequest(arrival=float(t), input_tokens=100 + t, output_tokens=10)
                              for t in range(0, 1000, 2)])
    picture = traffic.picture()
    assert picture is not None and len(picture.requests) == 100
    assert picture.requests[0].time == 0.0 and picture.requests[0].input_tokens == 100 + 800
    assert picture.window_seconds == pytest.approx(198.0)


def test_exact_arrivals_are_replayed_only_where_every_one_has_finished():
    """A request that arrived late in the window may still be queued: the exact picture ends at the last finish
    less the 98th percentile latency, and starts at the first finish seen (earlier arrivals are only known if
    they finished late)."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=400, exact_coverage=0.5))
    records = [ExactRequest(arrival=float(t), input_tokens=100, output_tokens=10, finish=float(t) + 50.0)
               for t in range(0, 400)]
    records.append(ExactRequest(arrival=-500.0, input_tokens=100, output_tokens=10, finish=60.0))  # finished late
    traffic.observe_requests(records)
    picture = traffic.picture()
    assert picture is not None and picture.source == "request_log"
    # arrivals from 50 (the first finish) to 449 - 50 (the last finish less the 98th percentile latency, 50)
    assert len(picture.requests) == 350 and picture.requests[0].time == 0.0


def _session_records(sessions: int, turns: int, *, system_prompt: int = 0) -> list[ExactRequest]:
    """Interleaved conversations as a radix-cached server logs them: each turn resends the last turn's whole
    sequence plus 300 new tokens and matches that sequence less its last token, rounded down to a 16-token page;
    a first turn matches only the shared system prompt (if any)."""
    records = []
    for session in range(sessions):
        context, t = 0, float(session)
        for _turn in range(turns):
            input_tokens = max(context, system_prompt) + 300
            cached = (context - 1) // 16 * 16 if context else system_prompt
            records.append(ExactRequest(arrival=t, input_tokens=input_tokens, output_tokens=50 + 40 * session,
                                        finish=t + 5.0, cached_tokens=cached))
            context = input_tokens + 50 + 40 * session
            t += 10.0
    return sorted(records, key=lambda r: r.arrival)


def test_conversation_turns_become_the_prefix_groups_the_replay_caches():
    traffic = TrafficEstimator(TrafficSettings(window_seconds=100))
    traffic.observe_requests(_session_records(sessions=5, turns=8, system_prompt=1024))
    traffic.observe_requests([ExactRequest(arrival=-10.0, input_tokens=10, output_tokens=1, finish=0.0)])
    picture = traffic.picture()
    assert picture is not None and picture.source == "request_log"
    by_group: dict[str, list] = {}
    for spec in picture.requests:
        by_group.setdefault(spec.prefix_group, []).append(spec)
    turn_groups = {g: specs for g, specs in by_group.items() if g and g.startswith("turns-")}
    # every conversation is one group; its turns chain: each prefix is the previous turn's sequence less a token
    assert len(turn_groups) == 5
    for specs in turn_groups.values():
        assert all(s.extends_prefix for s in specs)
        for earlier, later in zip(specs, specs[1:], strict=False):
            assert later.prefix_tokens == earlier.input_tokens + earlier.output_tokens - 1
    # the first turns share the system prompt
    assert [len(v) for k, v in by_group.items() if k == "shared-1024"] == [5]


def test_turns_the_cache_missed_join_their_conversations():
    """On a hybrid model a tight state pool evicts cached prefixes, so many next turns match nothing: a third of
    these continued turns are logged with no cached tokens. Each still follows its conversation's previous turn
    by the new tokens and the gap the matched turns show, so it joins that conversation, prefix and all."""
    records = _session_records(sessions=6, turns=8, system_prompt=1024)
    continued = [k for k, r in enumerate(records) if r.cached_tokens != 1024]
    missed = set(continued[::3])
    traffic = TrafficEstimator(TrafficSettings(window_seconds=200))
    traffic.observe_requests([replace(r, cached_tokens=0) if k in missed else r for k, r in enumerate(records)])
    traffic.observe_requests([ExactRequest(arrival=-10.0, input_tokens=10, output_tokens=1, finish=0.0)])
    picture = traffic.picture()
    full = TrafficEstimator(TrafficSettings(window_seconds=200))
    full.observe_requests(records)
    full.observe_requests([ExactRequest(arrival=-10.0, input_tokens=10, output_tokens=1, finish=0.0)])
    assert picture is not None and len(missed) >= 10
    # the same conversations, with the same prefixes, as when every turn matched
    assert picture.requests == full.picture().requests
    first = min(r.arrival for r in records)
    by_arrival = {r.time + first: r for r in picture.requests}
    assert all(by_arrival[records[k].arrival].extends_prefix for k in missed if records[k].arrival in by_arrival)


def _slow_server_sessions(sessions: int, turns: int) -> tuple[list[ExactRequest], list[ExactRequest], set[float]]:
    """Conversations on a server behind its clients' schedule: every third turn (from the third) arrives 3 s before
    its previous turn finishes. The server then matches the turn before that one (a matched earlier turn), or, for
    every other such turn, nothing at all. (the records as logged, as they would be had the server kept up, and
    the arrivals of the turns that matched nothing)."""
    kept_up, logged, unmatched = [], [], set()
    for session in range(sessions):
        sequences: list[int] = []
        t = float(session)
        for turn in range(turns):
            input_tokens = (sequences[-1] if sequences else 1024) + 300
            output = 50 + 40 * session
            cached = (sequences[-1] - 1) // 16 * 16 if sequences else 0
            record = ExactRequest(arrival=t, input_tokens=input_tokens, output_tokens=output, finish=t + 5.0,
                                  cached_tokens=cached)
            kept_up.append(record)
            if turn >= 2 and turn % 3 == 2:
                # the previous turn (logged last) still runs when this one arrives
                logged[-1] = replace(logged[-1], finish=t + 3.0)
                if (session + turn) % 2:
                    record = replace(record, cached_tokens=0)
                    unmatched.add(t)
                else:
                    record = replace(record, cached_tokens=(sequences[-2] - 1) // 16 * 16)
            logged.append(record)
            sequences.append(input_tokens + output)
            t += 10.0
    return (sorted(logged, key=lambda r: r.arrival), sorted(kept_up, key=lambda r: r.arrival), unmatched)


def test_a_turn_sent_while_its_previous_one_still_ran_joins_its_conversation():
    """A timeline replayed to the server sends each turn on the clients' schedule: where the server runs behind,
    the next turn arrives while the previous one still runs, its sequence not yet cached, and matches an earlier
    turn or nothing. Where the window shows turns matched while theirs ran, a turn that matched nothing still
    follows its previous one by the new tokens and the time since its arrival those turns show, so it joins that
    conversation, prefix and all, as when the server kept up."""
    logged, kept_up, unmatched = _slow_server_sessions(sessions=12, turns=9)
    assert len(unmatched) >= 8

    def picture_of(records: list[ExactRequest]) -> dict[float, RequestSpec]:
        traffic = TrafficEstimator(TrafficSettings(window_seconds=200))
        traffic.observe_requests(records)
        traffic.observe_requests([ExactRequest(arrival=-10.0, input_tokens=10, output_tokens=1, finish=0.0)])
        picture = traffic.picture()
        assert picture is not None
        first = min(r.arrival for r in records)
        return {r.time + first: r for r in picture.requests}

    linked, reference = picture_of(logged), picture_of(kept_up)
    shown = [t for t in unmatched if t in linked]
    assert len(shown) >= 6 and all(linked[t].extends_prefix and linked[t].prefix_tokens > 1024 for t in shown)
    # the reuse of a server that kept up: the same prefix tokens over the requests both pictures hold, within a
    # percent (sessions whose sequences lie 10-40 tokens apart can trade a turn), where without the links the turns
    # that matched nothing would hold none
    common = [t for t in linked if t in reference]
    assert len(common) > 50
    reused = sum(linked[t].prefix_tokens for t in common)
    assert abs(reused - sum(reference[t].prefix_tokens for t in common)) < 0.01 * reused
    assert sum(linked[t].prefix_tokens for t in shown) > 0.05 * reused


def test_a_request_that_took_no_time_is_the_previous_turn_of_one_request_at_most():
    """A request logged with no latency finished as it came: it is an earlier turn among the finished ones only, so
    of two later requests that both extend it, one joins it and the other does not."""
    from advisor.estimate.traffic import prefix_groups

    logged, _, _ = _slow_server_sessions(sessions=12, turns=9)
    instant = ExactRequest(arrival=300.0, input_tokens=50000, output_tokens=100, finish=300.0)
    later = [ExactRequest(arrival=302.0, input_tokens=50399, output_tokens=20, finish=303.0),
             ExactRequest(arrival=304.0, input_tokens=50400, output_tokens=21, finish=305.0)]
    records = sorted([*logged, instant, *later], key=lambda r: r.arrival)
    specs = prefix_groups(records, [RequestSpec(r.arrival, r.input_tokens, r.output_tokens, 4096) for r in records])
    joined = [s for r, s in zip(records, specs, strict=True) if r in later and s.prefix_tokens == 50099]
    assert len(joined) == 1


def test_a_server_that_keeps_up_links_no_turn_to_a_request_still_running():
    """Where no matched turn came while its previous one ran (clients that wait for each answer, a server that
    keeps up), a request that matched nothing is not linked to one still running at its arrival, even where its
    prompt is that request's sequence plus a turn's new tokens: it stays its own."""
    records = _session_records(sessions=6, turns=8)
    # each session's last turn, still running 2 s after it came, as a request whose prompt is its sequence plus a
    # turn's 300 new tokens arrives
    last = [max((r for r in records if r.output_tokens == 50 + 40 * session), key=lambda r: r.arrival)
            for session in range(6)]
    lone = [ExactRequest(arrival=r.arrival + 2.0, input_tokens=r.input_tokens + r.output_tokens + 299,
                         output_tokens=20, finish=r.arrival + 4.0) for r in last]
    lone_specs = _lone_specs_of(records, lone)
    assert len(lone_specs) >= 4 and all(r.prefix_group is None for r in lone_specs)


def test_a_turn_matching_an_earlier_turn_of_its_conversation_continues_its_latest():
    """The third turn arrives while the second still runs (its sequence not yet cached), so it matches the first
    turn's sequence, which the second already continued: it is still that conversation's next turn, after the
    second, not a shared prefix of its own."""
    from advisor.estimate.traffic import prefix_groups

    records = [ExactRequest(arrival=0.0, input_tokens=1000, output_tokens=100, finish=5.0),
               ExactRequest(arrival=10.0, input_tokens=1400, output_tokens=100, finish=30.0, cached_tokens=1088),
               ExactRequest(arrival=20.0, input_tokens=1800, output_tokens=50, finish=40.0, cached_tokens=1088)]
    specs = [RequestSpec(r.arrival, r.input_tokens, r.output_tokens, 4096) for r in records]
    first, second, third = prefix_groups(records, specs)
    assert first.prefix_group == second.prefix_group == third.prefix_group == "turns-0"
    assert (second.prefix_tokens, third.prefix_tokens) == (1099, 1499)
    assert all(r.extends_prefix for r in (first, second, third))


def test_a_match_of_an_earlier_turns_exact_sequence_beats_another_conversations_near_one():
    """The third turn of A arrives while A's second still runs, so it matches A's first turn's sequence exactly
    (1,099 tokens); B's first turn, not yet continued, ends 50 tokens above that, within the matching slack. The
    exact match is the one the cache made: the turn continues A, after its second turn, and B stays open."""
    from advisor.estimate.traffic import prefix_groups

    records = [ExactRequest(arrival=0.0, input_tokens=1000, output_tokens=100, finish=5.0),
               ExactRequest(arrival=1.0, input_tokens=1050, output_tokens=100, finish=8.0),
               ExactRequest(arrival=10.0, input_tokens=1400, output_tokens=100, finish=30.0, cached_tokens=1099),
               ExactRequest(arrival=20.0, input_tokens=1800, output_tokens=50, finish=40.0, cached_tokens=1099)]
    specs = [RequestSpec(r.arrival, r.input_tokens, r.output_tokens, 4096) for r in records]
    a_first, b_first, a_second, a_third = prefix_groups(records, specs)
    assert a_first.prefix_group == a_second.prefix_group == a_third.prefix_group == "turns-0"
    assert (a_second.prefix_tokens, a_third.prefix_tokens) == (1099, 1499)
    assert b_first.prefix_group is None


def test_without_a_conversation_pattern_unmatched_requests_stay_their_own():
    """Fewer than MISSED_TURNS_MIN_MATCHED matched turns: a request that matched nothing is not taken for a
    missed turn, even where its prompt is an earlier request's sequence plus a few hundred tokens."""
    from advisor.estimate.traffic import MISSED_TURNS_MIN_MATCHED

    records = _session_records(sessions=2, turns=8)  # 14 matched turns
    assert sum(1 for r in records if r.cached_tokens > 0) < MISSED_TURNS_MIN_MATCHED
    lone = [ExactRequest(arrival=records[k].finish + 2.0,
                         input_tokens=records[k].input_tokens + records[k].output_tokens + 300,
                         output_tokens=20, finish=records[k].finish + 3.0) for k in range(4)]
    lone_specs = _lone_specs_of(records, lone)
    assert len(lone_specs) == len(lone) and all(r.prefix_group is None for r in lone_specs)


def _lone_specs_of(records: list[ExactRequest], lone: list[ExactRequest]) -> list[RequestSpec]:
    """The request-log picture of `records` with `lone` (20-token outputs) among them: the lone requests' specs."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=200))
    traffic.observe_requests(sorted([*records, *lone], key=lambda r: r.arrival))
    traffic.observe_requests([ExactRequest(arrival=-10.0, input_tokens=10, output_tokens=1, finish=0.0)])
    picture = traffic.picture()
    assert picture is not None
    return [r for r in picture.requests if r.output_tokens == 20]


def test_records_without_cached_counts_replay_without_reuse():
    traffic = TrafficEstimator(TrafficSettings(window_seconds=100))
    traffic.observe_requests([replace(r, cached_tokens=0) for r in _session_records(sessions=3, turns=5)])
    picture = traffic.picture()
    assert picture is not None and all(r.prefix_group is None for r in picture.requests)
    restored = TrafficEstimator.from_dict(traffic.to_dict())
    assert restored.picture() == picture


def test_under_a_long_queue_enough_exact_requests_beat_the_histogram_bins():
    """A server with minutes of queue: the arrivals known completely cover a third of the window, but 1,200 real
    requests with their own paired lengths are a better picture than lengths drawn from bins."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=1800, exact_coverage=0.5, exact_min_requests=1000,
                                               exact_min_seconds=300))
    traffic.observe_interval(0.0, 30.0, finished=0, in_system=50)
    for index in range(60):
        traffic.observe_interval(30.0 * (index + 1), 30.0, finished=20, in_system=50, prompt_bounds=PROMPT_BOUNDS,
                                 prompt_counts=[20, 0, 0, 0, 0], prompt_sum=20 * 500, generation_bounds=OUTPUT_BOUNDS,
                                 generation_counts=[20, 0, 0, 0], generation_sum=20 * 100)
    # every request waits ~18 minutes: of the finishes seen over 30 minutes, only the arrivals from the first
    # finish to the last finish less that wait are known completely (700 s, 1,400 requests)
    queue = 1100.0
    records = [ExactRequest(arrival=t * 0.5 - queue, input_tokens=500 + t % 7, output_tokens=100, finish=t * 0.5)
               for t in range(0, 2 * 1800)]
    traffic.observe_requests(records)
    picture = traffic.picture()
    assert picture is not None and picture.source == "request_log"
    known = [r for r in picture.requests if r.time <= 700.0]
    assert len(known) >= 1000 and known[-1].time < 0.5 * 1800
    # past the cut, up to the last finish: the 50 the server holds (the scrapes' running + queued)
    assert len(picture.requests) - len(known) == 50 and picture.window_seconds == 1799.5
    # too few of them: the bins stay
    sparse = TrafficEstimator(TrafficSettings(window_seconds=1800, exact_min_requests=5000))
    sparse.bins, sparse.last_in_system = traffic.bins, traffic.last_in_system
    sparse.observe_requests(records)
    assert sparse.picture().source == "metrics"


def test_past_the_cut_the_requests_the_server_holds_join_the_request_log_picture():
    """Under a queue a request's latency is mostly its wait, and the cut where the log's arrivals are known
    completely lies minutes before the last finish. The newest traffic (documents now, after chat) is what the
    server holds: as many requests as the scrapes count running + queued join the picture past the cut, the
    running ones with the prompts the prefill lines last admitted, each with the output of the known request of
    the nearest prompt, the queued ones as copies of the latest known requests. Without a scrape's count there is
    no tail."""
    def estimator(scraped: bool) -> TrafficEstimator:
        traffic = TrafficEstimator(TrafficSettings(window_seconds=1800))
        # chat every second, each waiting 120 s; in the last minutes documents arrive, and none has finished yet
        records = [ExactRequest(arrival=float(t), input_tokens=800 + t % 5, output_tokens=200, max_new_tokens=2048,
                                finish=t + 120.0) for t in range(0, 1500)]
        records.append(ExactRequest(arrival=1450.0, input_tokens=20000, output_tokens=900, max_new_tokens=8192,
                                    finish=1470.0))  # one document that finished: its output pairs the held ones
        traffic.observe_requests(records)
        if scraped:
            traffic.observe_interval(1590.0, 15.0, finished=0, in_system=100, queued=None)
            traffic.observe_admissions([[1, 20000, 0]] * 40, chunk_tokens=None)  # the newest admitted: documents
            traffic.observe_interval(1620.0, 30.0, finished=15, in_system=100, queued=60)
        return traffic

    plain = estimator(scraped=False).picture()
    assert plain is not None and plain.source == "request_log"
    # from the first finish (an arrival before it is known only if it finished late) to the cut, 1,499 s
    assert plain.window_seconds == pytest.approx(1499.0 - 120.0) and len(plain.requests) == 1381
    picture = estimator(scraped=True).picture()
    assert picture is not None and picture.source == "request_log"
    assert picture.window_seconds == pytest.approx(1619.0 - 120.0)  # up to the last finish
    past = [r for r in picture.requests if r.time > plain.window_seconds]
    assert len(past) == 100  # the server's 100 (nothing that arrived past the cut has finished)
    running = [r for r in past if r.input_tokens == 20000]
    assert len(running) >= 40 and all(r.output_tokens == 900 and r.max_new_tokens == 8192 for r in running)
    # the queued ones are copies of the latest known requests (chat), spread evenly up to the last finish
    copies = [r for r in past if r.input_tokens in range(800, 805)]
    assert len(copies) >= 55 and all(r.output_tokens == 200 for r in copies)
    assert max(r.time for r in past) > picture.window_seconds - 10


def test_the_held_requests_run_long_and_continue_what_the_prefill_lines_matched():
    """A request still running at the last scrape is one of the long ones: its output is drawn from the known
    requests of near prompts in proportion to their outputs (half of them 100 tokens, half 900: the draws take
    both, and average near 820, not the plain mean of 500). And a running request the prefill lines show matching an earlier
    request's whole sequence continues that conversation in the replay."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=1800))
    records = [ExactRequest(arrival=float(t), input_tokens=1000, output_tokens=100 if t % 2 else 900,
                            max_new_tokens=2048, finish=t + 120.0) for t in range(0, 1500)]
    traffic.observe_requests(records)
    earlier = records[1400]
    sequence = earlier.input_tokens + earlier.output_tokens - 1
    traffic.observe_interval(1590.0, 15.0, finished=0, in_system=200, queued=None)
    traffic.observe_admissions([[1, 1000, 0]] * 40 + [[1, 300, sequence]], chunk_tokens=None)
    traffic.observe_interval(1620.0, 30.0, finished=15, in_system=200, queued=0)
    picture = traffic.picture()
    assert picture is not None and picture.source == "request_log"
    past = [r for r in picture.requests if r.time > 1499.0 - 120.0]
    assert len(past) == 200
    drawn = [r.output_tokens for r in past if r.input_tokens == 1000]
    assert set(drawn) == {100, 900} and 650 < np.mean(drawn) < 900
    continued = [r for r in past if r.input_tokens == sequence + 300]
    assert continued and all(r.extends_prefix and r.prefix_tokens == sequence for r in continued)


def test_the_held_requests_are_copied_from_requests_known_whole_not_from_the_quick_ones_past_the_cut():
    """What finished past the cut finished quickly, by selection: the held requests take their outputs from the
    requests before the cut, known whole (half of them 100 tokens, half 900), not from the 20-token answers that
    finished past it."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=1800))
    records = [ExactRequest(arrival=float(t), input_tokens=1000, output_tokens=100 if t % 2 else 900,
                            max_new_tokens=2048, finish=t + 120.0) for t in range(0, 1500)]
    quick = [ExactRequest(arrival=1500.0 + t, input_tokens=1000, output_tokens=20, max_new_tokens=2048,
                          finish=1501.0 + t) for t in range(0, 100)]
    traffic.observe_requests(records + quick)
    traffic.observe_interval(1590.0, 15.0, finished=0, in_system=60, queued=None)
    traffic.observe_admissions([[1, 1000, 0]] * 40, chunk_tokens=None)
    traffic.observe_interval(1620.0, 30.0, finished=15, in_system=60, queued=20)
    picture = traffic.picture()
    assert picture is not None and picture.source == "request_log"
    past = [r for r in picture.requests if r.time > 1499.0 - 120.0]  # past the cut (arrivals from the first finish)
    assert sum(r.output_tokens == 20 for r in past) == 100  # the quick ones, as they were
    held = [r for r in past if r.output_tokens != 20]
    assert len(held) == 60 and all(r.output_tokens in (100, 900) for r in held)
    assert np.mean([r.output_tokens for r in held]) > 500  # the 40 running drawn in proportion: the long of the two


def test_the_waiting_copies_take_the_size_the_prefill_lines_show_the_queue_holds():
    """Chat came back after documents: the latest requests known before the cut are documents (20,000 tokens) and
    chat (1,000) mixed, and the server holds 100 waiting. The last `Prefill batch` line shows them: #queue-req 100,
    #pending-token 100,500, a mean of 1,005 a request. The copies standing for them are then chat (their mean
    within a few percent of 1,005); without the line's queue, copies of the latest known, documents mostly."""

    def waiting(line_shows_queue):
        traffic = TrafficEstimator(TrafficSettings(window_seconds=1800))
        records = [ExactRequest(arrival=float(t), input_tokens=1000 if t % 10 < 3 else 20000, output_tokens=300,
                                max_new_tokens=4096, finish=t + 120.0) for t in range(0, 1500)]
        traffic.observe_requests(records)
        traffic.observe_interval(1590.0, 15.0, finished=0, in_system=100, queued=None)
        line = [1, 20000, 0, -1] + ([100, 100_500] if line_shows_queue else [])
        traffic.observe_admissions([line], chunk_tokens=None)
        traffic.observe_interval(1620.0, 30.0, finished=1, in_system=100, queued=100)
        picture = traffic.picture()
        assert picture is not None and picture.source == "request_log"
        return [r.input_tokens for r in picture.requests if r.time > 1499.0 - 120.0]

    sized = waiting(True)
    assert len(sized) == 100 and abs(np.mean(sized) / 1005 - 1) < 0.05
    copied = waiting(False)
    assert len(copied) == 100 and np.mean(copied) > 10_000
    # each rank's latest line is kept, and checkpointed
    lines = TrafficEstimator(TrafficSettings(window_seconds=1800))
    lines.observe_admissions([[1, 500, 0, -1, 7, 70_000], [1, 500, 0, -1, 100, 100_500]], chunk_tokens=None)
    restored = TrafficEstimator.from_dict(json.loads(json.dumps(lines.to_dict())))
    assert restored.waiting_by_rank == {-1: (100, 100_500)}


def test_a_held_request_the_prefill_lines_date_runs_longer_than_it_has_run():
    """The prefill lines show which prompts no finished request accounts for and when they were admitted: such a
    request admitted in the interval 1590-1620 s is 15 s old at the last scrape, and at the window's 10 tokens a
    second of stay has made more than 150 tokens, so it takes the output of the one known length that runs longer,
    200 (drawn in proportion to the outputs, undated, ten of them would all be 200 once in 28,000)."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=1800))
    outputs = (100, 120, 140, 200)
    records = [ExactRequest(arrival=float(t), input_tokens=1000 + t % 7, output_tokens=outputs[t % 4],
                            max_new_tokens=4096, finish=t + outputs[t % 4] / 10.0) for t in range(0, 1500)]
    traffic.observe_requests(records)
    traffic.observe_interval(1590.0, 15.0, finished=0, in_system=10, queued=None)
    # ten prompts no finished request has: still running; and forty the log has finished
    traffic.observe_admissions([[1, 5001 + k, 0] for k in range(10)] + [[1, 1000, 0]] * 40, chunk_tokens=None)
    traffic.observe_interval(1620.0, 30.0, finished=40, in_system=10, queued=0)
    picture = traffic.picture()
    assert picture is not None and picture.source == "request_log"
    held = [r for r in picture.requests if r.input_tokens > 5000]
    assert sorted(r.input_tokens for r in held) == [5001 + k for k in range(10)]  # the unfinished ones, each once
    assert all(r.output_tokens == 200 for r in held)


def test_admitted_prompts_follow_chunks_and_shared_batches():
    # a long prompt cut at an 8192 chunk (page 64: a cut lands within a page of it) twice; its last piece shares a
    # full batch with two new requests, the second of which is cut and finishes alone; then a short one
    batches = [[1, 8192, 0], [1, 8150, 0], [3, 8192, 0], [1, 8000, 0], [1, 500, 64]]
    prompts = admitted_prompts(batches, chunk_tokens=8192, page_size=64)
    assert [p[0] for p in prompts] == [8192 + 8150 + 2731, 2731, 2731 + 8000, 564]
    assert prompts[-1][:2] == (564, 64)  # cached tokens count in the prompt
    # without the chunk every line's requests are whole
    assert [p[0] for p in admitted_prompts(batches[:2], chunk_tokens=None)] == [8192, 8150]


def _new_server(lifetime_requests: float | None) -> TrafficEstimator:
    """40 intervals of 30 s: 20 finishes in each, 40 in flight; in the first 6 only short answers have had the
    time to finish, from then on 6 in 20 are long (4K tokens)."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=1200))
    traffic.baseline(0.0, 0.0, 0.0, lifetime_requests=lifetime_requests)
    for index in range(40):
        early = index < 6
        traffic.observe_interval(30.0 * (index + 1), 30.0, finished=20, in_system=40,
                                 prompt_bounds=PROMPT_BOUNDS, prompt_counts=[20, 0, 0, 0, 0], prompt_sum=20 * 600,
                                 generation_bounds=OUTPUT_BOUNDS,
                                 generation_counts=[20, 0, 0, 0] if early else [14, 0, 0, 6],
                                 generation_sum=20 * 100 if early else 14 * 100 + 6 * 4000)
    return traffic


def test_a_new_servers_first_finishes_do_not_set_the_output_lengths_of_its_first_arrivals():
    """A server that began serving as the window opened finishes only short answers at first (a long one has
    not had the time): its first arrivals draw their lengths from the intervals that could finish long ones.
    A server that had served long before keeps those of the intervals they finished in (40 in flight: two
    intervals on, still short for the first three intervals' arrivals)."""
    def early_outputs(traffic: TrafficEstimator) -> float:
        picture = traffic.picture(seed=2)
        assert picture is not None
        return float(np.mean([r.output_tokens for r in picture.requests if r.time < 90.0]))

    fresh = _new_server(lifetime_requests=0.0)
    assert fresh.served_at_baseline == (0.0, 0.0)
    assert early_outputs(fresh) == pytest.approx((14 * 100 + 6 * 4000) / 20, rel=0.3)
    assert early_outputs(_new_server(lifetime_requests=1e6)) == pytest.approx(100, rel=0.2)  # serving for hours
    assert early_outputs(_new_server(lifetime_requests=None)) == pytest.approx(100, rel=0.2)  # not known
    # the date survives a checkpoint
    assert TrafficEstimator.from_dict(fresh.to_dict()).served_at_baseline == (0.0, 0.0)


def test_a_new_servers_queue_delays_its_long_finishes_once_not_stretched_with_the_tail():
    """Under a queue of 200 (five minutes of arrivals) and 40 running, a long answer finishes after the wait
    plus its long run. The wait holds short and long requests alike, so the first finishes that can hold the
    long answers come ~8 minutes in, not after the whole stay (wait and run) stretched by the tail (~19
    minutes, which left only the window's last intervals, here a draw with fewer long answers, to set every
    earlier arrival's length)."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=1200))
    traffic.baseline(0.0, 0.0, 0.0, lifetime_requests=0.0)
    for index in range(40):
        long_answers = 0 if index < 6 else 6 if index < 30 else 2
        traffic.observe_interval(30.0 * (index + 1), 30.0, finished=20, in_system=240, queued=200,
                                 prompt_bounds=PROMPT_BOUNDS, prompt_counts=[20, 0, 0, 0, 0], prompt_sum=20 * 600,
                                 generation_bounds=OUTPUT_BOUNDS,
                                 generation_counts=[20 - long_answers, 0, 0, long_answers],
                                 generation_sum=(20 - long_answers) * 100 + long_answers * 4000)
    picture = traffic.picture(seed=2)
    assert picture is not None
    early = float(np.mean([r.output_tokens for r in picture.requests if r.time < 150.0]))
    # pooled from ~minute 8 on: 13 intervals with 6 long answers in 20, 10 with 2
    pooled = ((13 * 6 + 10 * 2) * 4000 + (23 * 20 - 13 * 6 - 10 * 2) * 100) / (23 * 20)
    assert early == pytest.approx(pooled, rel=0.2)
    assert early > 1.4 * (18 * 100 + 2 * 4000) / 20  # the last intervals' lighter draw alone


def _drawn_chat_and_documents(rng: np.random.Generator) -> np.ndarray:
    """Prompts drawn as a window's histogram would give them: 85% chat around 1K, 15% documents around 30K."""
    chat = rng.lognormal(np.log(1000), 0.5, 3500)
    docs = rng.lognormal(np.log(30000), 0.3, 600)
    return np.round(np.concatenate([chat, docs]))


def test_a_shared_batch_is_split_as_the_prompt_histogram_makes_likely():
    rng = np.random.default_rng(3)
    drawn = _drawn_chat_and_documents(rng)
    # three whole prompts of 32K tokens between them: a document and two chat turns, not three of 10.7K
    bigs = []
    for _ in range(50):
        piece, whole, cut = _split_batch(32000, None, 3, False, drawn, rng)
        assert piece is None and cut is None and sum(whole) == 32000
        bigs.append(sorted(whole))
    assert np.median([w[-1] for w in bigs]) > 24000 and np.median([w[0] for w in bigs]) < 3000
    # evenly without the histogram
    assert _split_batch(32000, None, 3, False, None, None) == (None, [10667] * 3, None)
    # a document's last piece after 24576 tokens, two chat turns, and a prompt the 8192 chunk cuts: the pieces take
    # what the whole prompts leave, the continued one as a document's length above what it had
    pieces = [_split_batch(8192, 24576, 2, True, drawn, rng) for _ in range(50)]
    for piece, whole, cut in pieces:
        assert piece is not None and cut is not None and piece >= 1 and cut >= 1
        assert piece + sum(whole) + cut == 8192
    assert np.median([p[0] for p in pieces]) > 2000  # a document of 30K had ~5K left, not a third of the batch
    # nothing in the histogram is longer than what the continued prompt had: evenly
    assert _split_batch(9000, 10**7, 2, False, drawn, rng) == (3000, [3000, 3000], None)


def test_admitted_prompts_rebuild_the_scheduler_models_own_arrivals():
    """The scheduler model logs a line per prefill batch as SGLang does; read back in fcfs order they give the
    arrivals' prompts (bursty traffic, long documents cut into chunks)."""
    from advisor.scheduler.engine import Simulator
    from advisor.scheduler.types import PrefillBatch
    from advisor.sim.config import load_server_config
    from advisor.sim.workload import load_workload

    server = load_server_config("default").with_ratio(0.9)
    workload = load_workload("bursty-mixed")
    arrivals = workload.requests(7, 600)
    events = Simulator(server, workload, arrivals=arrivals).advance(600)
    batches = [[e.new_seqs, e.new_tokens, e.cached_tokens] for e in events if isinstance(e, PrefillBatch)]
    prompts = [p.tokens for p in admitted_prompts(batches, server.chunked_prefill_size, server.serving.page_size)]
    admitted = [r.input_tokens for r in arrivals[:len(prompts)]]
    assert len(prompts) >= 0.95 * len(arrivals)
    assert np.mean(prompts) == pytest.approx(np.mean(admitted), rel=0.02)
    assert np.corrcoef(prompts, admitted)[0, 1] > 0.95
    assert max(prompts) > 2 * server.chunked_prefill_size  # documents longer than a chunk come back whole


def test_prefill_lines_put_a_burst_of_long_prompts_when_it_came():
    """Finished-request histograms place a document when it ends; the prefill lines place it when it was admitted
    (fcfs: in arrival order), so the replay sees the burst's KV demand at the burst."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=600))
    traffic.observe_interval(0.0, 30.0, finished=0, in_system=0, queued=0)
    for index in range(20):
        burst = index == 5
        # 10 arrivals per bin; the burst's 10 documents (30,000 tokens) all finish in the last bins
        traffic.observe_admissions([[1, 30000 if burst else 500, 0]] * 10, chunk_tokens=None)
        late = index >= 17
        prompt_counts = [10 - (4 if late else 0), 0, 0, 4 if late else 0, 0]
        traffic.observe_interval(30.0 * (index + 1), 30.0, finished=10, in_system=0, queued=0,
                                 prompt_bounds=PROMPT_BOUNDS, prompt_counts=prompt_counts,
                                 prompt_sum=sum(prompt_counts[:1]) * 500 + prompt_counts[3] * 30000,
                                 generation_bounds=OUTPUT_BOUNDS, generation_counts=[10, 0, 0, 0], generation_sum=1000)
    picture = traffic.picture(seed=2)
    assert picture is not None and picture.source == "metrics"
    times = np.array([r.time for r in picture.requests])
    inputs = np.array([r.input_tokens for r in picture.requests])
    in_burst = (times >= 150) & (times < 180)
    assert inputs[in_burst].mean() == pytest.approx(30000, rel=0.05)
    assert inputs[~in_burst].max() < 1000
    restored = TrafficEstimator.from_dict(traffic.to_dict())
    assert restored.picture(seed=2) == picture


def test_prompts_that_stay_longer_get_the_longer_outputs():
    """Documents admitted with the chat but finishing three intervals later decode for longer: the picture gives
    them the longer outputs of the histograms (a document's KV is held while it decodes), the chat the shorter."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=900))
    traffic.observe_interval(0.0, 15.0, finished=0, in_system=0, queued=0)
    in_flight = 0
    for index in range(40):
        traffic.observe_admissions([[1, 600, 0]] * 8 + [[1, 30000, 0]] * 2, chunk_tokens=None)
        docs_done = 2 if index >= 3 else 0
        in_flight += 2 - docs_done
        # chat finishes in its own interval with 100-token outputs, documents three later with 1000-token ones
        traffic.observe_interval(15.0 * (index + 1), 15.0, finished=8 + docs_done, in_system=in_flight, queued=0,
                                 prompt_bounds=PROMPT_BOUNDS, prompt_counts=[8, 0, 0, docs_done, 0],
                                 prompt_sum=8 * 600 + docs_done * 30000, generation_bounds=OUTPUT_BOUNDS,
                                 generation_counts=[8, 0, docs_done, 0], generation_sum=8 * 100 + docs_done * 1000)
    picture = traffic.picture(seed=4)
    assert picture is not None
    docs = [r.output_tokens for r in picture.requests if r.input_tokens > 10000]
    chat = [r.output_tokens for r in picture.requests if r.input_tokens <= 10000]
    assert len(docs) >= 60 and len(chat) >= 250
    assert np.mean(docs) > 3 * np.mean(chat)
    everything = [r.output_tokens for r in picture.requests]
    assert np.mean(everything) == pytest.approx((8 * 100 + 2 * 1000) / 10, rel=0.25)  # the histograms' mean


def test_live_context_is_the_step_weighted_batch_length():
    # a 100-token prompt decoding 2 tokens holds lengths 100, 101; a 1000-token one decoding 4 holds 1000..1003
    requests = [RequestSpec(0.0, 100, 2, 16), RequestSpec(0.0, 1000, 4, 16)]
    assert live_context(requests) == pytest.approx((2 * (100 + 1) + 4 * (1000 + 2)) / 6)
    assert live_context([]) is None


def _mixed(rng, n, docs_talk_longer):
    """Chat (300-900-token prompts) and documents (30,000, one in five): the long outputs (800-1200 tokens) are the
    documents', or, the other way round, the chat's (three turns in four) while documents answer shortly."""
    out = []
    for index in range(n):
        doc = index % 5 == 0
        long_output = doc if docs_talk_longer else (not doc and index % 4 != 0)
        out.append(RequestSpec(float(index), 30000 if doc else int(rng.integers(300, 900)),
                               int(rng.integers(800, 1200)) if long_output else int(rng.integers(50, 150)),
                               UNSET_MAX_NEW_TOKENS))
    return out


@pytest.mark.parametrize("docs_talk_longer", [True, False])
def test_outputs_are_dealt_to_the_prompts_that_make_the_shown_batch_length(docs_talk_longer):
    rng = np.random.default_rng(3)
    truth = _mixed(rng, 500, docs_talk_longer)
    outputs = rng.permutation([r.output_tokens for r in truth])  # what the histograms give: no pairing
    drawn = [replace(r, output_tokens=int(o)) for r, o in zip(truth, outputs, strict=True)]
    target = live_context(truth)
    dealt = paired_to_live_context(drawn, target, np.random.default_rng(0))
    assert sorted(r.output_tokens for r in dealt) == sorted(outputs)  # the histograms' distribution, exactly
    assert [r.input_tokens for r in dealt] == [r.input_tokens for r in truth]
    assert live_context(dealt) == pytest.approx(target, rel=0.1)
    assert abs(live_context(drawn) - target) > 0.2 * target  # the drawn pairing was far off
    docs = np.mean([r.output_tokens for r in dealt if r.input_tokens == 30000])
    chat = np.mean([r.output_tokens for r in dealt if r.input_tokens < 30000])
    assert (docs > 2 * chat) if docs_talk_longer else (chat > 2 * docs)


def test_outputs_a_continuation_fixed_are_kept_and_counted():
    """Turns whose output their next turn's matched prefix fixed keep it; the rest are dealt so that the whole
    batch, kept turns included, meets the shown length. Here the free turns' drawn pairing alone makes it, so
    only the kept chat turns' pull (long outputs on short prompts) moves the others': the documents take the
    long outputs to make up for it."""
    rng = np.random.default_rng(4)
    truth = _mixed(rng, 400, docs_talk_longer=True)
    outputs = rng.permutation([r.output_tokens for r in truth])
    drawn = [replace(r, output_tokens=int(o)) for r, o in zip(truth, outputs, strict=True)]
    keep = {k for k in range(400) if k % 5 != 0 and k % 3 == 0}  # chat turns
    free = [r for k, r in enumerate(drawn) if k not in keep]
    target = live_context(free)
    assert paired_to_live_context(free, target, np.random.default_rng(0)) == free  # alone: nothing to change
    fixed = [replace(r, output_tokens=1000) if k in keep else r for k, r in enumerate(drawn)]
    assert live_context(fixed) < 0.6 * target
    dealt = paired_to_live_context(fixed, target, np.random.default_rng(0), keep=keep)
    assert all(dealt[k].output_tokens == 1000 for k in keep)
    assert sorted(r.output_tokens for k, r in enumerate(dealt) if k not in keep) == sorted(
        r.output_tokens for r in free)
    assert live_context(dealt) == pytest.approx(target, rel=0.1)


def test_a_batch_length_the_drawn_pairing_comes_within_a_tenth_of_keeps_it():
    """The shown length is a time-sampled gauge, the picture's step-weighted: within a tenth the drawn pairing
    stands, and beyond it the pairing moves only as far as the band's edge."""
    rng = np.random.default_rng(5)
    drawn = [RequestSpec(float(k), int(rng.integers(100, 20000)), int(rng.integers(10, 2000)), UNSET_MAX_NEW_TOKENS)
             for k in range(300)]
    length = live_context(drawn)
    assert paired_to_live_context(drawn, length, rng) == drawn
    assert paired_to_live_context(drawn, 1.08 * length, rng) == drawn
    assert paired_to_live_context(drawn, 0.93 * length, rng) == drawn
    moved = live_context(paired_to_live_context(drawn, 1.3 * length, rng))
    assert 0.9 * 1.3 * length <= moved < 0.95 * 1.3 * length


def _chat_and_documents(scrapes, batch_length):
    """Chat and documents that finish in the interval they came (their stays say nothing), scraped `scrapes`
    times, each scrape showing a running batch of mean length `batch_length` (None: the gauge not shown)."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=900))
    traffic.observe_interval(0.0, 15.0, finished=0, in_system=0, queued=0)
    for index in range(scrapes):
        traffic.observe_admissions([[1, 600, 0]] * 8 + [[1, 30000, 0]] * 2, chunk_tokens=None)
        traffic.observe_interval(15.0 * (index + 1), 15.0, finished=10, in_system=0, queued=0,
                                 prompt_bounds=PROMPT_BOUNDS, prompt_counts=[8, 0, 0, 2, 0],
                                 prompt_sum=8 * 600 + 2 * 30000, generation_bounds=OUTPUT_BOUNDS,
                                 generation_counts=[8, 0, 2, 0], generation_sum=8 * 100 + 2 * 1000,
                                 live_seq_tokens=None if batch_length is None else batch_length * 6, live_running=6)
    return traffic


def test_the_scrapes_running_batch_length_pairs_the_pictures_outputs():
    """The running batch's mean length (decode_sum_seq_lens / num_running_reqs) says the documents hold long
    sequences: they get the long outputs. Checkpointed bins keep what the scrapes showed."""
    truth = [RequestSpec(0.0, 600, 100, 16)] * 8 + [RequestSpec(0.0, 30000, 1000, 16)] * 2
    batch_length = live_context(truth)
    traffic = _chat_and_documents(40, batch_length)
    picture = traffic.picture(seed=4)
    assert picture is not None
    docs = [r.output_tokens for r in picture.requests if r.input_tokens > 10000]
    chat = [r.output_tokens for r in picture.requests if r.input_tokens <= 10000]
    assert np.mean(docs) > 3 * np.mean(chat)
    assert live_context(picture.requests) == pytest.approx(batch_length, rel=0.1)
    restored = TrafficEstimator.from_dict(traffic.to_dict())
    assert restored.picture(seed=4) == picture
    assert _chat_and_documents(40, None).picture(seed=4) != picture  # without the gauge: paired as drawn


QUEUE_BOUNDS = (0.5, 5.0, 10.0, 30.0, float("inf"))


def test_the_windows_queue_time_histogram_says_what_share_waited_beyond_a_bound():
    """Each scrape's queue-time histogram delta joins its bin; the picture carries the window's, summed over the
    bins of its layout, and the share beyond a bound is read off it (linear inside the bucket that holds the bound).
    Checkpointed bins keep it; scrapes that showed none give none."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=900))
    traffic.observe_interval(0.0, 15.0, finished=0, in_system=0, queued=0)
    for index in range(20):
        waits = [6, 2, 1, 1, 0] if index % 2 else [8, 2, 0, 0, 0]  # every other interval, two waited past 10 s
        traffic.observe_interval(15.0 * (index + 1), 15.0, finished=10, in_system=0, queued=0,
                                 prompt_bounds=PROMPT_BOUNDS, prompt_counts=[10, 0, 0, 0, 0], prompt_sum=6000,
                                 generation_bounds=OUTPUT_BOUNDS, generation_counts=[10, 0, 0, 0],
                                 generation_sum=1000, queue_bounds=QUEUE_BOUNDS, queue_counts=waits)
    picture = traffic.picture(seed=1)
    assert picture is not None and picture.live_queue_times is not None
    bounds, counts = picture.live_queue_times
    assert bounds == QUEUE_BOUNDS and counts == (140.0, 40.0, 10.0, 10.0, 0.0)
    assert queue_share_over(bounds, counts, 10.0) == pytest.approx(0.05)
    # and each interval's count, the server's admissions through the window, from its start
    assert picture.live_queue_series == tuple(
        (15.0 * i, 15.0 * (i + 1), (6.0, 2.0, 1.0, 1.0, 0.0) if i % 2 else (8.0, 2.0, 0.0, 0.0, 0.0)) for i in range(20))
    assert queue_share_over(bounds, counts, 7.5) == pytest.approx(0.075)  # half the (5, 10] bucket
    assert queue_share_over(bounds, counts, 0.0) == pytest.approx(1.0)
    assert queue_share_over(bounds, (0.0,) * 5, 10.0) is None
    assert queue_share_over((1.0, float("inf")), (5.0, 5.0), 60.0) == pytest.approx(0.5)  # beyond the last edge
    assert TrafficEstimator.from_dict(traffic.to_dict()).picture(seed=1) == picture
    assert _chat_and_documents(40, None).picture(seed=4).live_queue_times is None
    assert _chat_and_documents(40, None).picture(seed=4).live_queue_series is None


def test_a_handful_of_scrapes_of_the_running_batch_leaves_the_pairing_as_drawn():
    truth = [RequestSpec(0.0, 600, 100, 16)] * 8 + [RequestSpec(0.0, 30000, 1000, 16)] * 2
    few = MIN_LIVE_SAMPLES - 1
    assert _chat_and_documents(few, live_context(truth)).picture(seed=4) == _chat_and_documents(few, None).picture(seed=4)


def test_prefix_hits_without_request_logs_become_conversations():
    """Two sessions' turns interleaved; each later turn's matched prefix is its previous turn whole. From prompts
    and hits alone the picture chains the turns, gives each previous turn the output that closes the gap, and
    leaves a hit on a short system prompt a shared prefix."""
    from advisor.estimate.traffic import conversations_from_hits
    from advisor.scheduler.types import RequestSpec

    turns = [  # (time, prompt, matched prefix)
        (0.0, 1000, 0), (1.0, 5000, 0), (10.0, 1500, 1200), (12.0, 5600, 5300), (20.0, 2000, 1800),
        (21.0, 700, 64),
    ]
    requests = [RequestSpec(t, p, 100, UNSET_MAX_NEW_TOKENS) for t, p, _ in turns]
    out = conversations_from_hits(requests, [c for _, _, c in turns])
    assert [r.output_tokens for r in out[:4]] == [201, 301, 301, 100]  # 1000 + 201 - 1 = 1200, ...
    assert out[0].prefix_group == out[2].prefix_group == out[4].prefix_group is not None
    assert out[1].prefix_group == out[3].prefix_group != out[0].prefix_group
    assert out[2].extends_prefix and out[2].prefix_tokens == 1200 and out[4].prefix_tokens == 1800
    assert out[5].prefix_group == "shared-64" and not out[5].extends_prefix
    assert conversations_from_hits(requests, [0] * len(requests)) == requests


def test_a_turn_continues_a_recent_conversation_not_the_last_turn_of_one_long_over():
    """An ended session's last turn lingers with a prompt just below a live session's next match; the live
    session's previous turn, a likely output length below the match and seconds old, is the one continued."""
    from advisor.estimate.traffic import conversations_from_hits

    turns = [  # (time, prompt, matched prefix, drawn output)
        (0.0, 7150, 0, 200),  # a session's last turn, never continued: nearer below the match
        (290.0, 7000, 0, 200),  # the live session's turn ...
        (295.0, 7700, 7201, 200),  # ... continued by this one (its output was 202 tokens)
    ] + [(300.0 + k, 300 + 10 * k, 0, 150 + 20 * k) for k in range(10)]  # other traffic: the outputs' spread
    requests = [RequestSpec(t, p, o, UNSET_MAX_NEW_TOKENS) for t, p, _, o in turns]
    out = conversations_from_hits(requests, [c for _, _, c, _ in turns])
    assert out[1].output_tokens == 202 and out[0].output_tokens == 200
    assert out[1].prefix_group == out[2].prefix_group is not None and out[0].prefix_group is None


def test_each_dp_rank_continues_its_own_chunks():
    """Two DP workers print their prefill lines interleaved: rank 0 cuts a 20,000-token prompt at the chunk
    while rank 1 admits short ones in between; the cut prompt continues on rank 0 only."""
    batches = [[1, 8192, 0, 0], [1, 300, 0, 1], [1, 8192, 0, 0], [2, 900, 0, 1], [1, 3616, 0, 0]]
    prompts = admitted_prompts(batches, chunk_tokens=8192)
    assert sorted(p.tokens for p in prompts) == [300, 450, 450, 20000]
    # without ranks the short lines would have been read as the long prompt's next chunks
    assert 20000 not in [p.tokens for p in admitted_prompts([b[:3] for b in batches], chunk_tokens=8192)]


def test_a_few_long_prompts_are_paired_to_the_shown_length_between_two_steps_of_the_grid():
    """Three documents in a hundred carry half the batch length: a small move of the pairing hands them long
    outputs at once, and a coarse grid of pairings jumps over the shown length. Between the two that bracket
    it, the pairing is bisected to within the tolerance."""
    rng = np.random.default_rng(6)
    drawn = [RequestSpec(float(k), 40000 if k % 33 == 0 else int(rng.integers(300, 1500)),
                         max(1, int(rng.lognormal(np.log(300), 0.8))), UNSET_MAX_NEW_TOKENS) for k in range(3000)]
    length = live_context(drawn)
    for factor in (1.12, 1.3, 0.85):
        dealt = paired_to_live_context(drawn, factor * length, np.random.default_rng(0), tolerance=0.01)
        assert live_context(dealt) == pytest.approx(factor * length, rel=0.0101)
        assert sorted(r.output_tokens for r in dealt) == sorted(r.output_tokens for r in drawn)


@pytest.mark.parametrize("waiting_shown", [None, 600, 30000])
def test_what_waits_at_the_windows_end_gets_prompts_like_the_windows_admitted_ones(waiting_shown):
    """A burst of documents finishes in the last intervals while chat queues behind it: the chat still waiting
    at the end was never admitted, so its prompts are drawn from the window's admitted prompts, not from the
    last intervals' finished ones (the documents'). Where the last `Prefill batch` line shows the queue's mean
    prompt (#pending-token over #queue-req), the draws take that mean: chat's 600 keeps the documents out, and a
    queue of 30,000-token documents is drawn as documents, not as the window's mostly chat."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=900))
    traffic.observe_interval(0.0, 15.0, finished=0, in_system=0, queued=0)
    for index in range(40):
        late = index >= 37
        burst = index == 36
        admitted = [[1, 30000, 0]] * 10 if burst else ([] if late else [[1, 600, 0]] * 10)
        if index == 35 and waiting_shown is not None:  # a line shows 30 waiting: whichever came last counts
            admitted = [*admitted[:-1], [1, 600, 0, -1, 30, 30 * waiting_shown]]
        traffic.observe_admissions(admitted, chunk_tokens=None)
        # the last three intervals: the ten documents finish (a few an interval), ten chat requests arrive in
        # each and wait
        waiting = 10 * (index - 36) if late else 0
        finished = 4 if late else (0 if burst else 10)
        prompt_counts = [0, 0, 0, 4, 0] if late else [finished, 0, 0, 0, 0]
        traffic.observe_interval(15.0 * (index + 1), 15.0, finished=finished,
                                 in_system=waiting + (10 - 4 * (index - 36) if late else (10 if burst else 0)),
                                 queued=waiting, prompt_bounds=PROMPT_BOUNDS, prompt_counts=prompt_counts,
                                 prompt_sum=sum(prompt_counts[:1]) * 600 + prompt_counts[3] * 30000,
                                 generation_bounds=OUTPUT_BOUNDS, generation_counts=[max(finished, 1), 0, 0, 0],
                                 generation_sum=100 * max(finished, 1))
    picture = traffic.picture(seed=3)
    assert picture is not None
    tail = [r.input_tokens for r in picture.requests if r.time >= 15.0 * 37]
    assert len(tail) >= 25
    documents = sum(tokens > 10000 for tokens in tail)
    if waiting_shown is None:
        # one admitted prompt in 37 was a document: a few may be drawn, not the finished intervals' all-document mix
        assert documents <= 0.2 * len(tail)
    elif waiting_shown == 600:
        assert documents == 0
    else:
        assert documents >= 0.9 * len(tail)


def _chat_with_a_few_documents(rng, chat_count, document_count):
    """Chat (log-normal prompts around 900 tokens, outputs around 300 drawn apart from them) and a burst's
    documents (about 40,000-token prompts, outputs around 900): each kind's outputs spread on their own."""
    chat = [RequestSpec(0.0, int(rng.lognormal(np.log(900), 0.9)) + 1, int(rng.lognormal(np.log(300), 0.8)) + 1,
                        UNSET_MAX_NEW_TOKENS) for _ in range(chat_count)]
    documents = [RequestSpec(0.0, int(rng.lognormal(np.log(40000), 0.3)), int(rng.lognormal(np.log(900), 0.5)) + 1,
                             UNSET_MAX_NEW_TOKENS) for _ in range(document_count)]
    return chat + documents


def test_the_pairing_axis_is_the_prompts_z_score_unless_they_are_two_kinds():
    rng = np.random.default_rng(11)
    one_kind = np.log(rng.lognormal(np.log(900), 0.9, 3000))
    assert np.allclose(pairing_axis(one_kind), (one_kind - one_kind.mean()) / one_kind.std())
    two_kinds = np.log([r.input_tokens for r in _chat_with_a_few_documents(rng, 3000, 60)])
    axis = pairing_axis(two_kinds)
    chat_axis, document_axis = axis[:3000], axis[3000:]
    # each kind sits at its kind's mean: no order inside a kind (but for the few longest chats, which might be
    # documents), the documents well above the chat
    assert np.percentile(chat_axis, 99) - chat_axis.min() < 0.05
    assert np.percentile(document_axis, 5) > 3.0
    assert np.ptp(pairing_axis(two_kinds[:40])) == pytest.approx(np.ptp((two_kinds[:40] - two_kinds[:40].mean())
                                                                         / two_kinds[:40].std()))  # too few to say


def test_a_mixtures_outputs_follow_the_kind_of_request_not_each_prompts_length():
    """The histograms give chat and documents' outputs unpaired; the shown batch length asks for the documents'
    long answers. The documents get them as a group, each kind's answers keep their own spread, and inside the
    chat a longer prompt gets no longer answer (a linear pairing would hand the longest chats the longer ones
    and every document the very longest)."""
    rng = np.random.default_rng(12)
    truth = _chat_with_a_few_documents(rng, 3000, 60)
    outputs = rng.permutation([r.output_tokens for r in truth])
    drawn = [replace(r, output_tokens=int(o)) for r, o in zip(truth, outputs, strict=True)]
    target = live_context(truth)
    dealt = paired_to_live_context(drawn, target, np.random.default_rng(0), tolerance=0.02)
    assert live_context(dealt) == pytest.approx(target, rel=0.021)
    chat, documents = dealt[:3000], dealt[3000:]
    chat_prompts = np.argsort(np.argsort([r.input_tokens for r in chat]))
    chat_outputs = np.argsort(np.argsort([r.output_tokens for r in chat]))
    assert abs(np.corrcoef(chat_prompts, chat_outputs)[0, 1]) < 0.1
    document_outputs = np.asarray([r.output_tokens for r in documents])
    assert np.mean(document_outputs) > 2 * np.mean([r.output_tokens for r in chat])
    # spread like the documents' own answers, not the handful of longest outputs of all
    assert np.percentile(document_outputs, 10) < 0.6 * np.percentile(document_outputs, 90)


def _document_interval(traffic, now, seconds, in_system, finished):
    traffic.observe_interval(now, seconds, finished=finished, in_system=in_system, prompt_bounds=PROMPT_BOUNDS,
                             prompt_counts=[0, 0, 0, finished, 0], prompt_sum=finished * 60000,
                             generation_bounds=OUTPUT_BOUNDS, generation_counts=[0, 0, finished, 0],
                             generation_sum=finished * 1000)


def test_arrivals_of_intervals_seen_before_the_first_finish_spread_over_them():
    """Long documents: nothing finishes for the first minute, so those scrapes have no histogram to read and
    make no bin. The first bin then counts every arrival since the baseline; they came over the whole minute,
    not in its last interval (a burst the replay would queue behind)."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=900))
    traffic.observe_interval(15.0, 15.0, finished=0, in_system=9)  # the baseline
    _document_interval(traffic, 75.0, 15.0, in_system=49, finished=1)  # 30, 45 and 60 made no bin
    for index in range(40):
        _document_interval(traffic, 90.0 + 15.0 * index, 15.0, in_system=49, finished=9)
    assert traffic.bins[0].start == 15.0 and traffic.bins[0].arrivals == 41.0
    picture = traffic.picture(seed=2)
    assert picture is not None and picture.backlog == 9
    first_minute = [r for r in picture.requests if r.time < 60.0]
    assert len(first_minute) == pytest.approx(9 + 41, abs=1)
    assert len([r for r in first_minute if r.time >= 45.0]) < 9 + 41 / 4 + 8  # not crammed into the last 15 s


def test_an_unobserved_stretch_longer_than_the_window_starts_a_new_baseline():
    traffic = TrafficEstimator(TrafficSettings(window_seconds=600))
    traffic.observe_interval(0.0, 15.0, finished=0, in_system=3)
    _document_interval(traffic, 2000.0, 15.0, in_system=40, finished=2)
    assert not traffic.bins  # 37 more in flight since an hour ago says nothing of when they came
    _document_interval(traffic, 2015.0, 15.0, in_system=41, finished=2)
    assert [(b.start, b.arrivals) for b in traffic.bins] == [(2000.0, 3.0)]


def _picture_with_a_conversation():
    requests = [RequestSpec(0.0, 500, 50, 100), RequestSpec(100.0, 800, 60, 100, "s1", 500, True),
                RequestSpec(250.0, 900, 70, 100, "s1", 800, True), RequestSpec(280.0, 300, 30, 100)]
    return TrafficPicture(requests, 300.0, "request_log", backlog=2, live_context=1000.0, fixed_outputs=(1, 2))


def test_the_picture_since_a_time_keeps_what_came_after_it_from_there():
    since = picture_since(_picture_with_a_conversation(), 200.0)
    assert [r.time for r in since.requests] == [50.0, 80.0]
    assert since.window_seconds == 100.0 and since.backlog == 0
    assert since.fixed_outputs == (0,)  # the third request's fixed output, renumbered
    assert since.live_context == 1000.0  # the caller decides what the shown batch still says


def test_a_tiled_picture_repeats_its_traffic_to_the_length_asked_with_conversations_of_its_own():
    picture = _picture_with_a_conversation()
    long = tiled(picture, 750.0)
    assert long.window_seconds == 750.0
    assert [r.time for r in long.requests] == [0.0, 100.0, 250.0, 280.0, 300.0, 400.0, 550.0, 580.0, 600.0, 700.0]
    assert [r.prefix_group for r in long.requests[:8]] == [None, "s1", "s1", None, None, "s1#1", "s1#1", None]
    assert long.requests[9].prefix_group == "s1#2"
    assert long.fixed_outputs == (1, 2, 5, 6, 9)
    assert tiled(picture, 200.0) is picture  # already that long


def test_a_redrawn_picture_keeps_its_conversations_whole_and_its_own_apart():
    picture = _picture_with_a_conversation()
    long = redrawn(picture, 3000.0, np.random.default_rng(1))
    assert long.window_seconds == 3000.0 and long.backlog == picture.backlog
    times = [r.time for r in long.requests]
    assert times == sorted(times) and 0.0 <= times[0] and times[-1] < 3000.0
    groups: dict[str, list] = {}
    for index, request in enumerate(long.requests):
        if request.prefix_group is not None:
            groups.setdefault(request.prefix_group, []).append((index, request))
    assert len(groups) >= 2 and len(set(groups)) == len(groups)  # each drawn conversation its own
    for turns in groups.values():
        # the turns at their own offsets, lengths and cached prefixes, their outputs still fixed
        assert [r.time - turns[0][1].time for _, r in turns] == pytest.approx([0.0, 150.0][:len(turns)])
        assert [(r.input_tokens, r.prefix_tokens, r.extends_prefix) for _, r in turns] == \
            [(800, 500, True), (900, 800, True)][:len(turns)]
        assert all(index in long.fixed_outputs for index, _ in turns)
    assert len(long.fixed_outputs) == sum(len(turns) for turns in groups.values())
    # three arrivals (the conversation one) per 300 s: the drawn stretch comes as often
    arrivals = len(long.requests) - sum(len(turns) - 1 for turns in groups.values())
    assert 20 <= arrivals <= 40
    assert redrawn(picture, 200.0, np.random.default_rng(1)) is picture  # already that long


def test_a_redrawn_stretch_meets_the_coincidences_its_own_luck_lacked():
    """Five documents, each after a chat request that came 5 s before it and 55 s after the last: repeated, no two
    documents ever come closer than a minute; drawn again, at the same rate and mix, some come seconds apart, as a
    longer stretch of that traffic would bring them."""
    requests = []
    for k in range(5):
        requests += [RequestSpec(60.0 * k, 800, 100, 4096), RequestSpec(60.0 * k + 5.0, 30000, 500, 4096)]
    picture = TrafficPicture(requests, 300.0, "request_log")

    def closest_documents(p: TrafficPicture) -> float:
        times = np.asarray([r.time for r in p.requests if r.input_tokens > 10000])
        return float(np.diff(times).min())

    assert closest_documents(tiled(picture, 1800.0)) == pytest.approx(60.0)
    long = redrawn(picture, 1800.0, np.random.default_rng(0))
    assert closest_documents(long) <= 10.0
    documents = sum(r.input_tokens > 10000 for r in long.requests)
    assert 0.3 * len(long.requests) <= documents <= 0.7 * len(long.requests)
    assert 45 <= len(long.requests) <= 75  # 2 per 60 s over 1800 s


def test_what_still_waits_at_the_windows_end_draws_the_windows_lengths_not_its_last_intervals():
    """Overload: 20 come and 10 finish each interval, so half the window's arrivals are still in the system at its
    end. They draw their outputs from all the window finished (half of them long), not from its last interval's
    finishes alone (all short)."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=1000))
    traffic.observe_interval(0.0, 30.0, finished=0, in_system=0)
    for index in range(10):
        long_ones = 0 if index == 9 else 5
        traffic.observe_interval(30.0 * (index + 1), 30.0, finished=10, in_system=10 * (index + 1),
                                 prompt_bounds=PROMPT_BOUNDS, prompt_counts=[10, 0, 0, 0, 0], prompt_sum=6000,
                                 generation_bounds=OUTPUT_BOUNDS, generation_counts=[0, 10 - long_ones, 0, long_ones],
                                 generation_sum=(10 - long_ones) * 300 + long_ones * 4000)
    picture = traffic.picture(seed=4)
    assert picture is not None and len(picture.requests) == 200
    outputs = np.array([r.output_tokens for r in picture.requests])
    times = np.array([r.time for r in picture.requests])
    waiting = outputs[times >= 150]  # fcfs: the 100 arrivals past the 100 finishes
    assert len(waiting) == 100
    assert np.mean(waiting > 2048) == pytest.approx(45 / 100, abs=0.15)


def test_drawn_lengths_stay_in_their_buckets_and_keep_the_exact_mean():
    bounds = (100.0, 1000.0, 10000.0, float("inf"))
    rng = np.random.default_rng(5)
    for counts, mean in (([0, 40, 0, 0], 800.0), ([0, 40, 0, 0], 200.0), ([10, 30, 0, 0], 400.0)):
        drawn = _sample_lengths(rng, bounds, counts, mean * sum(counts), 20000)
        assert drawn.mean() == pytest.approx(mean, rel=0.02)
        assert drawn.max() <= 1000  # nothing counted above 1000
        if counts[0] == 0:
            assert drawn.min() >= 100
    # a mean no bucket can hold (an open top bucket's doubling assumed): scaled to it
    assert _sample_lengths(rng, bounds, [0, 0, 0, 5], 5 * 50000.0, 4000).mean() == pytest.approx(50000, rel=0.02)


def test_small_draws_of_a_heavy_tail_keep_the_tail():
    """A scrape finishes a score of answers, one in a hundred of them past 16K: small draws from its histogram keep
    that one in a hundred, not squeeze it to each draw's mean."""
    bounds = (1000.0, 2000.0, 4000.0, 8000.0, 16000.0, 32000.0)
    counts = [60, 20, 10, 6, 3, 1]
    total = 60 * 600 + 20 * 1400 + 10 * 2800 + 6 * 5600 + 3 * 11000 + 1 * 22000
    rng = np.random.default_rng(9)
    drawn = np.concatenate([_sample_lengths(rng, bounds, counts, total, 18) for _ in range(400)])
    shares = np.histogram(drawn, bins=[0.0, *bounds])[0] / len(drawn)
    # each bucket's share, within 3 standard errors of 7200 draws
    assert shares == pytest.approx(np.array(counts) / 100, abs=3 * np.sqrt(0.25 / len(drawn)))
    assert drawn.mean() == pytest.approx(total / 100, rel=0.05)


def _support_requests(rng, count: int, *, reasons: bool) -> tuple[list[ExactRequest], list[int | None]]:
    """Requests whose clients cap at 1024 (80%) or set nothing (20%), outputs log-normal about 220 tokens: as a level-0
    request log shows them, with their finish reasons where `reasons` (else every one says `length`, as a log that
    does not tell them apart would). Returns the records and the true caps."""
    records, caps = [], []
    for index in range(count):
        cap = 1024 if rng.random() < 0.8 else None
        natural = int(rng.lognormal(np.log(220), 0.9)) + 1
        output = min(natural, cap) if cap else natural
        stopped = (output < cap if cap else True) if reasons else False
        records.append(ExactRequest(arrival=float(index), input_tokens=2500, output_tokens=output, finish=index + 5.0,
                                    stopped=stopped))
        caps.append(cap)
    return records, caps


def test_a_cap_clients_share_is_read_from_the_length_finishes():
    """SGLang says `length` of a request that reached its max_new_tokens and `stop` of one that ended on its own: the
    requests that finished by length at one value share that cap, and as many of the rest are given it as the
    length finishes are of the requests that ran that far."""
    records, caps = _support_requests(np.random.default_rng(7), 6000, reasons=True)
    traffic = TrafficEstimator(TrafficSettings(window_seconds=8000))
    traffic.observe_requests(records)
    picture = traffic.picture()
    assert picture is not None and picture.source == "request_log"
    by_arrival = {r.arrival: r for r in records}
    # the picture starts at the first arrival known completely: none before the first finish
    first = min(r.arrival for r in records if r.arrival >= min(q.finish for q in records))
    pairs = [(request.max_new_tokens, by_arrival[request.time + first]) for request in picture.requests]
    assert len(pairs) > 0.99 * len(records)
    given = [g for g, _ in pairs]
    # the ones that reached the cap have it exactly
    assert all(g == 1024 for g, r in pairs if r.stopped is False)
    short = [g for g, r in pairs if r.output_tokens < 1024]
    assert sum(g == 1024 for g in short) / len(short) == pytest.approx(0.8, abs=0.06)
    assert set(given) == {1024, UNSET_MAX_NEW_TOKENS}
    assert sum(c == 1024 for c in caps) / len(caps) == pytest.approx(0.8, abs=0.03)  # the draw's own share
    # the finishes survive a checkpoint: the restored daemon reads the same caps
    assert TrafficEstimator.from_dict(traffic.to_dict()).picture() == picture


def test_a_log_that_does_not_tell_stops_from_length_finishes_gives_no_caps():
    """Where every request says `length` (a log that does not tell them apart), the finishes say nothing of the
    caps: every request stays unset, as without finish reasons."""
    all_length, _ = _support_requests(np.random.default_rng(8), 3000, reasons=False)
    unsaid = [replace(r, stopped=None) for r in _support_requests(np.random.default_rng(8), 3000, reasons=True)[0]]
    for records in (all_length, unsaid):
        traffic = TrafficEstimator(TrafficSettings(window_seconds=5000))
        traffic.observe_requests(records)
        picture = traffic.picture()
        assert picture is not None
        assert {r.max_new_tokens for r in picture.requests} <= {UNSET_MAX_NEW_TOKENS} | {
            r.output_tokens for r in records}  # never the cap the log could not show
        assert all(r.max_new_tokens == UNSET_MAX_NEW_TOKENS or r.max_new_tokens == r.output_tokens
                   for r in picture.requests)
        # ... nor even a request's own: `length` said of every request is not read as reaching a cap
        assert {r.max_new_tokens for r in picture.requests} == {UNSET_MAX_NEW_TOKENS}


def test_a_request_log_picture_carries_the_servers_queue_over_its_own_window():
    """A log line shows a request's whole latency, not its wait before its first forward: the server's queue-time
    histogram shows that, and a request-log picture carries it over the window it replays (the bins inside its
    span, counted back from the last scrape), not the older ones: here the older half of the scrapes saw every
    request served at once, the window's half saw one in ten wait past 10 s."""
    traffic = TrafficEstimator(TrafficSettings(window_seconds=900))
    traffic.observe_requests([ExactRequest(arrival=1000.0 + 3.0 * k, input_tokens=1000, output_tokens=100,
                                           finish=1004.0 + 3.0 * k) for k in range(300)])
    for index in range(128):
        end = 15.0 * (index + 1)
        waits = [9, 0, 0, 1, 0] if end > 1000.0 else [10, 0, 0, 0, 0]
        traffic.observe_interval(end, 15.0, finished=5, in_system=0, queued=0,
                                 queue_bounds=QUEUE_BOUNDS, queue_counts=waits)
    picture = traffic.picture(seed=1)
    assert picture is not None and picture.source == "request_log"
    assert picture.live_queue_times is not None
    bounds, counts = picture.live_queue_times
    assert bounds == QUEUE_BOUNDS
    # the bins wholly inside the window's span (891 s: its arrivals to the cut) back from the last scrape (1920 s):
    # 59 of the 60 from 1020 s on, none of the older ones (whose ten requests all went at once)
    assert counts == (9.0 * 59, 0.0, 0.0, 59.0, 0.0)
    assert queue_share_over(bounds, counts, 10.0) == pytest.approx(0.1)
    # without the histogram, none
    quiet = TrafficEstimator(TrafficSettings(window_seconds=900))
    quiet.observe_requests([ExactRequest(arrival=1000.0 + 3.0 * k, input_tokens=1000, output_tokens=100,
                                         finish=1004.0 + 3.0 * k) for k in range(300)])
    assert quiet.picture(seed=1).live_queue_times is None


def test_a_held_copy_continues_a_conversation_whatever_its_placed_arrival():
    """The requests the server holds at the last scrape are copies of known ones placed over the window's last
    span, so their arrival says nothing of whose turn they are: a copy whose prompt is a conversation's last
    sequence plus the new tokens its turns add continues it, however long after that turn finished it is placed.
    A request the log finished, arriving as long after (20 times the turns' gaps), is left on its own."""
    import math

    from advisor.estimate.traffic import prefix_groups

    records = _session_records(sessions=6, turns=8, system_prompt=1024)
    last_turns = {}
    for record in records:  # each conversation's last turn: its output is 50 + 40 x session
        last_turns[(record.output_tokens - 50) // 40] = record
    follow_ups = []
    for _session, last in sorted(last_turns.items())[:3]:
        follow_ups.append(ExactRequest(arrival=last.finish + 100.0, input_tokens=last.input_tokens + last.output_tokens + 299,
                                       output_tokens=60, cached_tokens=0, finish=math.inf))
    requests = [RequestSpec(r.arrival, r.input_tokens, r.output_tokens, 4096) for r in records + follow_ups]
    order = sorted(range(len(requests)), key=lambda k: requests[k].time)
    held = prefix_groups([(records + follow_ups)[k] for k in order], [requests[k] for k in order])
    copies = [spec for spec in held if spec.output_tokens == 60]
    assert len(copies) == 3 and all(spec.extends_prefix and spec.prefix_tokens > 0 for spec in copies)
    finished = [replace(r, finish=r.arrival + 5.0) for r in follow_ups]
    logged = prefix_groups([(records + finished)[k] for k in order], [requests[k] for k in order])
    assert all(spec.prefix_group is None for spec in logged if spec.output_tokens == 60)
