"""Golden tests of the log-line parser on every vendored log fixture, plus prefixes, TP dedupe and garbage."""

from __future__ import annotations

import calendar
import json
import random
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from advisor.sources.bootlog import parse_boot_log
from advisor.sources.loglines import (
    BootBlock,
    LogLineParser,
    OomLine,
    RequestRecord,
    Retraction,
    StatsLine,
    parse_line,
)

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _epoch(text: str) -> float:
    return float(calendar.timegm(tuple(int(x) for x in re.split(r"[- :]", text))))  # type: ignore[arg-type]


def _feed(lines: list[str]) -> tuple[list, LogLineParser]:
    parser = LogLineParser()
    events = parser.feed(lines)
    events += parser.flush()
    return events, parser


def _read(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


def _of(events: list, kind: type) -> list:
    return [event for event in events if isinstance(event, kind)]


def test_every_retraction_wording_and_the_hard_oom() -> None:
    events, parser = _feed(_read("retraction-forms.log"))
    retractions = [
        (
            r.time,
            r.dp_rank,
            r.retracted_requests,
            r.new_tokens_gained,
            r.mamba_slots_gained,
            r.ratio_before,
            r.ratio_after,
        )
        for r in _of(events, Retraction)
    ]
    assert retractions == [
        (_epoch("2025-11-06 09:14:02"), None, 3, None, None, 0.5213, 0.6),  # 0.5.5
        (_epoch("2026-04-05 18:01:44"), None, 2, 11822, None, 0.331, 0.431),  # 0.5.10
        (_epoch("2025-03-07 21:49:33"), None, 1, None, None, 0.4562, 0.5562),  # early 2025
        (_epoch("2024-10-12 11:02:17"), None, 4, None, None, 0.3, 0.4),  # oldest, lower case
        (_epoch("2026-11-29 14:05:10"), None, 1, None, None, None, None),  # SGLANG_TEST_RETRACT
        (_epoch("2026-11-29 14:05:11"), 1, 2, 9000, 10, 0.4, 0.5),  # 0.5.16+, with DP/TP/EP prefix
    ]
    ooms = _of(events, OomLine)
    assert [(o.kind, o.message) for o in ooms] == [
        ("decode", "Decode out of memory. Try to lower your batch size.")
    ]
    assert parser.unparsed_lines == 0


def test_runtime_kvbound_single_counts() -> None:
    lines = _read("runtime-kvbound-single.log")
    events, parser = _feed(lines)
    retractions = _of(events, Retraction)
    retraction_lines = [line for line in lines if "#retracted_reqs:" in line]
    assert len(retractions) == len(retraction_lines) == 63
    assert sum(r.retracted_requests for r in retractions) == sum(
        int(re.search(r"#retracted_reqs: (\d+)", line).group(1))  # type: ignore[union-attr]
        for line in retraction_lines
    )
    assert all(r.mamba_slots_gained is not None and r.ratio_after > r.ratio_before for r in retractions)  # type: ignore[operator]
    stats = _of(events, StatsLine)
    assert len([s for s in stats if s.kind == "decode"]) == sum("Decode batch" in line for line in lines)
    assert len([s for s in stats if s.kind == "prefill"]) == sum("Prefill batch" in line for line in lines)
    # every prefill line's batch: its requests (#new-seq) with their new and cached tokens, in log order
    assert [(s.new_seqs, s.new_tokens, s.cached_tokens) for s in stats if s.kind == "prefill"] == [
        tuple(int(v) for v in re.search(r"#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)", line).groups())  # type: ignore[union-attr]
        for line in lines if "Prefill batch" in line
    ]
    # and the queue behind it: its requests and their tokens (#pending-token), the only line that sizes the waiting
    assert [(s.queued_requests, s.pending_tokens) for s in stats if s.kind == "prefill"] == [
        tuple(int(v) for v in re.search(r"#queue-req: (\d+), #pending-token: (\d+)", line).groups())  # type: ignore[union-attr]
        for line in lines if "Prefill batch" in line
    ]
    assert any(s.pending_tokens for s in stats) and all(s.pending_tokens is None for s in stats if s.kind == "decode")
    assert all(s.dp_rank is None and s.time is not None for s in stats)
    assert max(s.kv_used_tokens or 0 for s in stats) == 436906  # the pool's capacity: this server is KV-bound
    (boot,) = _of(events, BootBlock)
    assert boot.time == _epoch("2026-11-29 14:00:00") and len(boot.lines) == 8
    assert parse_boot_log("\n".join(boot.lines)).state_pool.max_mamba_cache_size == 555
    assert parser.unparsed_lines == 0


def test_runtime_tp8_is_state_bound_without_retractions() -> None:
    lines = _read("runtime-tp8.log")
    events, parser = _feed(lines)
    assert _of(events, Retraction) == []
    stats = _of(events, StatsLine)
    assert len(stats) == len(lines) - parser.ignored_lines
    assert parser.ignored_lines == sum('"GET /metrics' in line for line in lines)  # uvicorn access lines
    decode = [s for s in stats if s.kind == "decode"]
    first = decode[0]
    assert (first.running_requests, first.kv_used_tokens, first.full_token_usage) == (40, 343171, 0.29)
    assert (first.mamba_used_slots, first.mamba_usage, first.gen_throughput, first.queued_requests) == (
        200,
        0.78,
        1838.63,
        3,
    )
    assert max(s.mamba_used_slots or 0 for s in decode) <= 257  # max_mamba_cache_size of this server
    prefill = next(s for s in stats if s.kind == "prefill")
    assert (prefill.new_tokens, prefill.cached_tokens, prefill.kv_used_tokens) == (4096, 153, None)
    assert parser.unparsed_lines == 0


def test_boot_block_of_tp8_feeds_the_boot_log_reader() -> None:
    events, parser = _feed(_read("boot-tp8-default.log"))
    (boot,) = _of(events, BootBlock)
    # 0.5.23's server_args line is the dict ServerArgs.resolved_dict() produced (entrypoints/engine.py)
    assert boot.lines[0].startswith("[2026-11-29 10:00:00] server_args={'model_path': 'example/hybrid-moe', ")
    assert any("max_total_num_tokens=1167552" in line for line in boot.lines)
    info = parse_boot_log("\n".join(boot.lines))
    assert info.state_pool.max_mamba_cache_size == 257
    assert (info.server_args["tp_size"], info.server_args["mamba_full_memory_ratio"]) == (8, 0.9)
    assert (info.max_total_num_tokens, info.max_running_requests) == (1167552, 51)
    assert len(_of(events, StatsLine)) == 1  # the warm-up prefill ends the block
    assert parser.unparsed_lines == 0


def _retagged(line: str, tp: int, second_shift: int = 0) -> str:
    """A single-GPU line as TP rank `tp` of a TP8 server prints it (optionally a second later)."""
    stamp, message = line[1:20], line[22:]
    moment = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S") + timedelta(seconds=second_shift)
    return f"[{moment:%Y-%m-%d %H:%M:%S} TP{tp}] {message}"


def test_retractions_are_deduplicated_across_tp_ranks() -> None:
    single = _read("runtime-kvbound-single.log")
    rng = random.Random(7)
    tp8: list[str] = []
    for line in single:
        if "#retracted_reqs:" not in line:
            tp8.append(_retagged(line, 0))
            continue
        copies = [_retagged(line, tp, second_shift=1 if tp >= 6 else 0) for tp in range(8)]
        rng.shuffle(copies)  # ranks print in any order, some after the second rolls over
        tp8.extend(copies)
    events, parser = _feed(tp8)
    expected, _ = _feed(single)
    assert [r.retracted_requests for r in _of(events, Retraction)] == [
        r.retracted_requests for r in _of(expected, Retraction)
    ]
    assert parser.duplicate_retractions == 7 * 63


def test_repeated_identical_events_on_one_rank_are_kept() -> None:
    line = "KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 10, #new_token_ratio: 0.1000 -> 0.2000"
    lines = [
        f"[2026-11-29 10:00:00 DP0 TP0] {line}",
        f"[2026-11-29 10:00:00 DP0 TP1] {line}",
        f"[2026-11-29 10:00:00 DP0 TP0] {line}",  # a second event, same payload
        f"[2026-11-29 10:00:00 DP1 TP4] {line}",  # another DP rank's own event
        f"[2026-11-29 10:00:01 DP0 TP1] {line}",
        f"[2026-11-29 10:00:09 DP0 TP1] {line}",  # long after: a new event
    ]
    events, parser = _feed(lines)
    assert [(r.dp_rank, r.time) for r in _of(events, Retraction)] == [
        (0, _epoch("2026-11-29 10:00:00")),
        (0, _epoch("2026-11-29 10:00:00")),
        (1, _epoch("2026-11-29 10:00:00")),
        (0, _epoch("2026-11-29 10:00:09")),
    ]
    assert parser.duplicate_retractions == 2


def test_request_logs_json_and_export_file_agree() -> None:
    json_lines = _read("requests-json.log")
    export_lines = _read("sglang-request-metrics-20261129_15.log")
    from_json = _of(_feed(json_lines)[0], RequestRecord)
    from_export = _of(_feed(export_lines)[0], RequestRecord)
    raw = [json.loads(line.split("] ", 1)[1])["out"]["meta_info"] for line in json_lines]
    assert len(from_json) == len(from_export) == len(raw) == 500
    assert sum(r.prompt_tokens for r in from_json) == sum(m["prompt_tokens"] for m in raw)
    assert sum(r.completion_tokens for r in from_json) == sum(m["completion_tokens"] for m in raw)
    assert sum(r.cached_tokens for r in from_json) == sum(m["cached_tokens"] for m in raw)
    assert sum(r.num_retractions for r in from_json) == sum(m["num_retractions"] for m in raw)
    key = [(r.rid, r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.e2e_latency) for r in from_json]
    assert key == [
        (r.rid, r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.e2e_latency) for r in from_export
    ]
    assert {r.source for r in from_json} == {"json"} and {r.source for r in from_export} == {"export"}
    assert all(r.time is None for r in from_export)
    assert from_json[0].time == pytest.approx(_epoch("2026-11-29 15:00:01") + 0.046830)


def _as_text_form(json_line: str) -> str:
    """The same request as `--log-requests` (text) prints it: Python-style dict rendering."""
    prefix, payload = json_line.split("] ", 1)
    data = json.loads(payload)

    def render(value: object) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"'{k}': {render(v)}" for k, v in value.items()) + "}"
        return repr(value)

    obj = f"GenerateReqInput(rid={data['rid']!r}, stream=False, log_metrics=True)"
    return f"{prefix}] Finish: obj={obj}, out={render(data['out'])}"


