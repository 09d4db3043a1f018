"""Every SGLang log-line format the advisor reads, with the releases that print it, and the linear-time
helpers both the readers (`bootlog`, `loglines`) and the emulator's writers (`sim.sglang_logs`) use.

One table (`LINE_FORMATS`): a format's `template` is what the emulator writes (`str.format` fields) and its
`marker` is what the readers look for; the line reader's fast-path patterns are compiled from the templates
(`template_pattern`). One prefix grammar (`PREFIX_RANK_NAMES`, `prefix_ranks`, `prefix_close`) for the
`[time DPn PPn TPn …]` head both readers split off. No regex here searches with backtracking: fields are found
with `str.find` / `str.partition`, and the compiled templates are anchored literals with bounded classes, so a
pathological line costs time linear in its length.
"""

from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass

# ------------------------------------------------------------------------------------------------ releases


def release_key(release: str) -> tuple[int, ...]:
    """`0.5.6.post2` -> (0, 5, 6, 2). A source build reports `0.0.0.devN`, which says nothing of its era
    (the 2026-04 build in tests/fixtures/real/022 still wrote the KV line without `dtype:`): it sorts first."""
    head, _, post = release.lstrip("v").partition(".post")
    head = head.partition(".dev")[0]
    parts = [int(p) if p.isdigit() else 0 for p in head.split(".")[:3]]
    parts += [0] * (3 - len(parts))
    return (*parts, int(post) if post.isdigit() else 0)


@dataclass(frozen=True)
class LineFormat:
    """One line SGLang prints, in the releases `first`..`last` (None: open-ended / not checked earlier)."""

    name: str
    marker: str  # the fixed text a reader dispatches on
    template: str  # what the emulator writes (str.format fields)
    first: str | None
    last: str | None
    source: str  # the SGLang file that prints it (in the newest release that does)
    note: str = ""

    def covers(self, release: str) -> bool:
        key = release_key(release)
        return (self.first is None or release_key(self.first) <= key) and (
            self.last is None or key <= release_key(self.last)
        )


