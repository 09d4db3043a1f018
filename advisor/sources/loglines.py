"""Parse SGLang log lines into events: batch stats, retractions, OOMs, finished requests and boot blocks.

Pure: lines in, dataclasses out; the caller supplies the lines (see `advisor.sources.follow`). Templates are
SGLang 0.5.23's (`managers/scheduler_components/metrics_reporter.py`, `pool_stats_observer.py`,
`managers/scheduler.py`, `utils/request_logger.py`, `observability/request_metrics_exporter.py`) plus the
older retraction wordings. Unknown or garbled lines are counted, never raised.
"""

from __future__ import annotations

import calendar
import gc
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from advisor.errors import InputError
from advisor.sources.bootlog import BootInfo, parse_boot_log
from advisor.sources.formats import (
    LINE_FORMATS,
    PREFIX_MAX_LENGTH,
    looks_like_stamp,
    prefix_ranks,
    template_pattern,
)

# The event classes use slots and no frozen guard: a busy server writes thousands of lines a second and
# frozen dataclasses cost twice as much to build. Treat them as read-only.


@dataclass(slots=True)
class StatsLine:
    """One `Prefill batch` or `Decode batch` line (printed once per DP rank, by its stats-logging rank)."""

    time: float | None
    dp_rank: int | None
    kind: str  # 'prefill' | 'decode'
    running_requests: int
    queued_requests: int
    kv_used_tokens: int | None  # decode only: `#full token:` (hybrid) or `#token:` (plain)
    full_token_usage: float | None  # `full token usage:` (hybrid) or `token usage:` (plain)
    mamba_used_slots: int | None  # decode only: `mamba num:`
    mamba_usage: float | None
    gen_throughput: float | None  # decode only
    new_tokens: int | None  # prefill only
    cached_tokens: int | None  # prefill only
    accept_length: float | None = None  # decode with speculative decoding
    # `#swa token:`: an SWA-hybrid attention model (full + sliding-window KV pools, no Mamba pool)
    swa_used_tokens: int | None = None
    # prefill only: `#new-seq:`, the batch's requests (len(can_run_list): a chunked request continuing counts again)
    new_seqs: int | None = None
    # prefill only: `#pending-token:`, the waiting requests' whole sequences and a chunked prompt's rest
    # (load_inquirer.py `_get_num_pending_tokens`; in 0.5.23's template and the 0.5.11 logs of fixtures/real)
    pending_tokens: int | None = None


@dataclass(slots=True)
class Retraction:
    """A decode-OOM retraction event, counted once even though every TP rank prints it."""

    time: float | None
    dp_rank: int | None
    retracted_requests: int
    new_tokens_gained: int | None
    mamba_slots_gained: int | None
    ratio_before: float | None
    ratio_after: float | None
    tp_rank: int | None = None


@dataclass(slots=True)
class OomLine:
    """A hard out-of-memory error (a crash, not a retraction)."""

    time: float | None
    dp_rank: int | None
    kind: str  # 'decode' | 'prefill' | 'req_slots'
    message: str


@dataclass(slots=True)
class RequestRecord:
    """One finished request's exact lengths (from --log-requests or --export-metrics-to-file)."""

    time: float | None
    rid: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # 0 when the log does not say
    num_retractions: int  # 0 when the log does not say (SGLang before per-request retraction counts)
    e2e_latency: float | None
    source: str = ""  # 'json' (--log-requests-format json) | 'text' (Finish: ...) | 'export' (metrics file)
    # The client's max_new_tokens, where the line shows the sampling params (SGLang's default
    # --log-requests-level 2 does; level 0 drops them): None when not shown or left unset.
    max_new_tokens: int | None = None
    # How it finished (meta_info finish_reason's type): 'stop' (EOS or a stop string), 'length' (it reached its
    # max_new_tokens, or the context), 'abort'; None when the line does not say.
    finish_reason: str | None = None


@dataclass(slots=True)
class BootBlock:
    """The lines of one server boot (server_args / Load weight begin .. caps line / fired up)."""

    time: float | None
    lines: list[str] = field(default_factory=list)


LogEvent = StatsLine | Retraction | OomLine | RequestRecord | BootBlock

# ------------------------------------------------------------------------------------------------ prefix

# The prefix grammar is the one in `advisor.sources.formats` (PREFIX_RANK_NAMES), shared with the boot reader.


@dataclass(slots=True)
class _Head:
    time: float | None
    dp_rank: int | None
    tp_rank: int | None
    process: tuple[int, ...]  # (pp, attn_cp, moe_dp, dcp, cp, tp): which scheduler process printed the line


_CACHE_LIMIT = 4096


_DAY_CACHE: dict[str, int | None] = {}