def test_text_request_form() -> None:
    json_lines = _read("requests-json.log")[:40]
    events, parser = _feed([_as_text_form(line) for line in json_lines])
    records = _of(events, RequestRecord)
    expected = _of(_feed(json_lines)[0], RequestRecord)
    assert [
        (r.rid, r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.num_retractions, r.e2e_latency)
        for r in records
    ] == [
        (r.rid, r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.num_retractions, r.e2e_latency)
        for r in expected
    ]
    assert {r.source for r in records} == {"text"} and parser.unparsed_lines == 0


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "[2026-10-30 12:00:00.250 DP1 PP0 ATTN_CP1 MOE_DP0 TP4 EP4] Decode batch, #running-req: 87, #full token: 412330, "
            "full token usage: 0.61, mamba num: 174, mamba usage: 0.43, accept len: 2.71, accept rate: 0.57, cuda graph: True, "
            "gen throughput (token/s): 5123.40, #queue-req: 3",
            dict(time=_epoch("2026-10-30 12:00:00") + 0.25, dp_rank=1, kind="decode", running_requests=87, kv_used_tokens=412330,
                 mamba_used_slots=174, accept_length=2.71, gen_throughput=5123.4, queued_requests=3),
        ),
        (  # plain pool, the 0.5.5-era trailing comma
            "[2026-10-30 12:00:00] Decode batch. #running-req: 5, #token: 100, token usage: 0.01, gen throughput (token/s): 10.00, "
            "#queue-req: 0, ",
            dict(kind="decode", running_requests=5, kv_used_tokens=100, full_token_usage=0.01, mamba_used_slots=None,
                 mamba_usage=None, queued_requests=0),
        ),
        (  # iteration counter, PD-decode fields, occupancy tail
            "[2026-10-30 12:00:00 TP0] Decode batch [1234], #running-req: 9, #full token: 900, full token usage: 0.10, "
            "mamba num: 18, mamba usage: 0.20, PD-decode: pre-allocated usage: 0.00, #prealloc-req: 0, #transfer-req: 0, "
            "#retracted-req: 0, cuda graph: True, gen throughput (token/s): 99.00, #queue-req: 2, fwd occupancy: 91.00%",
            dict(running_requests=9, kv_used_tokens=900, mamba_used_slots=18, queued_requests=2, gen_throughput=99.0),
        ),
        (
            "[2026-10-30 12:00:00] Prefill batch, #new-seq: 2, #new-token: 8192, #cached-token: 12, token usage: 0.50, "
            "#running-req: 4, #queue-req: 7, #pending-token: 100, cuda graph: False, input throughput (token/s): 123.00, "
            "est. prefill TFLOPS/s (per GPU): 45.60",
            dict(kind="prefill", new_tokens=8192, cached_tokens=12, full_token_usage=0.5, running_requests=4, queued_requests=7),
        ),
    ],
)  # fmt: skip
def test_stats_line_forms(line: str, expected: dict) -> None:
    event = parse_line(line)
    assert isinstance(event, StatsLine)
    for name, value in expected.items():
        assert getattr(event, name) == (pytest.approx(value) if isinstance(value, float) else value), name


