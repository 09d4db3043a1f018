"""Differential check: SGLang 0.5.23's own pool-sizing functions against the advisor's, row by row.

Runs outside the test suite, in a venv where SGLang's code imports on CPU:

    ../shared/tools/make-sglang-venv.sh /tmp/sglang-venv            # once, a few minutes
    /tmp/sglang-venv/bin/python tools/sglang_differential.py         # prints the table, exit 1 on a mismatch
    /tmp/sglang-venv/bin/python tools/sglang_differential.py --write-fixtures tests/fixtures/sizing

SGLang side, per configuration: its config class gives `mamba2_cache_params` (`mamba_cache_per_req`,
`replayssm_ring_bytes_per_req`); `KVCacheConfigurator._handle_max_mamba_cache`, `_calculate_mamba_ratio` and
`resolve_max_num_reqs` run unchanged on a stub configurator whose runtime-context bags hold the flags
(`mem_cache/kv_cache_configurator.py`); `DefaultPoolConfigurator.calculate_pool_sizes` cuts the KV tokens
(`model_executor/pool_configurator.py`), PP stages keep the smallest count (`_apply_token_constraints`).
Advisor side: `model_bytes` / `replayssm_ring_bytes_per_request` and `split_pools`. Then the round trip: the
boot log SGLang would print for that split (its log templates, `mem_cache/memory_pool.py`, `managers/
scheduler.py`) is read back by `parse_boot_log` and re-predicted at the live ratio, and the `/server_info`
body is inverted. `--write-fixtures` writes those logs and bodies (with a truth file) for the tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
HF = REPO / "tests" / "model" / "data" / "hf_configs"
GIB = 1 << 30

# --- SGLang side -----------------------------------------------------------------------------------------


def _ns(**kw):
    return types.SimpleNamespace(**kw)


@dataclass
class Case:
    name: str
    config_file: str
    tp: int = 4
    pp: int = 1
    attn_dp: int = 1
    dcp: int = 1
    page: int = 1
    ratio: float = 0.9
    strategy: str = "extra_buffer"  # the strategy SGLang resolved (auto is resolved before sizing)
    overlap: bool = True
    skip_decode_lock: bool = False
    radix_off: bool = False
    spec_draft_tokens: int = 0
    draft_layers: int = 1
    replayssm: bool = False
    pinned: int | None = None
    mrr: int | None = None  # the user's --max-running-requests
    unified: bool = False
    pd_prefill: bool = False
    rest_gib: float = 60.0
    context_len: int = 262144
    notes: list[str] = field(default_factory=list)

    @property
    def spec(self) -> bool:
        return self.spec_draft_tokens > 0

    @property
    def resolved_mrr(self) -> int | None:
        """What SGLang's arg hooks leave in max_running_requests before sizing: spec without a user value -> 48
        (arg_groups/speculative_hook.py ~1086-1095)."""
        if self.mrr is not None:
            return self.mrr
        return 48 if self.spec else None


def _sglang_config(case: Case):
    """SGLang's own config object for the case's model, its parallel reads stubbed to the case's attention TP."""
    import sglang.srt.configs.falcon_h1 as falcon_h1
    import sglang.srt.configs.granitemoehybrid as granite
    import sglang.srt.configs.kimi_linear as kimi
    import sglang.srt.configs.nemotron_h as nemotron
    import sglang.srt.configs.qwen3_next as qwen3_next
    from sglang.srt.configs import (
        FalconH1Config,
        GraniteMoeHybridConfig,
        KimiLinearConfig,
        NemotronHConfig,
        Qwen3NextConfig,
    )

    attn_tp = case.tp // case.attn_dp
    parallel = _ns(attn_tp_size=attn_tp, tp_size=case.tp, attn_dp_size=case.attn_dp)
    for module in (falcon_h1, granite, kimi, nemotron, qwen3_next):
        module.get_parallel = lambda parallel=parallel: parallel
    qwen3_next.linear_attn_tp_size = lambda: attn_tp
    qwen3_next._is_cpu = False
    raw = json.loads((HF / case.config_file).read_text())
    classes = {
        "Qwen3NextForCausalLM": Qwen3NextConfig,
        "KimiLinearForCausalLM": KimiLinearConfig,
        "NemotronHForCausalLM": NemotronHConfig,
        "FalconH1ForCausalLM": FalconH1Config,
        "GraniteMoeHybridForCausalLM": GraniteMoeHybridConfig,
    }
    return raw, classes[raw["architectures"][0]](**raw)