def _day_start(text: str) -> int | None:
    """`YYYY-MM-DD` -> epoch seconds of its midnight (UTC), cached: a log spans few days."""
    day = _DAY_CACHE.get(text, -1)
    if day == -1:
        day = None
        if (
            text[4] == "-"
            and text[7] == "-"
            and text[:4].isdigit()
            and text[5:7].isdigit()
            and text[8:10].isdigit()
        ):
            year, month, mday = int(text[:4]), int(text[5:7]), int(text[8:10])
            if 1 <= month <= 12 and 1 <= mday <= calendar.monthrange(year, month)[1]:
                day = calendar.timegm((year, month, mday, 0, 0, 0))
        if len(_DAY_CACHE) > _CACHE_LIMIT:
            _DAY_CACHE.clear()
        _DAY_CACHE[text] = day
    return day


_SECOND_CACHE: dict[str, float | None] = {}


def _parse_timestamp(text: str) -> float | None:
    """`YYYY-MM-DD HH:MM:SS[.ffffff]` (or with `T`) -> epoch seconds, the wall clock read as UTC; None if
    it is not one. Whole seconds are cached: neighbouring lines share them."""
    seconds = _SECOND_CACHE.get(text[:19], -1.0)
    if seconds == -1.0:
        if len(_SECOND_CACHE) > _CACHE_LIMIT:
            _SECOND_CACHE.clear()
        seconds = _SECOND_CACHE[text[:19]] = _parse_whole_seconds(text[:19])
    if seconds is None or len(text) == 19:
        return seconds
    if text[19] != "." or not text[20:].isdigit():
        return None
    return seconds + float("0" + text[19:])


def _parse_whole_seconds(text: str) -> float | None:
    if len(text) < 19 or text[10] not in " T" or text[13] != ":" or text[16] != ":":
        return None
    day = _day_start(text[:10])
    clock = text[11:13], text[14:16], text[17:19]
    if day is None or not (clock[0].isdigit() and clock[1].isdigit() and clock[2].isdigit()):
        return None
    hour, minute, second = int(clock[0]), int(clock[1]), int(clock[2])
    if hour > 23 or minute > 59 or second > 60:
        return None
    return float(day + hour * 3600 + minute * 60 + second)


_RankInfo = tuple[int | None, int | None, tuple[int, ...]]  # (dp_rank, tp_rank, process)
_RANKS_CACHE: dict[str, _RankInfo | None] = {}


def _parse_ranks(text: str) -> _RankInfo | None:
    """`DP1 PP0 ATTN_CP0 MOE_DP0 TP4 EP4` (`formats.prefix_ranks`) -> (dp, tp, process), or None."""
    ranks = prefix_ranks(text)
    if ranks is None:
        return None
    get = ranks.get
    process = (get("PP", 0), get("ATTN_CP", 0), get("MOE_DP", 0), get("DCP", 0), get("CP", 0), get("TP", -1))
    return get("DP", get("ATTN_DP")), get("TP"), process


def _ranks(text: str) -> _RankInfo | None:
    if text in _RANKS_CACHE:
        return _RANKS_CACHE[text]
    if len(_RANKS_CACHE) >= _CACHE_LIMIT:
        _RANKS_CACHE.clear()
    ranks = _RANKS_CACHE[text] = _parse_ranks(text)
    return ranks


def _parse_head(head: str) -> _Head | None:
    """`2026-10-30 12:00:00[.123][ DP1][ PP0][ ATTN_CP0][ MOE_DP0][ TP4][ EP4]` -> _Head, or None."""
    space = head.find(" ", 19)
    stamp, ranks_text = (head, "") if space < 0 else (head[:space], head[space + 1 :])
    time = _parse_timestamp(stamp)
    if time is None:
        return None
    ranks = _ranks(ranks_text)
    if ranks is None:
        return None
    return _Head(time, ranks[0], ranks[1], ranks[2])


_NO_HEAD = _Head(None, None, None, (0, 0, 0, 0, 0, -1))
_NO_RANKS: _RankInfo = (None, None, (0, 0, 0, 0, 0, -1))


def _lost_its_bracket(line: str) -> bool:
    """`2026-05-24 03:51:44 TP0] Decode batch, …`: a stamp, then `]` within a prefix's length."""
    return len(line) > 20 and looks_like_stamp(line) and line.find("]", 19, PREFIX_MAX_LENGTH) > 0