def test_two_boots_and_an_unfinished_one() -> None:
    boot = _read("runtime-kvbound-single.log")[:8]
    crashed = [
        "[2026-11-29 13:00:00] server_args=ServerArgs(tp_size=1)",
        "[2026-11-29 13:00:01] Load weight begin. avail mem=1.00 GB",
    ]
    events, parser = _feed(crashed + boot + ["[2026-11-29 14:00:40] Decode batch, #running-req: 1, #token: 5, token usage: 0.00, "
                                             "gen throughput (token/s): 1.00, #queue-req: 0"] + boot[:7])  # fmt: skip
    blocks = _of(events, BootBlock)
    assert [len(block.lines) for block in blocks] == [
        8,
        7,
    ]  # the second reached its caps line; flush emits it
    assert parser.abandoned_boot_blocks == 1  # the crashed boot, superseded by the next Load weight begin
    assert blocks[0].lines[0] == boot[0]
    assert [type(e).__name__ for e in events] == ["BootBlock", "StatsLine", "BootBlock"]


def test_garbage_never_raises_and_is_counted() -> None:
    garbage = [
        "",
        "Traceback (most recent call last):",
        "[not a timestamp] Decode batch, #running-req: 1",
        "[2026-11-29 10:00:00 XX9] Decode batch, #running-req: 1, #queue-req: 0",
        "[2026-11-29 10:00:00] Decode batch, #running-req: many, #queue-req: 0",
        "[2026-11-29 10:00:00] Decode batch, #running-req: 4",
        "[2026-11-29 10:00:00] KV cache pool is full. Retract requests.",
        '[2026-11-29 10:00:00] {"event": "request.finished", "out": 3}',
        '{"prompt_tokens": "x", "completion_tokens": 1}',
        "{broken json",
        "\x00\x01\x02\ufffd",
        "[2026-13-45 99:99:99] Decode batch, #running-req: 1, #queue-req: 0",
    ]
    events, parser = _feed(garbage)
    assert events == []
    assert parser.unparsed_lines == len(garbage) - 1  # the blank line is ignored, not unparsed
    assert parser.lines_seen == len(garbage)


