"""Property tests over every parser (metrics exposition, boot log, log lines, server_info, config), seeded from
the fixtures and mutated: only our typed errors come out, and time and memory stay bounded.

A short run here; `FUZZ_EXAMPLES=20000 python -m pytest tests/hardening/test_fuzz_parsers.py` (or
`python bench/fuzz.py`) is the long one, see docs/hardening.md.
"""

from __future__ import annotations

import json
import os
import tracemalloc

import pytest
from fuzz_targets import TARGETS, check, seeds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=EXAMPLES <= 60)

JUNK = st.sampled_from([
    "", "{", "}", '"', "\\", "=", ",", " ", "\t", "\r", "\x00", "NaN", "+Inf", "-Inf", "Infinity", "1e400",
    "-1", "0", "18446744073709551617", "nan", "#", "# TYPE ", "le=", '{le="+Inf"}', "é", "\u2028", "[", "]",
    "TP0", "[2026-01-01 00:00:00 TP0]", "#token: ", "max_total_num_tokens=", "server_args=", "ServerArgs(",
    "_bucket", "_sum", "_count", "sglang:", "sglang:num_running_reqs", "tp_rank=", "dp_rank=",
])


@st.composite
def mutated(draw: st.DrawFn, target: str) -> bytes:
    """A seed of `target` with a few line- and character-level mutations (structure-aware enough to get past
    the first check of each parser, random enough to reach the corners)."""
    text = draw(st.sampled_from(seeds(target))).decode("utf-8", errors="replace")
    lines = text.split("\n")
    for _ in range(draw(st.integers(0, 6))):
        if not lines:
            lines = [""]
        at = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "dup", "junk_in_line", "replace_number", "cut_line", "random_line", "swap"]))
        line = lines[at]
        if op == "drop":
            del lines[at]
        elif op == "dup":
            lines.insert(at, line)
        elif op == "junk_in_line":
            pos = draw(st.integers(0, len(line)))
            lines[at] = line[:pos] + draw(JUNK) + line[pos:]
        elif op == "replace_number":
            digits = [i for i, ch in enumerate(line) if ch.isdigit()]
            if digits:
                pos = draw(st.sampled_from(digits))
                lines[at] = line[:pos] + draw(st.sampled_from(["-", "9" * 30, "nan", "1e400", ".", "inf", ""])) + line[pos + 1 :]
        elif op == "cut_line":
            lines[at] = line[: draw(st.integers(0, len(line)))]
        elif op == "random_line":
            lines[at] = draw(st.text(max_size=80))
        else:
            other = draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
    return "\n".join(lines).encode("utf-8", errors="surrogatepass")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)


@st.composite
def mutated_json(draw: st.DrawFn, target: str) -> bytes:
    """A server_info fixture with some fields replaced by arbitrary JSON values (or removed)."""
    body = json.loads(draw(st.sampled_from(seeds(target))))
    keys = sorted(body)
    for _ in range(draw(st.integers(1, 8))):
        key = draw(st.sampled_from(keys))
        if draw(st.booleans()):
            body[key] = draw(JSON_VALUES)
        else:
            body.pop(key, None)
    return json.dumps(body).encode()


@pytest.mark.parametrize("target", ["metrics", "boot_log", "log_lines"])
@FUZZ
@given(data=st.data())
def test_text_parsers_raise_only_typed_errors(target: str, data: st.DataObject) -> None:
    check(target, data.draw(mutated(target)))


@FUZZ
@given(raw=st.one_of(mutated_json("server_info"), st.binary(max_size=200)))
def test_server_info_raises_only_typed_errors(raw: bytes) -> None:
    check("server_info", raw)


CONFIG_TREES = st.dictionaries(
    st.sampled_from(["targets", "interval_seconds", "timeout_seconds", "listen", "checkpoint_path", "state_bias",
                     "half_life_seconds", "server_info_every", "max_series", "time_scale"]) | st.integers(),
    JSON_VALUES | st.lists(st.dictionaries(
        st.sampled_from(["url", "name", "api_key", "api_key_env", "log_paths", "boot_log", "rest_gib",
                         "state_bytes_per_slot", "kv_bytes_per_token"]), JSON_VALUES, max_size=4), max_size=3),
    max_size=6,
)


@FUZZ
@given(tree=CONFIG_TREES)
def test_config_raises_only_typed_errors(tree: dict) -> None:
    from advisor.config import config_from_dict
    from advisor.errors import InputError

    try:
        config_from_dict(tree, {"KEY": "k"})
    except InputError:
        pass


@FUZZ
@given(raw=st.one_of(mutated("config"), st.binary(max_size=300)))
def test_config_text_raises_only_typed_errors(raw: bytes) -> None:
    check("config", raw)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_time_and_memory_stay_linear_on_large_hostile_inputs(target: str) -> None:
    """A 4 MB input of each kind (a seed repeated, then 5 MB of brackets and quotes) parses or is refused using
    a bounded multiple of its size in memory (time per MB is printed by `bench/fuzz.py --scaling`)."""
    base = seeds(target)[0]
    for big in (base * max(1, (4 << 20) // max(1, len(base))), b"{[(\"\\" * (1 << 20)):
        tracemalloc.start()
        try:
            check(target, big)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 40 * len(big) + (16 << 20), f"{target}: peak {peak / 1e6:.0f} MB for {len(big) / 1e6:.1f} MB"


# Inputs the long runs found (kept as plain regression cases; docs/hardening.md lists them).
FOUND = [
    ("log_lines", b"[2026-11-29 14:02:40] Decode batch, #running-req: 63, #full token: 393571, full token usage: 0.90, "
                  b"mamba num: 252, mamba usage: 0.45, cuda graph: True, gen throughput (token/s): .696.94, #queue-req: 7\n"),
    ("log_lines", b"[2026-11-29 14:02:41] Prefill batch, #new-seq: 1, #new-token: 3301, #cached-token: 155, full token "
                  b"usage: ..45, mamba usage: 0.47, #running-req: 65, #queue-req: 7, #pending-token: 17748, cuda graph: "
                  b"False, input throughput (token/s): 14844.06\n"),
]


@pytest.mark.parametrize(("target", "raw"), FOUND)
def test_inputs_found_by_fuzzing(target: str, raw: bytes) -> None:
    check(target, raw)