def _split_line(line: str) -> tuple[_Head | None, str]:
    """(prefix info, message). Head None means the line starts with '[' but the prefix is garbled."""
    if not line.startswith("["):
        if line[:1].isdigit() and _lost_its_bracket(line):
            return _split_line("[" + line)  # a pasted line that lost its leading `[` (real/030)
        return _NO_HEAD, line
    close = line.find("]", 20)
    if close < 0:
        return None, line
    if line[20] == "." or close > 20 and line[20] != " ":
        head = _parse_head(line[1:close])  # SGLANG_LOG_MS milliseconds (or garbage): the general path
    else:
        # Whole seconds and rank names cached separately: a second is shared by every rank's lines.
        stamp = line[1:20]
        time = _SECOND_CACHE.get(stamp, -1.0)
        if time == -1.0:
            time = _parse_timestamp(stamp)
        ranks = _ranks(line[21:close]) if close > 20 else _NO_RANKS
        head = None if time is None or ranks is None else _Head(time, ranks[0], ranks[1], ranks[2])
    start = close + 2 if line.startswith(" ", close + 1) else close + 1
    return head, line[start:]


# ------------------------------------------------------------------------------------------------ messages

_RETRACT_STARTS = (
    "KV cache pool is full. Retract requests.",  # 0.5.5+ (info), 0.5.10+ (warning)
    "Testing retraction.",  # SGLANG_TEST_RETRACT hook
    "Decode out of memory happened",  # early 2025
    "decode out of memory happened",  # oldest
)
_RETRACTED = re.compile(r"#retracted_reqs: (\d+)")
# The 0.5.10+ wording in one match (managers/scheduler.py update_running_batch); older ones use the searches.
_RETRACT_FULL = re.compile(
    r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+), #new_tokens_gained: (-?\d+)"
    r"(?:, #mamba_num_gained: (-?\d+))?, #new_token_ratio: (\d+\.\d+) -> (\d+\.\d+)"
)
_GAINED = re.compile(r"#new_tokens_gained: (-?\d+)")
_MAMBA_GAINED = re.compile(r"#mamba_num_gained: (-?\d+)")
_RATIO = re.compile(r"#new_token_ratio: ([-\d.]+) -> ([-\d.]+)")
_OOM_STARTS = (
    ("Decode out of memory.", "decode"),
    ("Prefill out of memory.", "prefill"),
    ("alloc_req_slots runs out of memory", "req_slots"),
)
_UVICORN_LEVELS = ("INFO:", "WARNING:", "ERROR:", "DEBUG:", "CRITICAL:", "TRACE:")

# Finish: obj=..., out={'meta_info': {...}} (utils/request_logger.py); tolerant of either quote style.
_TEXT_FIELDS = {
    name: re.compile(r"['\"]" + name + r"['\"]\s*:\s*(-?[\d.eE+-]+)")
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens", "num_retractions", "e2e_latency")
}
_TEXT_FINISH = re.compile(r"""['"]finish_reason['"]\s*:\s*\{\s*['"]type['"]\s*:\s*['"](\w+)['"]""")
_TEXT_MAX_NEW = re.compile(r"sampling_params=\{[^{}]*?'max_new_tokens': (\d+|None)")
_TEXT_RID = re.compile(r"""\brid=['"]([^'"]*)['"]""")
_TEXT_ID = re.compile(r"""['"]id['"]\s*:\s*['"]([^'"]*)['"]""")

# Recognised but carrying nothing we read (kept out of the unparsed count).
# Recognised but carrying nothing this reader reads (kept out of the unparsed count): every boot-time format of the
# one table (`formats.LINE_FORMATS`; the boot reader reads them from the boot blocks), and a few more lines.
_KNOWN_STARTS = tuple(
    dict.fromkeys(
        [f.marker for f in LINE_FORMATS if not f.marker.startswith(("Decode batch", "Prefill batch"))]
        + [
            "Load weight",
            "Mamba Cache is allocated",
            "KV Cache is allocated",
            "Capture ",
            "max_running_requests",
            "Max running requests",
            "The server is fired up",
            "server_args=",
            "retract_decode:",
            "Health check failed",
            "Post-capture KV sizing",
            "Receive:",
            "Receive OpenAI:",
        ]
    )
)


def _int_or_none(fields: dict[str, str], key: str) -> int | None:
    value = fields.get(key)
    return None if value is None else int(value)


def _float_or_none(fields: dict[str, str], key: str) -> float | None:
    value = fields.get(key)
    return None if value is None else float(value)


# Fast paths for the exact 0.5.23 hybrid-SSM lines without spec decoding (the bulk of a busy log), compiled from
# the format table's templates; any other shape goes through the general field split below, which gives the same
# numbers.
_HYBRID_DECODE = template_pattern("decode_hybrid", fixed={"spec": ""}, choices={"graph": "True|False"})
_HYBRID_PREFILL = template_pattern("prefill_hybrid", choices={"graph": "True|False"})