def test_random_cuts_of_real_lines_never_raise() -> None:
    rng = random.Random(11)
    pool = (
        _read("runtime-kvbound-single.log") + _read("requests-json.log")[:50] + _read("retraction-forms.log")
    )
    parser = LogLineParser()
    for _ in range(3000):
        line = rng.choice(pool)
        start, stop = sorted(rng.randrange(len(line) + 1) for _ in range(2))
        parser.feed([line[start:stop], line[:stop]])
    assert parser.lines_seen == 6000


def test_parse_line_ignores_uvicorn_and_strips_newlines() -> None:
    assert (
        parse_line('[2026-11-29 10:02:01] INFO:     127.0.0.1:40112 - "GET /metrics HTTP/1.1" 200 OK\n')
        is None
    )
    event = parse_line("[2026-11-29 10:00:00] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
                       "#new_tokens_gained: 5, #mamba_num_gained: 8, #new_token_ratio: 0.1000 -> 0.2000\r\n")  # fmt: skip
    assert isinstance(event, Retraction) and event.mamba_slots_gained == 8


@pytest.mark.parametrize(
    "bad",
    [
        '{"timestamp": "2026-11-29T10:00:00", "event": "request.finished", "rid": "x", "out": {"meta_info": '
        '{"prompt_tokens": Infinity, "completion_tokens": 5}}}',
        '{"timestamp": "2026-11-29T10:00:00", "event": "request.finished", "rid": "x", "out": {"meta_info": '
        '{"prompt_tokens": 1e400, "completion_tokens": 5}}}',
        '{"event": "request.finished", "out": ' + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "}",
        '{"prompt_tokens": NaN, "completion_tokens": 5}',
        '{"prompt_tokens": 1e400, "completion_tokens": 5}',
        '{"prompt_tokens": -3, "completion_tokens": 5}',
        "Finish: obj=GenerateReqInput(rid='r1'), out={'meta_info': {'prompt_tokens': 1e400, 'completion_tokens': 3}}",
    ],
    ids=["infinity", "1e400", "deep-nesting", "nan-export", "1e400-export", "negative", "1e400-text"],
)
def test_a_corrupt_request_line_is_counted_and_the_batch_keeps_its_good_lines(bad: str) -> None:
    good = _read("requests-json.log")[:3]
    parser = LogLineParser()
    events = parser.feed([*good, "[2026-11-29 10:00:00] " + bad, *good])
    records = _of(events, RequestRecord)
    assert len(records) == 6 and [r.prompt_tokens for r in records[:3]] == [r.prompt_tokens for r in records[3:]]
    assert parser.unparsed_lines == 1
    assert parser.bad_request_lines == 1  # the daemon counts these under source="logs"


