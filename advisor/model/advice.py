"""The seed's whole procedure as one pure function: r*, predicted clamp and KV cap, binding pool,
the pin alternative, the free lever and the caveats, for one serving config and one context length.
Owns the rules both the offline `recommend` and the online recommender apply: when to pin, the flag line."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from advisor.model.pools import (
    PIN_RATIO_THRESHOLD,
    ByteConstants,
    PoolSplit,
    balanced_concurrency,
    binding_pool,
    kv_capacity_requests,
    optimal_ratio_for,
    pin_size,
    split_pools,
)
from advisor.model.serving import (
    ServingConfig,
    assumed_slots_note,
    effective_draft_tokens,
    overlap_enabled,
    resolve_strategy,
    slots_per_request,
    spec_enabled,
)

# The free lever: idle memory after the pools above this (GiB, and share of the card) is worth reclaiming.
IDLE_MEMORY_LEVER_GIB = 8.0
IDLE_MEMORY_LEVER_SHARE = 0.08
# Keep this much of the card free for activations when raising --mem-fraction-static (share, floor GiB).
RUNTIME_HEADROOM_SHARE = 0.05
RUNTIME_HEADROOM_FLOOR_GIB = 4.0
# The seed's suggested ceiling for --mem-fraction-static ("→0.92"); validate graph capture once.
MEM_FRACTION_STATIC_CEILING = 0.92


@dataclass(frozen=True)
class MemoryFacts:
    """What a boot log tells about memory outside the two pools (GiB); all optional."""

    card_available_gib: float | None = None  # `Load weight begin. avail mem` (pre-load free memory)
    idle_after_pools_gib: float | None = None  # `Memory pool end. avail mem`
    idle_after_graphs_gib: float | None = None  # caps line `available_gpu_mem`
    mem_fraction_static: float | None = None


@dataclass
class Advice:
    ratio: float
    token_equiv: float
    slots_per_request: int
    draft_tokens: int
    dcp_size: int
    strategy: str
    context_length: float
    state_bytes_per_slot: float
    kv_bytes_per_token: float
    rest_bytes: float | None
    predicted_max_mamba_cache_size: int | None
    predicted_max_running_requests: int | None
    kv_capacity_tokens: int | None
    kv_capacity_requests: float | None
    binding_pool: str | None
    pin_max_mamba_cache_size: int | None
    recommended_mem_fraction_static: float | None
    flag_line: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def state_for_split(split: PoolSplit, context_length: float, dcp_size: int) -> tuple[float, str]:
    """KV capacity in requests and the binding pool for one split at one context length."""
    kv_requests = kv_capacity_requests(split.kv_capacity_tokens, context_length, dcp_size)
    return kv_requests, binding_pool(split.max_running_requests, kv_requests)


# A ratio under PIN_RATIO_THRESHOLD is fragile where its budget holds fewer than this many requests' worth of state
# slots: one request's worth more or less then moves the clamp by over 6%. At r 0.15 the seed's models hold 7-14 (a
# slot is 3,100-4,100 KV tokens); a model whose slot is ~800 tokens (a dense Mamba2 hybrid on TP2) holds 49 at r
# 0.10, not fragile at all.
PIN_FRAGILE_REQUESTS = 16


@dataclass(frozen=True)
class PinChoice:
    """Pin the state pool (`--max-mamba-cache-size`) instead of setting a ratio, and why."""

    max_mamba_cache_size: int
    balanced_requests: float  # requests per DP worker at the balance point the pin admits
    why: str  # "fragile_ratio" | "dcp" | "thin_state_budget"


def pin_choice(
    ratio: float,
    config: ServingConfig,
    constants: ByteConstants,
    rest_bytes: float,
    pin_context_length: float,
    ratio_threshold: float = PIN_RATIO_THRESHOLD,
) -> PinChoice | None:
    """The one pin rule (seed, "when to pin"): pin when r is below PIN_RATIO_THRESHOLD and its state budget holds
    fewer than PIN_FRAGILE_REQUESTS requests' worth of slots (a ratio that small is fragile: one request's worth
    more or less moves the clamp by a large share), under DCP (the balance point sits beyond
    realistic L), or when the ratio's state budget would hold fewer than two requests' worth of slots. The pin
    admits the balanced concurrency at `pin_context_length` (the online recommender passes its biased L, and
    `ratio_threshold` moved off PIN_RATIO_THRESHOLD for its hysteresis)."""
    slots = slots_per_request(config)
    draft = effective_draft_tokens(config)
    state_budget = rest_bytes * ratio / (1 + ratio)
    request_state_bytes = (slots + draft) * constants.state_bytes_per_slot  # one request's worth of slots
    why = None
    if config.dcp_size > 1:
        why = "dcp"
    elif ratio < ratio_threshold and state_budget < request_state_bytes * PIN_FRAGILE_REQUESTS:
        why = "fragile_ratio"
    elif state_budget < request_state_bytes * 2:
        why = "thin_state_budget"
    if why is None:
        return None
    target = balanced_concurrency(rest_bytes, config, constants, pin_context_length)
    return PinChoice(pin_size(target, config), target, why)


PIN_REASONS = {
    "dcp": "under DCP the balance point sits beyond realistic L",
    "fragile_ratio": f"r* below {PIN_RATIO_THRESHOLD} is fragile",
    "thin_state_budget": "the ratio's state budget holds under two requests' worth of slots",
}


def flag_line(ratio: float, pin: int | None, mem_fraction_static: float | None) -> str:
    """The SGLang flags that apply a recommendation."""
    line = f"--max-mamba-cache-size {pin}" if pin is not None else f"--mamba-full-memory-ratio {ratio:.3g}"
    if mem_fraction_static is not None:
        line += f" --mem-fraction-static {mem_fraction_static:.2f}"
    return line


def free_lever(memory: MemoryFacts) -> tuple[float | None, str | None]:
    """A higher --mem-fraction-static when the boot log shows large idle memory; (value, note)."""
    idle = memory.idle_after_graphs_gib if memory.idle_after_graphs_gib is not None else memory.idle_after_pools_gib
    card = memory.card_available_gib
    mfs = memory.mem_fraction_static
    if idle is None or card is None or mfs is None or card <= 0:
        return None, None
    if idle < IDLE_MEMORY_LEVER_GIB or idle / card < IDLE_MEMORY_LEVER_SHARE:
        return None, None
    headroom = max(RUNTIME_HEADROOM_FLOOR_GIB, RUNTIME_HEADROOM_SHARE * card)
    target = min(MEM_FRACTION_STATIC_CEILING, mfs + (idle - headroom) / card)
    target = int(target * 100) / 100
    if target <= mfs + 0.005:
        return None, None
    return target, (
        f"free lever first: {idle:.1f} GiB sits idle after the pools at --mem-fraction-static {mfs:g}; raising it to "
        f"{target:.2f} grows both pools at no cost (validate CUDA-graph capture headroom once)"
    )


def caveats(config: ServingConfig, constants: ByteConstants) -> list[str]:
    """What the operator must know beside the ratio, for a serving config and its byte constants: the S and D
    rules that bend (PP, ReplaySSM), the draft KV, the dtype accuracy gates, an assumed env var, a strategy's
    cost. Offline `recommend` and the online engine both report exactly these."""
    notes: list[str] = []
    slots = slots_per_request(config)
    draft = effective_draft_tokens(config)
    strategy = resolve_strategy(config)
    if config.pp_size > 1 and strategy.startswith("extra_buffer"):
        notes.append(f"pp_size {config.pp_size} turns the overlap scheduler off, so S = {slots} (not the overlap row)")
    if config.replayssm and spec_enabled(config):
        notes.append(
            "ReplaySSM spec-verify moves the draft states to a fixed ring: D = 0 per request "
            f"(using the {config.draft_tokens} draft tokens would overstate r by {(slots + config.draft_tokens) / slots:.1f}x)"
        )
    if spec_enabled(config) and draft > 0:
        if constants.draft_kv_bytes_per_token > 0:
            notes.append(
                "spec decoding: the draft model's KV is priced inside each token's cell "
                f"({constants.draft_kv_bytes_per_token:,.0f} of {constants.kv_bytes_per_token + constants.draft_kv_bytes_per_token:,.0f} bytes)"
            )
        else:
            notes.append(
                "spec decoding: the draft model's KV is unknown, so each token's cell is underpriced and r overstated; "
                "give a boot log with the draft model's KV line"
            )
    kv_dtype = (config.kv_cache_dtype or "auto").lower()
    if kv_dtype.startswith("fp8") or kv_dtype.startswith("fp4") or kv_dtype.startswith("nvfp4") or kv_dtype == "mxfp8":
        notes.append(f"accuracy gate: --kv-cache-dtype {config.kv_cache_dtype} doubles token_equiv (and r); validate accuracy for the workload")
    ssm_dtype = (config.mamba_ssm_dtype or "").lower()
    if ssm_dtype in ("bfloat16", "bf16", "float16", "fp16"):
        notes.append(
            f"accuracy gate: --mamba-ssm-dtype {config.mamba_ssm_dtype} about halves token_equiv; on SM100+ it also switches "
            "the linear-attention decode backend (pin --linear-attn-decode-backend triton); validate accuracy"
        )
    assumed = assumed_slots_note(config)
    if assumed:
        notes.append(assumed)
    if not overlap_enabled(config) and strategy == "no_buffer":
        notes.append("no_buffer runs without the overlap scheduler: lower decode throughput than extra_buffer_lazy")
    return notes


def clamp_mismatch(predicted: int, observed: int | None) -> str | None:
    """The one rule for a predicted clamp that disagrees with the server's: any difference of more than one
    request (the pool arithmetic is SGLang's; one request of slack covers constants inverted from rounded
    sizes)."""
    if observed is None or abs(predicted - observed) <= 1:
        return None
    return f"model predicts clamp {predicted} at the live config, the server reports {observed}"


def advise(
    config: ServingConfig,
    constants: ByteConstants,
    context_length: float,
    *,
    rest_bytes: float | None = None,
    memory: MemoryFacts | None = None,
    model_context_len: int = 262144,
) -> Advice:
    """The seed's procedure for one context length L (tokens, input + output)."""
    if context_length <= 0:
        raise ValueError(f"context length must be > 0 tokens, got {context_length:g}")
    slots = slots_per_request(config)
    draft = effective_draft_tokens(config)
    ratio = optimal_ratio_for(config, constants, context_length)
    strategy = resolve_strategy(config)
    notes: list[str] = caveats(config, constants)

    predicted_cache = predicted_clamp = kv_tokens = None
    kv_requests: float | None = None
    binding: str | None = None
    pin: int | None = None
    if rest_bytes is not None:
        split = split_pools(rest_bytes, config.with_ratio(ratio), constants, model_context_len=model_context_len)
        predicted_cache = split.max_mamba_cache_size
        predicted_clamp = split.max_running_requests
        kv_tokens = split.kv_capacity_tokens
        kv_requests, binding = state_for_split(split, context_length, config.dcp_size)
        choice = pin_choice(ratio, config, constants, rest_bytes, context_length)
        if choice is not None:
            pin = choice.max_mamba_cache_size
            notes.append(
                f"pin instead: --max-mamba-cache-size {pin} (= {int(choice.balanced_requests)} requests x S={slots}"
                f"{' x attn_dp ' + str(config.attn_dp_size) if config.attn_dp_size > 1 else ''}); "
                f"{PIN_REASONS[choice.why]}; the rest goes to KV"
            )
    else:
        notes.append("no rest budget (boot log or --rest-gib): the clamp and KV capacity are not predicted")

    mfs_target, lever_note = free_lever(memory or MemoryFacts())
    if lever_note:
        notes.insert(0, lever_note)

    return Advice(
        ratio=ratio,
        token_equiv=constants.token_equiv,
        slots_per_request=slots,
        draft_tokens=draft,
        dcp_size=config.dcp_size,
        strategy=strategy,
        context_length=context_length,
        state_bytes_per_slot=constants.state_bytes_per_slot,
        kv_bytes_per_token=constants.kv_bytes_per_token,
        rest_bytes=rest_bytes,
        predicted_max_mamba_cache_size=predicted_cache,
        predicted_max_running_requests=predicted_clamp,
        kv_capacity_tokens=kv_tokens,
        kv_capacity_requests=kv_requests,
        binding_pool=binding,
        pin_max_mamba_cache_size=pin,
        recommended_mem_fraction_static=mfs_target,
        flag_line=flag_line(ratio, pin, mfs_target),
        notes=notes,
    )