def _parse_stats(message: str, kind: str, head: _Head) -> StatsLine | None:
    try:
        return _parse_stats_unchecked(message, kind, head)
    except ValueError:  # a number the pattern let through but int()/float() refuse (".696.94"): unparsed
        return None


def _parse_stats_unchecked(message: str, kind: str, head: _Head) -> StatsLine | None:
    if kind == "decode":
        match = _HYBRID_DECODE.fullmatch(message)
        if match is not None:
            running, kv_used, full_usage, mamba_num, mamba_usage, throughput, queued = match.groups()
            return StatsLine(
                head.time,
                head.dp_rank,
                "decode",
                int(running),
                int(queued),
                int(kv_used),
                float(full_usage),
                int(mamba_num),
                float(mamba_usage),
                float(throughput),
                None,
                None,
                None,
            )
    else:
        match = _HYBRID_PREFILL.fullmatch(message)
        if match is not None:
            new_seqs, new_tokens, cached, full_usage, mamba_usage, running, queued, pending, _ = match.groups()
            return StatsLine(
                head.time,
                head.dp_rank,
                "prefill",
                int(running),
                int(queued),
                None,
                float(full_usage),
                None,
                float(mamba_usage),
                None,
                int(new_tokens),
                int(cached),
                None,
                new_seqs=int(new_seqs),
                pending_tokens=int(pending),
            )
    return _parse_stats_fields(message, kind, head)


def _parse_stats_fields(message: str, kind: str, head: _Head) -> StatsLine | None:
    start = message.find("#")
    if start < 0:
        return None
    fields: dict[str, str] = {}
    for piece in message[start:].split(", "):
        key, sep, value = piece.partition(": ")
        if sep:
            fields[key] = value.rstrip(", ")
    running = fields.get("#running-req")
    queued = fields.get("#queue-req")
    if running is None or queued is None:
        return None
    try:
        kv_used = fields.get("#full token")
        if kv_used is None:
            kv_used = fields.get("#token")
        full_usage = fields.get("full token usage")
        if full_usage is None:
            full_usage = fields.get("token usage")
        return StatsLine(
            time=head.time,
            dp_rank=head.dp_rank,
            kind=kind,
            running_requests=int(running),
            queued_requests=int(queued),
            kv_used_tokens=None if kv_used is None else int(kv_used),
            full_token_usage=None if full_usage is None else float(full_usage),
            mamba_used_slots=_int_or_none(fields, "mamba num"),
            mamba_usage=_float_or_none(fields, "mamba usage"),
            gen_throughput=_float_or_none(fields, "gen throughput (token/s)"),
            new_tokens=_int_or_none(fields, "#new-token"),
            cached_tokens=_int_or_none(fields, "#cached-token"),
            accept_length=_float_or_none(fields, "accept len"),
            swa_used_tokens=_int_or_none(fields, "#swa token"),
            new_seqs=_int_or_none(fields, "#new-seq"),
            pending_tokens=_int_or_none(fields, "#pending-token") if kind == "prefill" else None,
        )
    except ValueError:
        return None


def _parse_retraction(message: str, head: _Head) -> Retraction | None:
    fast = _RETRACT_FULL.fullmatch(message)
    if fast is not None:
        count_text, gained_text, mamba_text, before, after = fast.groups()
        return Retraction(
            head.time,
            head.dp_rank,
            int(count_text),
            int(gained_text),
            None if mamba_text is None else int(mamba_text),
            float(before),
            float(after),
            head.tp_rank,
        )
    count = _RETRACTED.search(message)
    if count is None:
        return None
    gained = _GAINED.search(message)
    mamba = _MAMBA_GAINED.search(message)
    ratio = _RATIO.search(message)
    try:
        return Retraction(
            time=head.time,
            dp_rank=head.dp_rank,
            retracted_requests=int(count.group(1)),
            new_tokens_gained=int(gained.group(1)) if gained else None,
            mamba_slots_gained=int(mamba.group(1)) if mamba else None,
            ratio_before=float(ratio.group(1)) if ratio else None,
            ratio_after=float(ratio.group(2)) if ratio else None,
            tp_rank=head.tp_rank,
        )
    except ValueError:
        return None


def _iso_time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    fast = _parse_timestamp(value)
    if fast is not None:
        return fast
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return calendar.timegm(moment.utctimetuple()) + moment.microsecond / 1e6


_MAX_COUNT = 1 << 40  # no request has a trillion tokens: a larger count is a corrupt line


def _count(value: Any) -> int | None:
    """A token count from JSON; None when absent; ValueError when not a finite, sane, non-negative number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < _MAX_COUNT:
        raise ValueError(f"not a count: {value!r}")
    return int(value)


_FINISH_TYPES = frozenset({"stop", "length", "abort"})


def _finish_type(kind: Any) -> str | None:
    """A finish_reason's type ({'type': 'stop', 'matched': ...}, {'type': 'length', 'length': n}) where it is one."""
    return kind if kind in _FINISH_TYPES else None


