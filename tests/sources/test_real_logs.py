"""The readers on text real SGLang servers printed (tests/fixtures/real/, each file's source in its README),
first; then on the emulator's version profiles. Every file in tests/fixtures/real/ is read here, or refused
with one line that names why."""

from __future__ import annotations

import pytest
from support import REAL, REPO

from advisor.cli import main
from advisor.errors import InputError
from advisor.model.pools import split_pools
from advisor.model.serving import ServingConfig
from advisor.sim import sglang_logs
from advisor.sim.config import load_server_config
from advisor.sim.emulator import EmulatedServer
from advisor.sim.exposition import scheduler_ranks
from advisor.sim.workload import load_workload
from advisor.sources.bootlog import BootInfo, parse_boot_log, read_boot_log
from advisor.sources.formats import LINE_FORMATS, log_era, parse_server_args
from advisor.sources.loglines import BootBlock, LogLineParser, StatsLine, digest, parse_line
from advisor.sources.metrics import MetricsParseError, parse_metrics
from advisor.sources.server_info import serving_config_from_args

QWEN36_011 = "011-qwen3.6-27b-awq-v0.5.11-rocm-tp2-full.log"
LFM2_021 = "021-lfm2-700m-bench-one-batch-2025-12-29.log"
QWEN35_022 = "022-qwen3.5-9b-tp2-dev11582-2026-04-14-startup.log"

# file -> the words of the one-line refusal `read_boot_log` gives (a log the advisor cannot size pools from)
BOOT_REFUSALS = {
    "001-qwen3next-80b-0.5.2-illegal-mem-decode.log": "no boot block, only batch statistics",
    "003-qwen3next-fp8-deepep-dp-tp-ep-2025-12-26-pr10622.log": "the log ends before the memory pools were allocated",
    "003b-qwen3next-fp8-deepep-dp-tp-ep-2025-12-26-pr10622-pool.log": "no 'Mamba Cache is allocated' line although "
    "the log is a hybrid GDN/Mamba model's",
    "030-swa-hybrid-decode-after-retract-2026-05-24-issue26248.log": "an SWA-hybrid (sliding-window attention) model",
    "080-devstral-24b-awq-v0.5.11-rocm-tp2-nonhybrid.log": "a plain attention model (LlavaForConditionalGeneration) "
    "has no state pool",
}
BOOT_READS = (QWEN36_011, LFM2_021, QWEN35_022)
METRICS_REFUSALS = {
    "100-metrics-llama3-8b-2025-03-15-pr4444.prom": "malformed sample (unclosed labels)",
    "101-metrics-llama3.2-3b-2024-11-03-pr1853.prom": "not a Prometheus sample: '$ curl",
}


def _text(name: str) -> str:
    return (REAL / name).read_text(encoding="utf-8")


def _config_from(boot: BootInfo) -> ServingConfig:
    """The serving config the log itself gives (`recommend --boot-log` uses the same mapping)."""
    return serving_config_from_args(boot.effective_server_args, where="boot log server_args")


def test_every_real_fixture_has_a_test_here() -> None:
    files = {p.name for p in REAL.iterdir() if p.name != "README.md"}
    covered = set(BOOT_REFUSALS) | set(BOOT_READS) | set(METRICS_REFUSALS)
    assert files == covered


# ------------------------------------------------------------------------------------------------ boot logs