# Releases checked by reading their wheels: 0.5.2, 0.5.4, 0.5.6.post2, 0.5.11, 0.5.14, 0.5.17, 0.5.20, 0.5.23,
# plus the real logs in tests/fixtures/real/. A change between two checked releases is dated by the later one
# (`first`) and the earlier one (`last` of the old form); docs/sglang-releases.md says so. The readers accept
# every form whatever the release, so a boundary that is off by a release costs nothing when reading.
LINE_FORMATS: tuple[LineFormat, ...] = (
    LineFormat(
        "server_args_repr",
        "server_args=ServerArgs(",
        "server_args=ServerArgs({body})",
        None,
        "0.5.17",
        "entrypoints/engine.py (logger.info(f'{server_args=}'))",
        "dataclass repr: name=repr(value), ...",
    ),
    LineFormat(
        "server_args_dict",
        "server_args={",
        "server_args={body}",
        "0.5.20",
        None,
        "entrypoints/engine.py (_server_args_for_logging -> ServerArgs.resolved_dict())",
        "a Python dict repr: None/True/False, nested dicts and lists",
    ),
    LineFormat(
        "load_weight_begin",
        "Load weight begin.",
        "Load weight begin. avail mem={avail:.2f} GB",
        None,
        None,
        "model_executor/model_runner.py",
    ),
    LineFormat(
        "load_weight_end",
        "Load weight end.",
        "Load weight end. {elapsed}type={model_class}, {quant}avail mem={avail:.2f} GB, mem usage={usage:.2f} GB.",
        None,
        None,
        "model_executor/model_runner.py",
        "`elapsed=… s, ` and `quant=…, bits=…, ` in later releases; 0.5.6.post2 printed `dtype=…` after the type",
    ),
    LineFormat(
        "mamba_pool_unsized",
        "Mamba Cache is allocated.",
        "Mamba Cache is allocated. conv_state size: {conv:.2f}GB, ssm_state size: {ssm:.2f}GB ",
        None,
        "0.5.2",
        "mem_cache/memory_pool.py (MambaPool)",
        "no max_mamba_cache_size: the state pool had max_running_requests slots",
    ),
    LineFormat(
        "mamba_pool",
        "Mamba Cache is allocated.",
        "Mamba Cache is allocated. max_mamba_cache_size: {size}, conv_state size: {conv:.2f}GB, "
        "ssm_state size: {ssm:.2f}GB {intermediate}",
        "0.5.4",
        None,
        "mem_cache/memory_pool.py (MambaPool)",
        "trailing space; speculative decoding adds `intermediate_ssm_state_cache size: …GB "
        "intermediate_conv_window_cache size: …GB ` without commas",
    ),
    LineFormat(
        "replayssm_ring",
        "GDN ReplaySSM ring buffers allocated",
        "GDN ReplaySSM ring buffers allocated (record_len={record_len}, fold={fold}): d={d:.3f}GB, k={k:.3f}GB, "
        "g={g:.3f}GB {raw}",
        "0.5.23",
        None,
        "mem_cache/memory_pool.py (MambaPool, ~1010-1028)",
        "KDA adds `rawv=…GB, rawk=…GB, beta=…GB `; GDN spec rings hold mrr // attn_dp + 1 requests, KDA's every "
        "slot (size + 1)",
    ),
    LineFormat(
        "kv_pool_plain",
        "KV Cache is allocated.",
        "{label}KV Cache is allocated. #tokens: {tokens}, {sizes}",
        None,
        "0.5.11",
        "mem_cache/memory_pool.py (KVCache._finalize_allocation_log)",
        "no dtype; sizes: `K size: x GB, V size: y GB` or `KV size: z GB`",
    ),
    LineFormat(
        "kv_pool_dtype",
        "KV Cache is allocated.",
        "{label}KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, {sizes}",
        "0.5.14",
        None,
        "mem_cache/memory_pool.py (KVCache._finalize_allocation_log)",
        "`KV Cache VA upper bound.` instead of `is allocated.` under post-capture sizing (0.5.20+); an optional "
        "allocation label (which may hold spaces) precedes `KV Cache`",
    ),
    LineFormat(
        "kv_post_capture",
        "Post-capture KV sizing: KV cache allocated.",
        "Post-capture KV sizing: KV cache allocated. dtype: {dtype}, #tokens: {tokens}, KV size: {kv:.2f} GB, "
        "avail mem={avail:.2f} GB",
        "0.5.17",
        None,
        "model_executor/model_runner_components/kv_pool_runtime.py",
        "the KV pool as resized after CUDA-graph capture; supersedes the `VA upper bound` line",
    ),
    LineFormat(
        "kv_post_capture_draft",
        "Post-capture KV sizing: draft KV cache allocated.",
        "Post-capture KV sizing: draft KV cache allocated. dtype: {dtype}, #tokens: {tokens}, KV size: {kv:.2f} GB",
        "0.5.20",
        None,
        "model_executor/model_runner_components/kv_pool_runtime.py",
    ),
    LineFormat(
        "swa_pool",
        "Use sliding window memory pool",
        "Use sliding window memory pool. full_layer_tokens={full}, swa_layer_tokens={swa}",
        None,
        None,
        "model_executor/pool_configurator.py",
        "an SWA-hybrid attention model (full + sliding-window KV pools), not a Mamba hybrid",
    ),
    LineFormat(
        "memory_pool_end",
        "Memory pool end.",
        "Memory pool end. avail mem={avail:.2f} GB",
        None,
        None,
        "model_executor/model_runner.py",
    ),
    LineFormat(
        "capped_by_state_pool",
        "max_running_requests is capped to ",
        "max_running_requests is capped to {cap} by the mamba state cache (max_mamba_cache_size={size}, "
        "{slots} state slots per request). To raise it: increase --mamba-full-memory-ratio or "
        "--max-mamba-cache-size, or halve the state size with --mamba-ssm-dtype bfloat16.",
        "0.5.20",
        None,
        "mem_cache/kv_cache_configurator.py",
        "earlier releases clamp silently (real 0.5.11 and 2026-04 logs show the clamp only in the caps line)",
    ),
    LineFormat(
        "caps",
        "max_total_num_tokens=",
        "max_total_num_tokens={tokens}, chunked_prefill_size={chunk}, max_prefill_tokens={prefill}, "
        "max_running_requests={mrr}, context_len={ctx}, available_gpu_mem={avail:.2f} GB",
        None,
        None,
        "managers/scheduler.py (TP0 of each DP replica)",
        "`available_cpu_mem` on CPU",
    ),
    LineFormat(
        "caps_bench_one_batch",
        "max_total_num_tokens=",
        "max_total_num_tokens={tokens}",
        None,
        None,
        "bench_one_batch.py (print, no prefix; real/021 from 0.5.6.post2)",
    ),
    LineFormat(
        "decode_hybrid",
        "Decode batch",
        "Decode batch, #running-req: {running}, #full token: {used}, full token usage: {usage:.2f}, "
        "mamba num: {mamba}, mamba usage: {mamba_usage:.2f}, {spec}cuda graph: {graph}, "
        "gen throughput (token/s): {throughput:.2f}, #queue-req: {queued}",
        "0.5.4",
        None,
        "managers/scheduler_components/metrics_reporter.py",
        "`accept len: …, accept rate: …, ` with speculative decoding; 0.5.23 may write `Decode batch [n],`",
    ),
    LineFormat(
        "prefill_hybrid",
        "Prefill batch",
        "Prefill batch, #new-seq: {new_seqs}, #new-token: {new_tokens}, #cached-token: {cached}, "
        "full token usage: {usage:.2f}, mamba usage: {mamba_usage:.2f}, #running-req: {running}, "
        "#queue-req: {queued}, #pending-token: {pending}, cuda graph: {graph}, input throughput (token/s): {throughput:.2f}",
        "0.5.4",
        None,
        "managers/scheduler_components/metrics_reporter.py",
        "0.5.23 may write `Prefill batch [n],` (LOG_FORWARD_ITERS)",
    ),
    LineFormat(
        "decode_swa",
        "Decode batch",
        "Decode batch, #running-req: {running}, #full token: {used}, full token usage: {usage:.2f}, "
        "#swa token: {swa}, swa token usage: {swa_usage:.2f}, cuda graph: {graph}, "
        "gen throughput (token/s): {throughput:.2f}, #queue-req: {queued}",
        None,
        None,
        "managers/scheduler_components/metrics_reporter.py",
        "SWA-hybrid attention, no Mamba pool",
    ),
    LineFormat(
        "decode_plain",
        "Decode batch",
        "Decode batch. #running-req: {running}, #token: {used}, token usage: {usage:.2f}, cuda graph: {graph}, "
        "gen throughput (token/s): {throughput:.2f}, #queue-req: {queued}, ",
        None,
        None,
        "managers/scheduler_metrics_mixin.py",
        "0.5.2 wrote `Decode batch.` with a trailing `, `; hybrid models then had no mamba fields",
    ),
)