def _optional_count(value: Any) -> int | None:
    """A token count, or None where it is absent or not a sane count (an optional field is no reason to drop a line)."""
    try:
        return _count(value)
    except ValueError:
        return None


def _max_new_of(parameters: Any) -> int | None:
    """max_new_tokens from a request's logged fields (a dict holding `sampling_params`); None when absent, unset or
    not a sane count."""
    sampling = parameters.get("sampling_params") if isinstance(parameters, dict) else None
    return _optional_count(sampling.get("max_new_tokens")) if isinstance(sampling, dict) else None


def _max_new_text(matched: str) -> int | None:
    """A max_new_tokens value a pattern matched: digits, or null / None (the client left it unset)."""
    return _optional_count(int(matched)) if matched.isdigit() else None


def _record_from_meta(
    meta: dict[str, Any], time: float | None, rid: Any, source: str, max_new_tokens: int | None = None
) -> RequestRecord | None:
    try:
        prompt = _count(meta.get("prompt_tokens"))
        completion = _count(meta.get("completion_tokens"))
        if prompt is None or completion is None:
            return None
        latency = meta.get("e2e_latency")
        return RequestRecord(
            time,
            None if rid is None else str(rid),
            prompt,
            completion,
            _count(meta.get("cached_tokens")) or 0,
            _count(meta.get("num_retractions")) or 0,
            float(latency)
            if isinstance(latency, (int, float)) and not isinstance(latency, bool) and math.isfinite(latency)
            else None,
            source,
            max_new_tokens,
            _finish_type(reason.get("type")) if isinstance(reason := meta.get("finish_reason"), dict) else None,
        )
    except ValueError:
        return None


# log_json (utils/log_utils.py) writes timestamp, event, then rid first: read those by position and decode
# only the small meta_info object; anything unusual goes through a full json.loads.
_JSON_HEAD = re.compile(r'\{"timestamp": "([^"\\]*)", "event": "([^"\\]*)"(?:, "rid": "([^"\\]*)")?')
_META_KEY = '"meta_info": '
# The request's sampling params inside `obj` (levels 1-3): a key with an unescaped quote is no prompt text.
_JSON_MAX_NEW = re.compile(r'"sampling_params": \{[^{}]*?"max_new_tokens": (\d+|null)')


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite JSON number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"non-finite JSON number {text}")
    return value


# Infinity / NaN / 1e400 make a line bad (counted, skipped), never a float that later fails to become an int;
# nesting deep enough to exhaust the recursion limit is caught where the decoder is called.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
_JSON_ERRORS = (ValueError, RecursionError)


def _parse_json_fast(message: str, head: _Head) -> tuple[RequestRecord | None, bool] | None:
    match = _JSON_HEAD.match(message)
    if match is None:
        return None
    stamp, event, rid = match.groups()
    if event != "request.finished":
        return None, True  # another request event (received, ...): nothing we read
    at = message.rfind(_META_KEY)
    if at < 0 or rid is None:
        return None
    try:
        meta, _ = _DECODER.raw_decode(message, at + len(_META_KEY))
    except _JSON_ERRORS:
        return None
    if not isinstance(meta, dict):
        return None
    time = _iso_time(stamp)
    max_new = _JSON_MAX_NEW.search(message, 0, at)
    record = _record_from_meta(meta, head.time if time is None else time, rid, "json",
                               _max_new_text(max_new.group(1)) if max_new else None)
    return record, record is not None


def _parse_json_message(message: str, head: _Head) -> tuple[RequestRecord | None, bool]:
    """(record, recognised). `--log-requests-format json` lines and `--export-metrics-to-file` lines."""
    fast = _parse_json_fast(message, head)
    if fast is not None:
        return fast
    try:
        data = _DECODER.decode(message)
    except _JSON_ERRORS:
        return None, False
    if not isinstance(data, dict):
        return None, False
    event = data.get("event")
    if event is not None:
        if event != "request.finished":
            return None, True
        out = data.get("out")
        meta = out.get("meta_info") if isinstance(out, dict) else None
        if not isinstance(meta, dict):
            return None, False
        time = _iso_time(data.get("timestamp"))
        record = _record_from_meta(meta, head.time if time is None else time, data.get("rid"), "json",
                                   _max_new_of(data.get("obj")))
        return record, record is not None
    if "prompt_tokens" in data:  # the export file: meta_info fields at the top level
        rid: Any = None
        max_new = None
        parameters = data.get("request_parameters")
        if isinstance(parameters, str):
            try:
                parsed = _DECODER.decode(parameters)
            except _JSON_ERRORS:
                parsed = None
            if isinstance(parsed, dict):
                rid = parsed.get("rid")
                max_new = _max_new_of(parsed)
        if rid is None:
            rid = data.get("id")
        record = _record_from_meta(data, head.time, rid, "export", max_new)
        return record, record is not None
    return None, False