def test_0511_full_log_server_args_repr_kv_line_without_dtype_and_the_pools() -> None:
    boot = read_boot_log(REAL / QWEN36_011)
    assert boot.server_args_form == "repr"
    args = boot.server_args
    assert (args["tp_size"], args["mamba_full_memory_ratio"], args["mamba_scheduler_strategy"]) == (2, 0.9, "no_buffer")
    assert (args["kv_cache_dtype"], args["max_running_requests"], args["disable_radix_cache"]) == ("fp8_e4m3", None, False)
    assert args["uvicorn_access_log_exclude_prefixes"] == [] and args["mm_process_config"] == {}
    assert isinstance(args["cuda_graph_bs"], list) and args["cuda_graph_bs"][:3] == [1, 2, 4]
    # `Mamba Cache is allocated. max_mamba_cache_size: 40, conv_state size: 0.11GB, ssm_state size: 5.77GB ` (trailing space)
    assert (boot.state_pool.max_mamba_cache_size, boot.state_pool.conv_gib, boot.state_pool.ssm_gib) == (40, 0.11, 5.77)
    # `KV Cache is allocated. #tokens: 422310, K size: 3.22 GB, V size: 3.22 GB`: no dtype before 0.5.14
    assert (boot.kv_pool.dtype, boot.kv_pool.tokens, boot.kv_pool.kv_gib) == (None, 422310, pytest.approx(6.44))
    assert (boot.max_total_num_tokens, boot.max_running_requests, boot.context_len) == (422310, 13, 262144)
    assert boot.model_class == "Qwen3_5ForConditionalGeneration"
    assert (boot.avail_before_weights_gib, boot.weights_gib, boot.memory_pool_end_avail_gib) == (31.49, 14.49, 4.62)
    assert (boot.tp_ranks_seen, boot.pp_ranks_seen, boot.draft_kv_pool, boot.draft_state_pool) == (2, 1, None, None)
    assert not boot.capped_by_state_pool  # 0.5.11 clamps silently: only the caps line shows it


def test_2026_dev_build_excerpt_without_server_args() -> None:
    boot = read_boot_log(REAL / QWEN35_022)
    assert boot.server_args == {} and boot.server_args_form is None
    assert (boot.state_pool.max_mamba_cache_size, boot.state_pool.conv_gib, boot.state_pool.ssm_gib) == (186, 0.10, 4.38)
    assert (boot.kv_pool.dtype, boot.kv_pool.tokens, boot.kv_pool.kv_gib) == (None, 327310, pytest.approx(5.0))
    assert (boot.max_running_requests, boot.tp_ranks_seen) == (62, 2)
    # where server_args is silent the log speaks: two TP ranks printed, and a KV line without dtype means a
    # release whose `auto` always became no_buffer (0.5.11 server_args.py:1079-1082)
    assert boot.effective_server_args == {"tp_size": 2, "mamba_scheduler_strategy": "no_buffer"}


def test_bench_one_batch_bare_caps_line_and_a_conv_only_state() -> None:
    boot = read_boot_log(REAL / LFM2_021)
    assert boot.model_class == "Lfm2ForCausalLM"
    assert (boot.state_pool.max_mamba_cache_size, boot.state_pool.conv_gib, boot.state_pool.ssm_gib) == (85292, 4.88, 0.0)
    assert (boot.kv_pool.tokens, boot.kv_pool.kv_gib) == (473854, pytest.approx(5.42))
    # `max_total_num_tokens=473854` printed bare by bench_one_batch, no prefix and no other caps
    assert (boot.max_total_num_tokens, boot.max_running_requests, boot.context_len) == (473854, None, None)


@pytest.mark.parametrize(("name", "clamp", "cache_size"), [(QWEN36_011, 13, 40), (QWEN35_022, 62, 186)])
def test_the_logged_clamp_equals_the_models_prediction(name: str, clamp: int, cache_size: int) -> None:
    """max_running_requests = max_mamba_cache_size // S with S = 3 (no_buffer), as kv_cache_configurator.py's
    `_calculate_mamba_ratio` clamp; split_pools, fed the boot's own rest and bytes, must land on it."""
    boot = read_boot_log(REAL / name)
    assert boot.max_running_requests == clamp
    split = split_pools(boot.rest_bytes, _config_from(boot), boot.constants(), model_context_len=boot.context_len or 262144)
    assert split.max_running_requests == clamp
    assert split.clamped_by_state_pool
    # the logged GB figures carry two decimals, so the re-derived pool may be one slot off; the clamp is not
    assert abs(split.max_mamba_cache_size - cache_size) <= 1