def _stage_cells(case: Case, raw: dict, advisor_bytes) -> list[tuple[int, int]]:
    """KV bytes per physical row on each PP stage (pool_configurator.py DefaultPoolConfigurator: the stage's
    full-attention layers x per-layer row; + int(cell x draft_layers / layers) for an EAGLE/MTP draft)."""
    from sglang.srt.distributed.utils import get_pp_indices

    from advisor.model.state_shapes import _ARCHITECTURES, _Fields

    reader, nested = _ARCHITECTURES[raw["architectures"][0]]
    layout = reader(_Fields(raw, raw["architectures"][0]), case.tp // case.attn_dp)
    per_layer = advisor_bytes.kv_bytes_per_token // max(advisor_bytes.kv_row_attention_layers or 1, 1)
    cells = []
    for rank in range(case.pp):
        start, end = get_pp_indices(layout.num_layers, rank, case.pp) if case.pp > 1 else (0, layout.num_layers)
        layers = sum(1 for i in layout.attention_ids if start <= i < end)
        cell = per_layer * layers
        draft = int(cell * case.draft_layers / layers) if case.spec and layers else 0
        cells.append((cell, draft))
    return cells


@dataclass
class SglangResult:
    max_mamba_cache_size: int
    kv_tokens: int
    max_running_requests: int
    per_req: int
    stage_per_req: int
    ring_per_req: int  # charged (the largest stage's share)
    ring_full_per_req: int
    conv_bytes_per_slot: int
    ssm_bytes_per_slot: int
    stage_layers: list[int]
    stage_cells: list[tuple[int, int]]  # (target, draft) KV bytes per row on each stage
    kv_rest_gib: float


def run_sglang(case: Case, advisor_bytes) -> SglangResult:
    import sglang.srt.mem_cache.kv_cache_configurator as kvc
    from sglang.srt.distributed.utils import get_pp_indices
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    raw, config = _sglang_config(case)
    params = config.mamba2_cache_params
    os.environ["SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK"] = "1" if case.skip_decode_lock else "0"
    extra = case.strategy in ("extra_buffer", "extra_buffer_lazy") and not case.radix_off
    schedule = _ns(
        max_mamba_cache_size=case.pinned, mamba_full_memory_ratio=case.ratio, max_running_requests=case.resolved_mrr,
        disable_overlap_schedule=not case.overlap, max_total_tokens=None, page_size=case.page,
    )
    mamba = _ns(
        enable_mamba_extra_buffer=extra, enable_mamba_extra_buffer_lazy=case.strategy == "extra_buffer_lazy",
        enable_linear_replayssm_spec=case.replayssm, linear_replayssm_cache_len=16,
    )

    def override(source, **fields):
        for name, value in fields.items():
            setattr(schedule, name, value)

    kvc.get_schedule = lambda: schedule
    kvc.get_exec = lambda: _ns(mamba=mamba)
    kvc.get_memory = lambda: _ns(disable_radix_cache=case.radix_off, enable_unified_memory=case.unified)
    kvc.get_spec = lambda: _ns(speculative_num_draft_tokens=case.spec_draft_tokens if case.spec else None)
    kvc.get_context = lambda: _ns(override=override)
    kvc.get_disagg = lambda: _ns(disaggregation_mode="prefill" if case.pd_prefill else "null",
                                 enable_pd_role_switch=False)
    kvc.get_parallel = lambda: _ns(pp_size=case.pp)
    family_kda = raw["architectures"][0] == "KimiLinearForCausalLM"
    family_gdn = raw["architectures"][0] == "Qwen3NextForCausalLM"
    stub = _ns(
        mambaish_config=config, pp_size=case.pp, attn_dp_size=case.attn_dp,
        model_config=_ns(num_hidden_layers=config.num_hidden_layers, context_len=case.context_len),
        fused_entry_bytes=lambda name: None,
        spec_algorithm=_ns(is_none=lambda: not case.spec),
        hybrid_gdn_config=config if family_gdn else None, hybrid_kda_config=config if family_kda else None,
        extra_mamba_cache_bytes_per_req=0,
    )
    stub._calculate_mamba_ratio = lambda: kvc.KVCacheConfigurator._calculate_mamba_ratio(stub)
    kv_rest_gib = kvc.KVCacheConfigurator._handle_max_mamba_cache(stub, case.rest_gib)
    cells = _stage_cells(case, raw, advisor_bytes)
    tokens = []
    for target, draft in cells:
        cell = target + draft
        pool = _ns(_fixed_overhead_bytes=0, _cell_size=cell, _zero_kv_max_tokens=2**63 - 1)
        if cell:
            tokens.append(DefaultPoolConfigurator.calculate_pool_sizes(pool, int(kv_rest_gib * GIB), case.page)
                          .max_total_num_tokens)
    kv_tokens = min(tokens)  # _apply_token_constraints: the PP all-reduce MIN
    clamp = kvc.KVCacheConfigurator.resolve_max_num_reqs(stub, kv_tokens)
    layers = list(params.layers)
    if case.pp > 1:
        bounds = [get_pp_indices(config.num_hidden_layers, rank, case.pp) for rank in range(case.pp)]
        stage_layers = [sum(1 for i in layers if s <= i < e) for s, e in bounds]
    else:
        stage_layers = [len(layers)]
    scale = max(stage_layers) / max(len(layers), 1)
    conv = int(sum(math.prod(shape) for shape in params.shape.conv)) * params.dtype.conv.itemsize
    ssm = int(math.prod(params.shape.temporal)) * params.dtype.temporal.itemsize
    ring = params.replayssm_ring_bytes_per_req(record_len=16) if case.replayssm else 0
    return SglangResult(
        schedule.max_mamba_cache_size, kv_tokens, clamp, params.mamba_cache_per_req,
        int(params.mamba_cache_per_req * scale), int(ring * scale), ring, conv, ssm, stage_layers, cells, kv_rest_gib,
    )


# --- advisor side ----------------------------------------------------------------------------------------


def advisor_inputs(case: Case):
    from advisor.model.pools import ByteConstants
    from advisor.model.serving import ServingConfig
    from advisor.model.state_shapes import (
        eagle_draft_kv_bytes_per_token,
        linear_family_of,
        model_bytes,
        replayssm_ring_bytes_per_request,
    )

    raw = json.loads((HF / case.config_file).read_text())
    architecture = raw["architectures"][0]
    attn_tp = case.tp // case.attn_dp
    derived = model_bytes(raw, tp_size=attn_tp, pp_size=case.pp, dcp_size=case.dcp)
    serving = ServingConfig(
        strategy="no_buffer" if case.strategy == "no_buffer" else case.strategy,
        disable_radix_cache=case.radix_off, disable_overlap_schedule=not case.overlap, pp_size=case.pp,
        tp_size=case.tp, dp_size=case.attn_dp, attn_dp_size=case.attn_dp, dcp_size=case.dcp, page_size=case.page,
        skip_decode_lock=case.skip_decode_lock, speculative_algorithm="EAGLE" if case.spec else None,
        draft_tokens=case.spec_draft_tokens, replayssm=case.replayssm, mamba_full_memory_ratio=case.ratio,
        max_mamba_cache_size=case.pinned, max_running_requests=case.mrr, unified_memory=case.unified,
        linear_family=linear_family_of(architecture), disaggregation_mode="prefill" if case.pd_prefill else "null",
    )
    ring = 0.0
    if case.replayssm:
        ring = float(replayssm_ring_bytes_per_request(raw, tp_size=attn_tp)) * derived.pp_state_share
        ring = float(int(ring))
    constants = ByteConstants(
        float(derived.state_bytes_per_slot), float(derived.kv_bytes_per_token),
        draft_kv_bytes_per_token=float(eagle_draft_kv_bytes_per_token(derived, case.draft_layers)) if case.spec else 0.0,
        replayssm_ring_bytes_per_request=ring,
    )
    return raw, derived, serving, constants


# --- the round trip: SGLang's log lines and /server_info, read back ---------------------------------------


def boot_log(case: Case, sg: SglangResult, raw: dict) -> str:
    """The boot block SGLang 0.5.23 prints for this split, one TP0 rank per PP stage (templates of
    mem_cache/memory_pool.py MambaPool ~996-1028 and KVCache._finalize_allocation_log, managers/scheduler.py
    ~1267-1276, kv_cache_configurator.py resolve_max_num_reqs' capped warning)."""
    args = {
        "model_path": f"/models/{case.config_file.removesuffix('.json')}", "tp_size": case.tp, "pp_size": case.pp,
        "dp_size": 1, "attn_dp_size": case.attn_dp, "enable_dp_attention": case.attn_dp > 1, "page_size": case.page,
        "mamba_full_memory_ratio": case.ratio, "max_mamba_cache_size": case.pinned,
        "max_running_requests": case.resolved_mrr, "disable_radix_cache": case.radix_off,
        "mamba_radix_cache_strategy": case.strategy, "disable_overlap_schedule": not case.overlap,
        "speculative_algorithm": "EAGLE" if case.spec else None,
        "speculative_num_draft_tokens": case.spec_draft_tokens if case.spec else None,
        "enable_linear_replayssm_spec": case.replayssm, "dcp_size": case.dcp, "kv_cache_dtype": "auto",
        "mem_fraction_static": 0.85, "enable_unified_memory": case.unified,
        "disaggregation_mode": "prefill" if case.pd_prefill else "null",
    }
    arch = raw["architectures"][0]
    lines = [f"[2026-11-30 10:00:00] server_args={args!r}"]
    size = sg.max_mamba_cache_size
    total_layers = max(sum(sg.stage_layers), 1)
    for stage in range(case.pp):
        prefix = f"[2026-11-30 10:00:{10 + stage:02d} PP{stage} TP0]" if case.pp > 1 else "[2026-11-30 10:00:10 TP0]"
        share = sg.stage_layers[stage] / total_layers
        conv_gb = (size + 1) * sg.conv_bytes_per_slot * sg.stage_layers[stage] / GIB
        ssm_gb = (size + 1) * sg.ssm_bytes_per_slot * sg.stage_layers[stage] / GIB
        lines.append(f"{prefix} Load weight begin. avail mem=78.50 GB")
        lines.append(f"{prefix} Load weight end. elapsed=20.00 s, type={arch}, avail mem=40.00 GB, mem usage=38.50 GB.")
        mamba = (f"{prefix} Mamba Cache is allocated. max_mamba_cache_size: {size}, conv_state size: {conv_gb:.2f}GB, "
                 f"ssm_state size: {ssm_gb:.2f}GB ")
        if case.spec and not case.replayssm and not case.pd_prefill:
            capped = min(max(1, (case.resolved_mrr or 1) // case.attn_dp), size // _slots(case))
            inter = (capped + 1) * case.spec_draft_tokens * sg.ssm_bytes_per_slot * sg.stage_layers[stage] / GIB
            conv_inter = (capped + 1) * case.spec_draft_tokens * sg.conv_bytes_per_slot * sg.stage_layers[stage] / GIB
            mamba += (f"intermediate_ssm_state_cache size: {inter:.2f}GB "
                      f"intermediate_conv_window_cache size: {conv_inter:.2f}GB ")
        lines.append(mamba)
        if case.replayssm:
            ring_slots = size + 1 if arch == "KimiLinearForCausalLM" else max(1, (case.resolved_mrr or 1) // case.attn_dp) + 1
            ring_gb = sg.ring_full_per_req * share * ring_slots / GIB
            lines.append(f"{prefix} GDN ReplaySSM ring buffers allocated (record_len=16, fold=False): "
                         f"d={ring_gb / 2:.3f}GB, k={ring_gb / 4:.3f}GB, g={ring_gb / 4:.3f}GB ")
        target_cell, draft_cell = sg.stage_cells[stage]
        kv_gb = (sg.kv_tokens + case.page) * target_cell / GIB
        lines.append(f"{prefix} KV Cache is allocated. dtype: torch.bfloat16, #tokens: {sg.kv_tokens}, "
                     f"KV size: {kv_gb:.2f} GB")
        if draft_cell:
            lines.append(f"{prefix} KV Cache is allocated. dtype: torch.bfloat16, #tokens: {sg.kv_tokens}, "
                         f"KV size: {(sg.kv_tokens + case.page) * draft_cell / GIB:.2f} GB")
        lines.append(f"{prefix} Memory pool end. avail mem=6.00 GB")
    slots = _slots(case)
    requested = case.resolved_mrr
    estimated = max(min(int(sg.kv_tokens / case.context_len * 512), 4096), 2048)
    cap = min(max(1, requested // case.attn_dp) if requested is not None else estimated, sg.kv_tokens // 2)
    if size // slots < cap:
        lines.append(f"[2026-11-30 10:00:30 TP0] max_running_requests is capped to {size // slots} by the mamba state "
                     f"cache (max_mamba_cache_size={size}, {slots} state slots per request). To raise it: increase "
                     "--mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size with "
                     "--mamba-ssm-dtype bfloat16.")
    logical = sg.kv_tokens * case.dcp
    for stage in range(case.pp):
        prefix = f"[2026-11-30 10:00:40 PP{stage} TP0]" if case.pp > 1 else "[2026-11-30 10:00:40 TP0]"
        lines.append(f"{prefix} max_total_num_tokens={logical}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                     f"max_running_requests={sg.max_running_requests}, context_len={case.context_len}, "
                     "available_gpu_mem=5.00 GB")
    lines.append("[2026-11-30 10:00:50] The server is fired up and ready to roll!")
    return "\n".join(lines) + "\n"


def _slots(case: Case) -> int:
    if case.radix_off:
        return 1
    base = 3 - (1 if case.skip_decode_lock else 0)
    if case.strategy == "extra_buffer":
        return base + (2 if case.overlap else 1)
    if case.strategy == "extra_buffer_lazy":
        return base + 1
    return base + (1 if case.skip_decode_lock else 0)


def server_info(case: Case, sg: SglangResult, target_cell: int) -> dict:
    """/server_info as SGLang 0.5.23 answers it (managers/scheduler_components/internal_state.py,
    memory_usage.py: kvcache is the target pool's GB rounded to 3 places, token_capacity logical)."""
    return {
        "version": "0.5.23", "served_model_name": case.config_file.removesuffix(".json"),
        "tp_size": case.tp, "pp_size": case.pp, "dp_size": 1, "attn_dp_size": case.attn_dp, "page_size": case.page,
        "mamba_full_memory_ratio": case.ratio, "max_mamba_cache_size": case.pinned,
        "max_running_requests": case.resolved_mrr, "disable_radix_cache": case.radix_off,
        "mamba_radix_cache_strategy": case.strategy, "disable_overlap_schedule": not case.overlap,
        "speculative_algorithm": "EAGLE" if case.spec else None,
        "speculative_num_draft_tokens": case.spec_draft_tokens if case.spec else None,
        "enable_linear_replayssm_spec": case.replayssm, "dcp_size": case.dcp,
        "disaggregation_mode": "prefill" if case.pd_prefill else "null",
        "internal_states": [{
            "dp_rank": 0, "max_mamba_cache_size": sg.max_mamba_cache_size,
            "effective_max_running_requests_per_dp": sg.max_running_requests,
            "memory_usage": {"weight": 38.5, "kvcache": round((sg.kv_tokens + case.page) * target_cell / GIB, 3),
                             "startup_available": 5.0, "token_capacity": sg.kv_tokens * case.dcp,
                             "token_capacity_swa": None, "graph": {"decode": 1.2}},
        }],
    }


# --- the cases -------------------------------------------------------------------------------------------

Q = "Qwen3-Next-80B-A3B-Instruct.json"
K = "Kimi-Linear-48B-A3B-Instruct.json"
N = "NVIDIA-Nemotron-Nano-9B-v2.json"
F = "Falcon-H1-1.5B-Instruct.json"
G = "granite-4.0-h-small.json"

CASES = [
    Case("qwen3next-default", Q),
    Case("qwen3next-page64", Q, page=64),
    Case("qwen3next-no_buffer", Q, strategy="no_buffer", overlap=False),
    Case("qwen3next-lazy", Q, strategy="extra_buffer_lazy"),
    Case("qwen3next-skip-lock", Q, skip_decode_lock=True),
    Case("qwen3next-no_buffer-skip-lock", Q, strategy="no_buffer", overlap=False, skip_decode_lock=True),
    Case("qwen3next-ratio-0.2", Q, ratio=0.2),
    Case("qwen3next-ratio-3", Q, ratio=3.0),
    Case("qwen3next-eagle", Q, spec_draft_tokens=4),
    Case("qwen3next-eagle-mrr256", Q, spec_draft_tokens=4, mrr=256),
    Case("qwen3next-eagle-replayssm", Q, spec_draft_tokens=4, replayssm=True),
    Case("qwen3next-pinned-attn-dp2", Q, tp=8, attn_dp=2, pinned=400, mrr=128),
    Case("qwen3next-pinned-eagle", Q, pinned=300, spec_draft_tokens=3),
    Case("qwen3next-radix-off-mrr", Q, radix_off=True, mrr=64),
    Case("qwen3next-radix-off-eagle", Q, radix_off=True, spec_draft_tokens=4),
    Case("qwen3next-pp2", Q, pp=2, overlap=False),
    Case("qwen3next-pp2-eagle", Q, pp=2, overlap=False, spec_draft_tokens=4),
    Case("qwen3next-attn-dp2", Q, tp=8, attn_dp=2),
    Case("qwen3next-unified", Q, unified=True),
    Case("qwen3next-eagle-pd-prefill", Q, spec_draft_tokens=4, pd_prefill=True),
    Case("kimi-linear-dcp2", K, tp=4, dcp=2),
    Case("kimi-linear-eagle-replayssm", K, tp=2, spec_draft_tokens=4, replayssm=True),
    Case("nemotronh-pp2", N, tp=2, pp=2, overlap=False, rest_gib=20.0),
    Case("nemotronh-pp4", N, tp=1, pp=4, overlap=False, rest_gib=20.0),
    Case("falcon-h1", F, tp=1, rest_gib=20.0),
    Case("granite-4.0-h", G, tp=2, rest_gib=30.0),
]


@dataclass
class Row:
    case: Case
    sglang: SglangResult
    advisor_state: int
    advisor_k: int
    advisor_tokens: int
    advisor_clamp: int
    replay_k: int | None = None
    replay_clamp: int | None = None
    replay_state_error: float | None = None
    info_state_error: float | None = None
    info_k: int | None = None

    @property
    def match(self) -> bool:
        s = self.sglang
        same = (self.advisor_state == s.stage_per_req and self.advisor_k == s.max_mamba_cache_size
                and self.advisor_clamp == s.max_running_requests)
        if not self.case.unified:
            same = same and self.advisor_tokens == s.kv_tokens
        if self.replay_k is not None:
            same = same and self.replay_k == s.max_mamba_cache_size and self.replay_clamp == s.max_running_requests
            same = same and (self.replay_state_error or 0) <= 0.01
        if self.info_state_error is not None:
            same = same and self.info_state_error <= 0.01 and self.info_k == s.max_mamba_cache_size
        return same


def run_case(case: Case, fixtures: Path | None) -> Row:
    from advisor.feeder import constants_from_server_info
    from advisor.model.pools import split_pools
    from advisor.sources.bootlog import parse_boot_log
    from advisor.sources.server_info import parse_server_info

    raw, derived, serving, constants = advisor_inputs(case)
    sg = run_sglang(case, derived)
    split = split_pools(case.rest_gib * GIB, serving, constants, model_context_len=case.context_len)
    row = Row(case, sg, int(constants.state_bytes_per_slot), split.max_mamba_cache_size, split.kv_capacity_tokens,
              split.max_running_requests)
    if not case.unified:
        text = boot_log(case, sg, raw)
        boot = parse_boot_log(text)
        back = split_pools(boot.rest_bytes, boot.serving_config(), boot.constants(), model_context_len=case.context_len)
        row.replay_k, row.replay_clamp = back.max_mamba_cache_size, back.max_running_requests
        row.replay_state_error = abs(boot.constants().state_bytes_per_slot / sg.stage_per_req - 1)
        body = server_info(case, sg, max(target for target, _ in sg.stage_cells))
        info = parse_server_info(body, architecture=raw["architectures"][0])
        fraction = constants.draft_kv_bytes_per_token / constants.kv_bytes_per_token if case.spec else None
        inverted = constants_from_server_info(
            info, draft_kv_fraction=fraction,
            ring_bytes_per_request=constants.replayssm_ring_bytes_per_request or None,
        ) if case.pp == 1 else None
        if inverted is not None:
            info_constants, info_rest = inverted
            row.info_state_error = abs(info_constants.state_bytes_per_slot / sg.stage_per_req - 1)
            row.info_k = split_pools(info_rest, info.serving, info_constants,
                                     model_context_len=case.context_len).max_mamba_cache_size
        if fixtures is not None:
            fixtures.mkdir(parents=True, exist_ok=True)
            (fixtures / f"{case.name}.log").write_text(text)
            (fixtures / f"{case.name}.server_info.json").write_text(json.dumps(body, indent=1) + "\n")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-fixtures", type=Path, help="write each case's boot log, /server_info and truth")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)
    rows = [run_case(case, args.write_fixtures) for case in CASES]
    if args.write_fixtures is not None:
        truth = {
            r.case.name: {
                "max_mamba_cache_size": r.sglang.max_mamba_cache_size, "kv_tokens": r.sglang.kv_tokens,
                "max_running_requests": r.sglang.max_running_requests, "mamba_cache_per_req": r.sglang.per_req,
                "stage_mamba_cache_per_req": r.sglang.stage_per_req, "replayssm_ring_bytes_per_req": r.sglang.ring_per_req,
                "rest_gib": r.case.rest_gib, "context_len": r.case.context_len,
            }
            for r in rows if not r.case.unified
        }
        (args.write_fixtures / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
    header = ("case", "SGLang per-slot B", "ours", "SGLang K", "ours", "SGLang KV tokens", "ours", "SGLang clamp", "ours",
              "boot-log K/clamp", "boot state err", "server_info state err", "match")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    bad = 0
    for r in rows:
        s = r.sglang
        replay = "-" if r.replay_k is None else f"{r.replay_k}/{r.replay_clamp}"
        boot_err = "-" if r.replay_state_error is None else f"{r.replay_state_error:.4%}"
        info_err = "-" if r.info_state_error is None else f"{r.info_state_error:.4%}"
        tokens = f"{r.advisor_tokens}" if not r.case.unified else f"{r.advisor_tokens} (floats)"
        print(f"| {r.case.name} | {s.stage_per_req} | {r.advisor_state} | {s.max_mamba_cache_size} | {r.advisor_k} | "
              f"{s.kv_tokens} | {tokens} | {s.max_running_requests} | {r.advisor_clamp} | {replay} | {boot_err} | "
              f"{info_err} | {'yes' if r.match else 'NO'} |")
        bad += not r.match
    print(f"\n{len(rows) - bad}/{len(rows)} rows match")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