def _parse_finish_text(message: str, head: _Head) -> RequestRecord | None:
    out_at = message.rfind("meta_info")
    if out_at < 0:
        out_at = message.find("out=")
    if out_at < 0:
        return None
    tail = message[out_at:]
    values: dict[str, float] = {}
    for name, pattern in _TEXT_FIELDS.items():
        match = pattern.search(tail)
        if match is not None:
            try:
                values[name] = float(match.group(1))
            except ValueError:
                return None
            if not (math.isfinite(values[name]) and 0 <= values[name] < _MAX_COUNT):
                return None  # 1e400, a negative count: a corrupt line, counted as unparsed
    if "prompt_tokens" not in values or "completion_tokens" not in values:
        return None
    rid_match = _TEXT_RID.search(message) or _TEXT_ID.search(tail)
    # the obj's sampling_params field, the last before the output (the prompt's text comes first in the obj)
    max_new = _TEXT_MAX_NEW.findall(message, 0, out_at)
    finish = _TEXT_FINISH.search(tail)
    return RequestRecord(
        time=head.time,
        rid=rid_match.group(1) if rid_match else None,
        prompt_tokens=int(values["prompt_tokens"]),
        completion_tokens=int(values["completion_tokens"]),
        cached_tokens=int(values.get("cached_tokens", 0)),
        num_retractions=int(values.get("num_retractions", 0)),
        e2e_latency=values.get("e2e_latency"),
        source="text",
        max_new_tokens=_max_new_text(max_new[-1]) if max_new else None,
        finish_reason=_finish_type(finish.group(1)) if finish else None,
    )


# Outcome codes of _classify.
_EVENT, _KNOWN, _IGNORED, _UNPARSED, _BAD_REQUEST = range(5)  # _BAD_REQUEST: a request-log line that gave no record


_REQUEST_FINISHED = '"request.finished"'
_PROMPT_TOKENS = '"prompt_tokens"'


def _classify(line: str) -> tuple[LogEvent | None, int, _Head | None, str]:
    """(event, outcome, head, message) for one line without its newline."""
    head, message = _split_line(line)
    if head is None:
        return None, _UNPARSED, None, message
    if not message or message.isspace():
        return None, _IGNORED, head, message
    first = message[0]
    if first == "D":
        if message.startswith("Decode batch"):
            stats = _parse_stats(message, "decode", head)
            return stats, _EVENT if stats else _UNPARSED, head, message
        if message.startswith("Decode out of memory happened"):
            event = _parse_retraction(message, head)
            return event, _EVENT if event else _UNPARSED, head, message
    elif first == "P" and message.startswith("Prefill batch"):
        stats = _parse_stats(message, "prefill", head)
        return stats, _EVENT if stats else _UNPARSED, head, message
    elif first == "{":
        record, recognised = _parse_json_message(message, head)
        if record is not None:
            return record, _EVENT, head, message
        if recognised:
            return None, _KNOWN, head, message
        is_request = _REQUEST_FINISHED in message or _PROMPT_TOKENS in message  # a request log or the export file
        return None, _BAD_REQUEST if is_request else _UNPARSED, head, message
    if message.startswith(_RETRACT_STARTS):
        event = _parse_retraction(message, head)
        return event, _EVENT if event else _UNPARSED, head, message
    for start, kind in _OOM_STARTS:
        if message.startswith(start):
            return OomLine(head.time, head.dp_rank, kind, message.strip()), _EVENT, head, message
    if message.startswith("Finish: "):
        record = _parse_finish_text(message, head)
        return record, _EVENT if record else _BAD_REQUEST, head, message
    if message.startswith(_UVICORN_LEVELS):
        return None, _IGNORED, head, message
    if message.startswith(_KNOWN_STARTS):
        return None, _KNOWN, head, message
    return None, _UNPARSED, head, message


def parse_line(line: str) -> LogEvent | None:
    """The event one line carries, or None. Stateless: no TP dedupe and no boot blocks (see LogLineParser)."""
    return _classify(line.rstrip("\r\n"))[0]


# ------------------------------------------------------------------------------------------------ stateful