FORMATS_BY_NAME = {f.name: f for f in LINE_FORMATS}


def line_format(name: str) -> LineFormat:
    return FORMATS_BY_NAME[name]


# ------------------------------------------------------------------------------------------------ templates

_FIELD_PATTERNS = {"d": r"(\d+)", "f": r"(\d+\.\d+)"}


def template_pattern(name: str, *, fixed: dict[str, str] | None = None, choices: dict[str, str] | None = None) -> re.Pattern[str]:
    """A format's template as an anchored pattern: literal text escaped, each `{field:.2f}` a float group, each
    other field an integer group, in template order. `fixed` fills a field with literal text (`spec=""`: no
    speculative part); `choices` gives a field a non-capturing alternative (`graph="True|False"`)."""
    fixed = fixed or {}
    choices = choices or {}
    parts: list[str] = []
    for literal, field_name, spec, _ in string.Formatter().parse(line_format(name).template):
        parts.append(re.escape(literal))
        if field_name is None:
            continue
        if field_name in fixed:
            parts.append(re.escape(fixed[field_name]))
        elif field_name in choices:
            parts.append(f"(?:{choices[field_name]})")
        else:
            parts.append(_FIELD_PATTERNS["f" if spec and spec.endswith("f") else "d"])
    return re.compile("".join(parts))