@pytest.mark.parametrize(("name", "words"), sorted(BOOT_REFUSALS.items()))
def test_logs_without_usable_pools_are_refused_with_one_line(name: str, words: str) -> None:
    with pytest.raises(InputError) as info:
        read_boot_log(REAL / name)
    message = str(info.value)
    assert words in message and "\n" not in message and message.startswith(str(REAL / name))


def test_recommend_exits_2_on_a_log_that_ends_before_the_pools(capsys: pytest.CaptureFixture[str]) -> None:
    path = REAL / "003-qwen3next-fp8-deepep-dp-tp-ep-2025-12-26-pr10622.log"
    assert main(["recommend", "-L", "50000", "--boot-log", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ends before the memory pools were allocated" in err


def test_the_kv_line_before_the_pools_of_a_dp_tp_ep_server_is_read_per_rank() -> None:
    """003b (DP4 TP4 EP4, Qwen3-Next FP8): its KV lines parse on every rank, the DP rank is taken from the
    `[… DPn TPn EPn]` prefix; the excerpt lacks the Mamba line, so the reader refuses it (above)."""
    text = _text("003b-qwen3next-fp8-deepep-dp-tp-ep-2025-12-26-pr10622-pool.log")
    mamba = "[2025-12-26 23:02:02 DP{d} TP{d} EP{d}] Mamba Cache is allocated. max_mamba_cache_size: 600, conv_state size: 0.50GB, ssm_state size: 9.00GB \n"
    boot = parse_boot_log("".join(mamba.format(d=d) for d in range(4)) + text)
    assert (boot.kv_pool.tokens, boot.kv_pool.kv_gib, boot.kv_pool.dtype) == (2786325, pytest.approx(63.78), None)
    assert (boot.dp_ranks_seen, boot.memory_pool_end_avail_gib) == (4, 34.15)  # DP0's own `Memory pool end`


# ------------------------------------------------------------------------------------------------ runtime lines


def test_the_0511_log_line_by_line() -> None:
    lines = _text(QWEN36_011).splitlines()
    parser = LogLineParser()
    events = parser.feed(lines) + parser.flush()
    stats = [e for e in events if isinstance(e, StatsLine)]
    assert len(stats) == sum(("] Prefill batch, " in line or "] Decode batch, " in line) for line in lines)
    decode = [s for s in stats if s.kind == "decode"]
    assert decode and all(s.mamba_used_slots is not None and s.mamba_used_slots <= 40 for s in decode)
    first = decode[0]
    assert (first.running_requests, first.kv_used_tokens, first.mamba_used_slots, first.mamba_usage) == (1, 89, 2, 0.05)
    prefill = next(s for s in stats if s.kind == "prefill")
    assert (prefill.new_seqs, prefill.new_tokens, prefill.cached_tokens, prefill.mamba_usage) == (1, 80, 0, 0.05)
    (block,) = [e for e in events if isinstance(e, BootBlock)]
    boot = parse_boot_log("\n".join(block.lines))
    assert (boot.state_pool.max_mamba_cache_size, boot.max_running_requests, boot.server_args_form) == (40, 13, "repr")


def test_a_052_decode_line_with_no_mamba_fields_and_a_traceback() -> None:
    lines = _text("001-qwen3next-80b-0.5.2-illegal-mem-decode.log").splitlines()
    parser = LogLineParser()
    events = parser.feed(lines)
    (stats,) = events
    # `Decode batch. #running-req: 11, #token: 159747, token usage: 0.07, …, #queue-req: 0,` (period, trailing comma)
    assert isinstance(stats, StatsLine)
    assert (stats.running_requests, stats.kv_used_tokens, stats.full_token_usage, stats.queued_requests) == (11, 159747, 0.07, 0)
    assert (stats.mamba_used_slots, stats.mamba_usage, stats.gen_throughput) == (None, None, 919.88)
    assert parser.unparsed_lines == len(lines) - 1  # the traceback is counted, never raised


def test_swa_hybrid_lines_are_read_as_swa_not_as_a_mamba_pool() -> None:
    lines = _text("030-swa-hybrid-decode-after-retract-2026-05-24-issue26248.log").splitlines()
    assert not lines[0].startswith("[")  # the pasted line lost its `[`
    parser = LogLineParser()
    stats = parser.feed(lines)
    assert len(stats) == 3 and all(isinstance(s, StatsLine) for s in stats)
    assert {(s.kv_used_tokens, s.swa_used_tokens, s.mamba_used_slots, s.queued_requests) for s in stats} == {  # type: ignore[union-attr]
        (2642688, 14592, None, 3)
    }
    assert stats[0].time == parse_line(lines[1]).time - 1  # type: ignore[union-attr]
    assert parser.unparsed_lines == 1  # the last line, cut inside its prefix
    (note,) = digest(stats, source="030.log").errors
    assert note.startswith("030.log: 3 batch lines of an SWA-hybrid model") and "does not apply" in note
    assert digest(LogLineParser().feed(_text(QWEN36_011).splitlines()), source="011.log").errors == []


def test_dp_tp_ep_prefixes_and_bench_lines_never_raise() -> None:
    for name in ("003-qwen3next-fp8-deepep-dp-tp-ep-2025-12-26-pr10622.log", LFM2_021, QWEN35_022):
        lines = _text(name).splitlines()
        parser = LogLineParser()
        events = parser.feed(lines) + parser.flush()
        assert parser.lines_seen == len(lines)
        blocks = [e for e in events if isinstance(e, BootBlock)]
        if name != LFM2_021 and name != QWEN35_022:
            assert blocks == []
        else:  # the boot block ends at the caps line (bare in bench_one_batch) and reads back
            (block,) = blocks
            assert parse_boot_log("\n".join(block.lines)).kv_pool.tokens in (473854, 327310)


@pytest.mark.parametrize(("name", "words"), sorted(METRICS_REFUSALS.items()))
def test_pasted_metrics_excerpts_are_refused_with_one_line(name: str, words: str) -> None:
    with pytest.raises(MetricsParseError) as info:
        parse_metrics(_text(name))
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_pasted_pre_05_metrics_body_reads_once_the_shell_line_is_dropped() -> None:
    body = _text("101-metrics-llama3.2-3b-2024-11-03-pr1853.prom").split("\n", 1)[1]
    (rank,) = parse_metrics(body).ranks
    assert (rank.kv_capacity_tokens, rank.context_len) == (570979, 131072)


# ------------------------------------------------------------------------------------------------ emulator


def _figures(release: str, **overrides: object) -> sglang_logs.BootFigures:
    values: dict[str, object] = dict(
        model_path="example/hybrid", model_class="Qwen3NextForCausalLM",
        server_args={"model_path": "example/hybrid", "tp_size": 2, "mamba_full_memory_ratio": 0.9,
                     "mamba_scheduler_strategy": "no_buffer", "max_running_requests": None, "cuda_graph_bs": [1, 2]},
        startup_available_gb=31.49, weight_gb=14.49, load_elapsed_s=12.0, max_mamba_cache_size=40,
        state_bytes_per_slot=5.88 * 2**30 / 41, intermediate_bytes=0.0, kv_tokens=422310,
        kv_bytes_per_token=6.44 * 2**30 / 422311, kv_cache_dtype="auto", page_size=1, max_running_requests=13,
        clamped_by_state_pool=True, slots_per_request=3, requested_max_running_requests=None,
        chunked_prefill_size=2048, max_prefill_tokens=16384, context_len=262144, graph_decode_gb=0.13,
        cuda_graph_bs=(1, 2, 4, 8), release=release,
    )  # fmt: skip
    values.update(overrides)
    return sglang_logs.BootFigures(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("release", ["0.5.10", "0.5.11", "0.5.14", "0.5.17", "0.5.20", "0.5.23"])
def test_each_emulated_release_writes_its_eras_formats_and_reads_back(release: str) -> None:
    era = log_era(release)
    text = "\n".join(sglang_logs.boot_block(_figures(release), scheduler_ranks(ServingConfig(tp_size=2)), tp_size=2,
                                           ready_at=1.8e9))  # fmt: skip
    assert ("server_args={'model_path'" in text) == (era.server_args == "dict")
    assert ("server_args=ServerArgs(model_path=" in text) == (era.server_args == "repr")
    assert ("KV Cache is allocated. dtype: " in text) == era.kv_dtype
    assert ("is capped to 13 by the mamba state cache" in text) == era.capped_warning
    boot = parse_boot_log(text)
    assert boot.server_args["cuda_graph_bs"] == [1, 2] and boot.server_args["max_running_requests"] is None
    assert (boot.state_pool.max_mamba_cache_size, boot.kv_pool.tokens, boot.max_running_requests) == (40, 422310, 13)
    assert (boot.kv_pool.dtype is not None) == era.kv_dtype
    assert boot.capped_by_state_pool == era.capped_warning


def test_release_eras_follow_the_format_table() -> None:
    assert (log_era("0.5.11").server_args, log_era("0.5.11").kv_dtype) == ("repr", False)
    assert (log_era("0.5.14").server_args, log_era("0.5.14").kv_dtype) == ("repr", True)
    assert (log_era("0.5.23").server_args, log_era("0.5.23").capped_warning) == ("dict", True)
    assert {f.name for f in LINE_FORMATS} >= {"server_args_repr", "server_args_dict", "kv_pool_plain", "kv_pool_dtype"}


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("server_args=ServerArgs(a=1, b='x, y', c=[1, (2, 3)], d={'k': None}, e=<Enum.X: 1>)",
         {"a": 1, "b": "x, y", "c": [1, (2, 3)], "d": {"k": None}, "e": "<Enum.X: 1>"}),
        ("server_args={'a': True, 'b': {'c': [None, 1.5]}, 'e': 'q\\'uote'}", {"a": True, "b": {"c": [None, 1.5]}, "e": "q'uote"}),
        # a dict cut short (a truncated paste) is read item by item, the cut item kept as text
        ("server_args={'a': 1, 'b': [1, 2", {"a": 1, "b": "[1, 2"}),
        ("server_args={" + "[" * 5000, {}),  # deeper than the parser allows: no item, and no raise
        ("server_args=" + "[" * 5000, None),
        ("no args here", None),
    ],
    ids=["repr", "dict", "cut-dict", "deep-dict", "neither", "none"],
)  # fmt: skip
def test_server_args_are_parsed_as_literals_never_evaluated(message: str, expected: object) -> None:
    assert parse_server_args(message) == expected


@pytest.mark.parametrize(("profile", "log_release"), [("0.5.10", None), ("0.5.23", "0.5.14"), ("0.5.23", None)])
def test_the_emulated_server_boot_log_reads_back_in_every_era(tmp_path, profile: str, log_release: str | None) -> None:
    """The emulator's whole boot log (written on start, before the server answers) in each era's formats."""
    log = tmp_path / "server.log"
    config = load_server_config("single-qwen3next")
    with EmulatedServer(config, load_workload("steady-chat"), speed=1.0, log_path=str(log), version_profile=profile,
                        log_release=log_release):  # fmt: skip
        text = log.read_text()
    era = log_era(log_release or profile)
    boot = parse_boot_log(text)
    assert boot.server_args_form == era.server_args
    assert (boot.kv_pool.dtype is not None) == era.kv_dtype
    split = config.split()
    assert (boot.state_pool.max_mamba_cache_size, boot.kv_pool.tokens) == (split.max_mamba_cache_size, split.kv_capacity_tokens)
    assert boot.max_running_requests == split.max_running_requests
    assert boot.server_args["mamba_full_memory_ratio"] == config.serving.mamba_full_memory_ratio


def test_the_releases_page_lists_every_format_of_the_table() -> None:
    page = (REPO / "docs" / "sglang-releases.md").read_text(encoding="utf-8")
    assert [f.name for f in LINE_FORMATS if f"`{f.name}`" not in page] == []