_DEDUPE_WINDOW_SECONDS = 3.0
# An open boot block (a server_args line, no caps line yet) holds at most this much; then it is given up and
# counted in `abandoned_boot_blocks` (a real boot block is a few hundred lines, tens of KB).
_BOOT_BLOCK_MAX_LINES = 20_000
_BOOT_BLOCK_MAX_BYTES = 4 << 20


class LogLineParser:
    """Feeds lines through `parse_line` and adds what needs memory: TP-deduplicated retractions and boot
    blocks. Counters: `lines_seen`, `unparsed_lines` (of which `bad_request_lines`: request-log lines that gave
    no record, e.g. Infinity or a cut line), `ignored_lines`, `duplicate_retractions`."""

    def __init__(self) -> None:
        self.lines_seen = 0
        self.unparsed_lines = 0
        self.bad_request_lines = 0
        self.ignored_lines = 0
        self.duplicate_retractions = 0
        self.abandoned_boot_blocks = 0
        # dp_rank -> recent retractions: [time, payload, processes that printed it]
        self._recent: dict[int | None, list[tuple[float | None, tuple, set[tuple[int, ...]]]]] = {}
        self._boot_lines: list[str] | None = None
        self._boot_time: float | None = None
        self._boot_has_caps = False
        self._boot_loaders: set[tuple[int, ...]] = set()
        self._boot_bytes = 0

    def feed(self, lines: Iterable[str]) -> list[LogEvent]:
        # A batch allocates tens of thousands of small, acyclic objects: pausing the cyclic collector for it
        # saves ~10% of the parse time (bench/follow.py) and frees nothing less.
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            return self._feed(lines)
        finally:
            if collecting:
                gc.enable()

    def _feed(self, lines: Iterable[str]) -> list[LogEvent]:
        events: list[LogEvent] = []
        append = events.append
        seen = unparsed = ignored = bad_requests = 0
        for raw in lines:
            seen += 1
            line = raw.rstrip("\r\n")
            event, outcome, head, message = _classify(line)
            if outcome == _EVENT:
                kind = event.__class__
                if kind is StatsLine:
                    if self._boot_lines is not None and self._boot_has_caps:
                        self._emit_boot(events)  # the first batch after the caps line(s): boot is over
                elif kind is Retraction and self._is_duplicate(event, head):  # type: ignore[arg-type]
                    self.duplicate_retractions += 1
                    continue
                append(event)  # type: ignore[arg-type]
            elif outcome != _BAD_REQUEST and head is not None and self._track_boot(line, message, head, events):
                continue
            elif outcome == _UNPARSED:
                unparsed += 1
            elif outcome == _BAD_REQUEST:
                unparsed += 1
                bad_requests += 1
            else:
                ignored += outcome == _IGNORED
        self.lines_seen += seen
        self.unparsed_lines += unparsed
        self.bad_request_lines += bad_requests
        self.ignored_lines += ignored
        return events

    def flush(self) -> list[LogEvent]:
        """At end of input: emit a boot block that reached its caps line but not `fired up`."""
        events: list[LogEvent] = []
        if self._boot_lines is not None and self._boot_has_caps:
            self._emit_boot(events)
        return events

    # -- boot blocks

    def _track_boot(self, line: str, message: str, head: _Head, events: list[LogEvent]) -> bool:
        """Collect the non-event lines of a boot; True when the line was taken into a block."""
        new_args = message.startswith("server_args=")
        if new_args or message.startswith("Load weight begin"):
            # Every rank prints `Load weight begin` once per boot: a second one from the same process, a
            # server_args line or any start after the caps line means a new boot.
            if self._boot_lines is not None and (
                new_args or self._boot_has_caps or head.process in self._boot_loaders
            ):
                if self._boot_has_caps:
                    self._emit_boot(events)
                else:
                    self.abandoned_boot_blocks += 1  # a boot that never finished, superseded
                    self._boot_lines = None
            if self._boot_lines is None:
                self._boot_lines = []
                self._boot_bytes = 0
                self._boot_time = head.time
                self._boot_has_caps = False
                self._boot_loaders = set()
            if not new_args:
                self._boot_loaders.add(head.process)
            self._boot_lines.append(line)
            return True
        if self._boot_lines is None:
            return False
        self._boot_lines.append(line)
        self._boot_bytes += len(line)
        if message.startswith("max_total_num_tokens="):
            self._boot_has_caps = True
        elif message.startswith("The server is fired up"):
            self._emit_boot(events)
        elif len(self._boot_lines) > _BOOT_BLOCK_MAX_LINES or self._boot_bytes > _BOOT_BLOCK_MAX_BYTES:
            self.abandoned_boot_blocks += 1
            self._boot_lines = None
        return True

    def _emit_boot(self, events: list[LogEvent]) -> None:
        if self._boot_lines is not None:
            events.append(BootBlock(self._boot_time, self._boot_lines))
        self._boot_lines = None
        self._boot_has_caps = False

    # -- retraction dedupe

    def _is_duplicate(self, event: Retraction, head: _Head | None) -> bool:
        """Every TP rank prints the same retraction. A copy is a line with the same payload within a few
        seconds from a process that has not yet printed it; a repeat from the same process is a new event."""
        if head is None or head.tp_rank is None:
            return False  # no TP prefix: one process, no copies
        payload = (
            event.retracted_requests,
            event.new_tokens_gained,
            event.mamba_slots_gained,
            event.ratio_before,
            event.ratio_after,
        )
        recent = self._recent.setdefault(event.dp_rank, [])
        now = event.time
        if now is not None and recent:
            recent[:] = [
                entry for entry in recent if entry[0] is None or now - entry[0] <= _DEDUPE_WINDOW_SECONDS
            ]
        for entry_time, entry_payload, printers in recent:
            if entry_payload != payload or head.process in printers:
                continue
            if now is None or entry_time is None or abs(now - entry_time) <= _DEDUPE_WINDOW_SECONDS:
                printers.add(head.process)
                return True
        recent.append((now, payload, {head.process}))
        return False