# ------------------------------------------------------------------------------------------------ prefix

# The rank names of the `[YYYY-MM-DD HH:MM:SS(.fff) DPn PPn ATTN_CPn MOE_DPn TPn EPn]` head, in SGLang's order
# (0.5.23 managers/scheduler.py `configure_scheduler_process` ~6280-6291), plus the spellings other builds and
# launchers print (ATTN_DP, CP, DCP). Both readers accept exactly these.
PREFIX_RANK_NAMES = ("DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP", "ATTN_DP", "CP", "DCP")
_PREFIX_RANK_SET = frozenset(PREFIX_RANK_NAMES)
# How far the closing `]` may be from the line's start.
PREFIX_MAX_LENGTH = 120


def prefix_ranks(text: str) -> dict[str, int] | None:
    """`DP1 PP0 TP4 EP4` (any subset of PREFIX_RANK_NAMES) -> {"DP": 1, ...}; None when a token is not a known
    name followed by digits. An empty text is no ranks ({})."""
    ranks: dict[str, int] = {}
    for token in text.split():
        name = token.rstrip("0123456789")
        if name not in _PREFIX_RANK_SET or len(name) == len(token):
            return None
        ranks[name] = int(token[len(name) :])
    return ranks


def looks_like_stamp(text: str) -> bool:
    """`YYYY-MM-DD HH:MM:SS` (or with `T`) at the start of `text`, by shape only."""
    return (
        len(text) >= 19
        and text[4] == "-"
        and text[7] == "-"
        and text[10] in " T"
        and text[13] == ":"
        and text[16] == ":"
        and text[:4].isdigit()
        and text[5:7].isdigit()
        and text[8:10].isdigit()
    )


def prefix_close(line: str) -> int:
    """Where the head of a prefixed line ends (the index of its `]`), or -1 when the line has no SGLang head.
    A line that lost its leading `[` (pasted logs, tests/fixtures/real/030) still has one."""
    start = 1 if line.startswith("[") else 0
    if not looks_like_stamp(line[start : start + 19]):
        return -1
    return line.find("]", start + 19, start + PREFIX_MAX_LENGTH)


# Not a line but a behaviour the readers must know the era of: up to 0.5.11 `--mamba-scheduler-strategy auto`
# always became no_buffer (0.5.11 server_args.py:1079-1082, "TODO: when extra_buffer is more verified");
# from 0.5.14 it becomes extra_buffer when overlap or paging is on and the model supports it (0.5.14
# server_args.py:4385-4391, later arg_groups/overrides.py). A log whose KV line has no `dtype:` is <= 0.5.11.
AUTO_STRATEGY_NO_BUFFER_LAST = "0.5.11"
AUTO_STRATEGY_BEFORE_KV_DTYPE = "no_buffer"


# Log eras the emulator writes (version profile -> how its boot block reads).
@dataclass(frozen=True)
class LogEra:
    server_args: str  # 'repr' | 'dict'
    kv_dtype: bool  # the KV line carries `dtype:`
    capped_warning: bool  # the `max_running_requests is capped to …` warning exists


def log_era(release: str) -> LogEra:
    key = release_key(release)
    dict_args = key >= release_key(line_format("server_args_dict").first or "0")
    return LogEra(
        server_args="dict" if dict_args else "repr",
        kv_dtype=key >= release_key(line_format("kv_pool_dtype").first or "0"),
        capped_warning=key >= release_key(line_format("capped_by_state_pool").first or "0"),
    )


# ------------------------------------------------------------------------------------------------ fields

_NUMBER_CHARS = frozenset("0123456789.-+eE")