def test_json_that_is_no_request_log_is_unparsed_but_not_a_bad_request_line() -> None:
    parser = LogLineParser()
    parser.feed(['[2026-11-29 10:00:00] {"detail": "something else"}'])
    assert parser.unparsed_lines == 1 and parser.bad_request_lines == 0


# SGLang's default --log-requests-level is 2: the finished request's obj carries its sampling params
# (utils/request_logger.py `_compute_metadata`); level 0 drops them.
_LEVEL2_JSON = (
    '[2026-11-29 15:00:01] {"timestamp": "2026-11-29T15:00:01.046830", "event": "request.finished", "rid": "r1", '
    '"obj": {"text": "say \\"sampling_params\\": {\\"max_new_tokens\\": 7}", "sampling_params": '
    '{"temperature": 0.7, "max_new_tokens": 1024, "stop": null}, "rid": "r1", "stream": false}, '
    '"out": {"meta_info": {"id": "r1", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 1194, '
    '"completion_tokens": 319, "cached_tokens": 137, "num_retractions": 0, "e2e_latency": 6.7}}}'
)


@pytest.mark.parametrize(("line", "expected"), [
    (_LEVEL2_JSON, 1024),  # the sampling params, not the prompt text that quotes them
    (_LEVEL2_JSON.replace('"max_new_tokens": 1024', '"max_new_tokens": null'), None),  # the client left it unset
    (_LEVEL2_JSON.replace('"sampling_params": {"temperature"', '"sampling_params": {"top_p"'), 1024),
    # keys in another order than log_json writes them: the full decoder reads the obj
    (_LEVEL2_JSON.replace('"event": "request.finished", "rid": "r1", ', '"rid": "r1", "event": "request.finished", '),
     1024),
    # level 0: no sampling params at all
    ('[2026-11-29 15:00:01] {"timestamp": "2026-11-29T15:00:01", "event": "request.finished", "rid": "r2", "obj": '
     '{"rid": "r2"}, "out": {"meta_info": {"prompt_tokens": 10, "completion_tokens": 5, "e2e_latency": 1.0}}}', None),
    # the export file: the request's fields as a JSON string
    ('[2026-11-29 15:00:01] {"request_parameters": "{\\"rid\\": \\"r3\\", \\"sampling_params\\": '
     '{\\"max_new_tokens\\": 256}}", "prompt_tokens": 10, "completion_tokens": 5, "e2e_latency": 1.0}', 256),
    # the text form: the obj's sampling_params field, after a prompt that spells one out
    ("[2026-11-29 15:00:01] Finish: obj=GenerateReqInput(text=\"a sampling_params={'max_new_tokens': 9}\", "
     "sampling_params={'temperature': 0.0, 'max_new_tokens': 2048}, rid='r4'), out={'meta_info': {'id': 'r4', "
     "'prompt_tokens': 10, 'completion_tokens': 5, 'e2e_latency': 1.0}}", 2048),
    ("[2026-11-29 15:00:01] Finish: obj=GenerateReqInput(sampling_params={'max_new_tokens': None}, rid='r5'), "
     "out={'meta_info': {'prompt_tokens': 10, 'completion_tokens': 5, 'e2e_latency': 1.0}}", None),
])
def test_a_request_lines_max_new_tokens_is_read_where_the_level_shows_it(line: str, expected: int | None) -> None:
    record = parse_line(line)
    assert isinstance(record, RequestRecord) and record.completion_tokens in (5, 319)
    assert record.max_new_tokens == expected


def test_a_request_lines_finish_reason_is_read_in_every_form() -> None:
    """`stop` (it ended on its own) or `length` (it reached its max_new_tokens): what a level-0 log says of the caps."""
    assert parse_line(_LEVEL2_JSON).finish_reason == "stop"  # type: ignore[union-attr]
    first = _read("requests-json.log")[0]
    assert parse_line(first).finish_reason == "length"  # type: ignore[union-attr]
    assert parse_line(_as_text_form(first)).finish_reason == "length"  # type: ignore[union-attr]
    slow = _LEVEL2_JSON.replace('"event": "request.finished", "rid": "r1", ', '"rid": "r1", "event": "request.finished", ')
    assert parse_line(slow).finish_reason == "stop"  # type: ignore[union-attr]
    unsaid = parse_line(_LEVEL2_JSON.replace('"finish_reason": {"type": "stop", "matched": 2}, ', ""))
    assert isinstance(unsaid, RequestRecord) and unsaid.finish_reason is None