@dataclass(slots=True)
class DecodeInterval:
    """A `Decode batch` line with the prefill batches its DP rank printed since its previous decode line: the time
    SGLang's `gen throughput` divides by holds both."""

    line: StatsLine
    prefill_batches: int
    prefill_tokens: int
    # A prefill in the interval started from an empty batch (`#running-req: 0`): the server sat idle before it,
    # and that idle time is in the interval's wall time too.
    idle_before: bool = False
    # The previous decode line's batch and KV tokens on this rank (None: not seen): `gen throughput` counts the
    # tokens of every step since it, so the interval's mean batch lies between the two lines'.
    previous_running: int | None = None
    previous_kv_tokens: int | None = None


@dataclass
class LogDigest:
    """What a batch of log events says for the advisor: exact requests, decode intervals, retractions, the last
    boot."""

    request_lengths: list[tuple[int, int]] = field(default_factory=list)  # (prompt, completion) per request
    requests: list[RequestRecord] = field(default_factory=list)
    decode_intervals: list[DecodeInterval] = field(default_factory=list)
    prefill_batches: list[StatsLine] = field(default_factory=list)  # in log order: what the scheduler admitted
    retracted_requests: int = 0
    boot: BootInfo | None = None  # the last boot block in the batch
    errors: list[str] = field(default_factory=list)


def digest(events: Iterable[LogEvent], *, source: str, carry: dict[int | None, list[int]] | None = None) -> LogDigest:
    """Fold parsed events into a LogDigest; a boot block SGLang left incomplete becomes an error, not a raise.
    `carry` keeps each DP rank's decode interval open across calls (a follower's reads cut it anywhere)."""
    out = LogDigest()
    swa_lines = 0
    # dp rank -> [batches, tokens, prefills from an empty batch since its last decode line, that line's batch and
    # KV tokens (-1: none)]
    prefill_since: dict[int | None, list[int]] = carry if carry is not None else {}
    for event in events:
        if isinstance(event, StatsLine):
            swa_lines += event.swa_used_tokens is not None
            pending = prefill_since.setdefault(event.dp_rank, [0, 0, 0, -1, -1])
            if event.kind == "prefill":
                out.prefill_batches.append(event)
                pending[0] += 1
                pending[1] += event.new_tokens or 0
                pending[2] += event.running_requests == 0
            elif event.kind == "decode":
                out.decode_intervals.append(DecodeInterval(
                    event, pending[0], pending[1], pending[2] > 0,
                    previous_running=pending[3] if pending[3] >= 0 else None,
                    previous_kv_tokens=pending[4] if pending[4] >= 0 else None))
                pending[0] = pending[1] = pending[2] = 0
                pending[3] = event.running_requests
                pending[4] = event.kv_used_tokens if event.kv_used_tokens is not None else -1
        elif isinstance(event, RequestRecord):
            out.request_lengths.append((event.prompt_tokens, event.completion_tokens))
            out.requests.append(event)
        elif isinstance(event, Retraction):
            out.retracted_requests += event.retracted_requests
        elif isinstance(event, BootBlock):
            try:
                out.boot = parse_boot_log("\n".join(event.lines), source=f"boot block in {source}")
            except InputError as exc:
                out.errors.append(str(exc))
    if swa_lines:
        out.errors.append(
            f"{source}: {swa_lines} batch lines of an SWA-hybrid model (#swa token): full and sliding-window KV "
            "pools, no Mamba state pool, so --mamba-full-memory-ratio does not apply"
        )
    return out