def number_after(text: str, key: str, start: int = 0) -> str | None:
    """The number that follows the first `key` at or after `start` (spaces skipped), as text; None if the
    key is absent or no digits follow. Linear: one find, one forward scan."""
    at = text.find(key, start)
    if at < 0:
        return None
    i = at + len(key)
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    j = i
    while j < n and text[j] in _NUMBER_CHARS:
        j += 1
    if j == i or not any(c.isdigit() for c in text[i:j]):
        return None
    return text[i:j]


def int_after(text: str, key: str, start: int = 0) -> int | None:
    raw = number_after(text, key, start)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def float_after(text: str, key: str, start: int = 0) -> float | None:
    raw = number_after(text, key, start)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def word_after(text: str, key: str, start: int = 0) -> str | None:
    """The text after `key` up to the next `,` or space."""
    at = text.find(key, start)
    if at < 0:
        return None
    i = at + len(key)
    end = i
    n = len(text)
    while end < n and text[end] not in ", ":
        end += 1
    return text[i:end] or None


# ------------------------------------------------------------------------------------------------ server_args

# An 18 KB dict is what 0.5.23 logs; anything far larger is not a server_args line we can trust, and is
# read item by item instead of handed whole to the Python parser.
_LITERAL_LIMIT = 256 * 1024
_VALUE_LIMIT = 16 * 1024
_OPENERS = {"(": ")", "[": "]", "{": "}"}


def _safe_literal(text: str) -> object:
    """ast.literal_eval (never eval) with a size guard; raises ValueError on anything it cannot read."""
    if len(text) > _LITERAL_LIMIT:
        raise ValueError("too large")
    try:
        return ast.literal_eval(text)
    except (SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise ValueError(str(exc)) from None


def _top_level_items(body: str) -> list[str]:
    """Split `body` at commas outside quotes and brackets. One pass over the characters."""
    items: list[str] = []
    depth: list[str] = []
    quote = ""
    start = 0
    i = 0
    n = len(body)
    while i < n:
        c = body[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in _OPENERS:
            depth.append(_OPENERS[c])
        elif depth and c == depth[-1]:
            depth.pop()
        elif c == "," and not depth:
            items.append(body[start:i])
            start = i + 1
        i += 1
    items.append(body[start:])
    return items


def _value(raw: str) -> object:
    raw = raw.strip()
    if len(raw) > _VALUE_LIMIT:
        return raw
    try:
        return _safe_literal(raw)
    except ValueError:
        return raw  # a repr that is not a literal (an enum, a function): keep its text


def parse_server_args(message: str) -> dict[str, object] | None:
    """The fields of a `server_args=ServerArgs(...)` (up to 0.5.17 at least) or `server_args={...}` (0.5.23)
    message; None when the message is neither. Values are Python literals where they are literals, their
    text otherwise. Never evaluates code."""
    at = message.find("server_args=")
    if at < 0:
        return None
    body = message[at + len("server_args=") :].rstrip()
    if body.startswith("{"):
        try:
            whole = _safe_literal(body)
        except ValueError:
            whole = None
        if isinstance(whole, dict):
            return {str(k): v for k, v in whole.items()}
        inner = body[1:-1] if body.endswith("}") else body[1:]
        out: dict[str, object] = {}
        for item in _top_level_items(inner):
            key, sep, value = item.partition(":")
            key = key.strip()
            if sep and len(key) >= 2 and key[0] == key[-1] and key[0] in "'\"":
                out[key[1:-1]] = _value(value)
        return out
    if body.startswith("ServerArgs("):
        inner = body[len("ServerArgs(") :]
        inner = inner[:-1] if inner.endswith(")") else inner
        out = {}
        for item in _top_level_items(inner):
            key, sep, value = item.partition("=")
            key = key.strip()
            if sep and key.isidentifier():
                out[key] = _value(value)
        return out
    return None


def server_args_repr(fields: dict[str, object]) -> str:
    """The body of the 0.5.17-and-earlier form `ServerArgs(name=repr(value), ...)`."""
    return ", ".join(f"{k}={v!r}" for k, v in fields.items())


def server_args_dict(fields: dict[str, object]) -> str:
    """The 0.5.20+ form: the dict's Python repr (ServerArgs.resolved_dict())."""
    return repr(dict(fields))
