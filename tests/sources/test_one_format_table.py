"""One prefix grammar and one format table for both log readers (`bootlog`, `loglines`).

Every format of `formats.LINE_FORMATS` is rendered from its template under every rank prefix SGLang prints
(0.5.23 managers/scheduler.py `configure_scheduler_process` ~6280-6291: DP, PP, ATTN_CP, MOE_DP, TP, EP, and
the DCP/ATTN_DP/CP spellings of other builds) and read by both readers: neither may drop a line the other reads.
"""

from __future__ import annotations

import string

import pytest

from advisor.sources.bootlog import parse_boot_log, split_prefix
from advisor.sources.formats import LINE_FORMATS, PREFIX_RANK_NAMES, line_format
from advisor.sources.loglines import BootBlock, LogLineParser, StatsLine, digest, parse_line

_TEXT = {
    "body": "{'tp_size': 2, 'mamba_full_memory_ratio': 0.9}",
    "label": "",
    "sizes": "KV size: 1.25 GB",
    "dtype": "torch.bfloat16",
    "model_class": "Qwen3NextForCausalLM",
    "elapsed": "elapsed=1.50 s, ",
    "quant": "",
    "intermediate": "",
    "spec": "",
    "raw": "",
    "graph": "True",
    "fold": "False",
}
PREFIXES = [
    "[2026-11-30 10:00:00 DP0 TP0 DCP0]",
    "[2026-11-30 10:00:00 DP0 PP0 ATTN_CP0 MOE_DP0 TP0 EP0]",
    "[2026-11-30 10:00:00.123 ATTN_DP0 CP0 TP0]",
    "2026-11-30 10:00:00 DP0 TP0]",  # a pasted line that lost its `[`
]


def render(name: str) -> str:
    template = line_format(name).template
    values = {}
    for _, field, spec, _ in string.Formatter().parse(template):
        if field is None:
            continue
        if field == "body" and name == "server_args_repr":
            values[field] = "tp_size=2, mamba_full_memory_ratio=0.9"
        elif field in _TEXT:
            values[field] = _TEXT[field]
        else:
            values[field] = 1.5 if spec and spec.endswith("f") else 7
    return template.format(**values)


def test_the_prefix_grammar_names_sglangs_ranks():
    assert PREFIX_RANK_NAMES[:6] == ("DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP")


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("name", [f.name for f in LINE_FORMATS])
def test_every_format_reads_alike_in_both_readers(name, prefix):
    message = render(name)
    line = f"{prefix} {message}"
    rank, text = split_prefix(line)
    assert rank == (0, 0, 0) and text == message.strip()
    parser = LogLineParser()
    events = parser.feed([line])
    assert parser.unparsed_lines == 0, f"the line reader dropped {name} under {prefix!r}"
    if name.startswith(("decode_", "prefill_")):
        assert len(events) == 1 and isinstance(events[0], StatsLine) and events[0].dp_rank == 0
        assert events[0].running_requests == 7 and events[0].queued_requests == 7


def test_a_dcp_prefixed_decode_line_is_read_by_the_line_reader():
    event = parse_line("[2026-11-30 10:00:00 DP0 TP0 DCP0] " + render("decode_hybrid"))
    assert isinstance(event, StatsLine) and (event.kind, event.mamba_used_slots) == ("decode", 7)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_boot_block_from_the_table_reads_the_same_through_both_readers(prefix):
    names = ["server_args_dict", "load_weight_begin", "load_weight_end", "mamba_pool", "replayssm_ring",
             "kv_pool_dtype", "memory_pool_end", "caps", "decode_hybrid"]
    lines = [f"{prefix} {render(name)}" for name in names]
    direct = parse_boot_log("\n".join(lines))
    parser = LogLineParser()
    events = parser.feed(lines) + parser.flush()
    blocks = [e for e in events if isinstance(e, BootBlock)]
    assert len(blocks) == 1 and parser.unparsed_lines == 0
    via_lines = digest(events, source="test").boot
    assert via_lines is not None
    assert (via_lines.state_pool, via_lines.kv_pool, via_lines.max_total_num_tokens) == (
        direct.state_pool, direct.kv_pool, direct.max_total_num_tokens)
    assert direct.state_pool.max_mamba_cache_size == 7 and direct.replayssm_ring_gib == pytest.approx(4.5)
