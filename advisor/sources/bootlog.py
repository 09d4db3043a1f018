"""Reads an SGLang boot log into the numbers the dual-pool model needs.

Every release's formats (see `advisor.sources.formats`): `server_args=ServerArgs(...)` and `server_args={...}`,
the KV line with or without `dtype:`, the post-capture KV sizing lines, `bench_one_batch`'s bare
`max_total_num_tokens=`, `[… DPn PPn TPn EPn]` prefixes (a pasted line that lost its `[` too), trailing
spaces, several boots in one file (the last complete one wins) and a draft model's second pool. Linear in
the input: fields are found with str.find, never with a backtracking regex.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from advisor.errors import InputError
from advisor.model.inversion import InvertedPools, StagePools, invert_pools
from advisor.model.pools import GIB, ByteConstants
from advisor.model.serving import (
    EXTRA_BUFFER_ARCHITECTURES,
    SKIP_SOURCE_BOOT_LOG,
    ServingConfig,
    slots_per_request,
)
from advisor.model.state_shapes import linear_family_of
from advisor.sources.formats import (
    AUTO_STRATEGY_BEFORE_KV_DTYPE,
    float_after,
    int_after,
    line_format,
    parse_server_args,
    prefix_close,
    prefix_ranks,
    word_after,
)
from advisor.sources.local_files import read_local_text

Rank = tuple[int, int, int]  # (dp, pp, tp)


@dataclass
class StatePoolLine:
    max_mamba_cache_size: int
    conv_gib: float
    ssm_gib: float
    intermediate_ssm_gib: float = 0.0
    intermediate_conv_gib: float = 0.0

    @property
    def persistent_gib(self) -> float:
        return self.conv_gib + self.ssm_gib

    @property
    def total_gib(self) -> float:
        return self.conv_gib + self.ssm_gib + self.intermediate_ssm_gib + self.intermediate_conv_gib


@dataclass
class KVPoolLine:
    dtype: str | None  # None before 0.5.17 (no `dtype:` in the line)
    tokens: int
    kv_gib: float
    label: str | None = None
    upper_bound: bool = False  # `KV Cache VA upper bound.`: sized again after CUDA-graph capture


@dataclass
class BootInfo:
    """One SGLang boot as seen on the lowest DP/PP/TP rank that printed it."""

    state_pool: StatePoolLine
    kv_pool: KVPoolLine
    draft_state_pool: StatePoolLine | None = None
    draft_kv_pool: KVPoolLine | None = None
    model_class: str | None = None
    avail_before_weights_gib: float | None = None
    avail_after_weights_gib: float | None = None
    weights_gib: float | None = None
    memory_pool_end_avail_gib: float | None = None
    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    context_len: int | None = None
    available_gpu_mem_gib: float | None = None
    capped_by_state_pool: bool = False
    logged_slots_per_request: int | None = None
    tp_ranks_seen: int = 1
    dp_ranks_seen: int = 1
    pp_ranks_seen: int = 1
    # PP stage -> (state pool, KV pool) of that stage's lowest TP rank: each stage holds its own layers' pools
    # (a stage without attention layers logs a 0-byte KV pool, one without state layers a 0-byte state pool)
    stage_pools: dict[int, tuple[StatePoolLine | None, KVPoolLine | None]] = field(default_factory=dict)
    # PP stage -> what it reports of its pools, the inversion's input (draft KV and ReplaySSM rings included)
    stages: dict[int, StagePools] = field(default_factory=dict)
    # The ReplaySSM ring buffers as allocated on the lowest rank (`GDN ReplaySSM ring buffers allocated`), GiB
    replayssm_ring_gib: float = 0.0
    server_args: dict[str, object] = field(default_factory=dict)
    server_args_form: str | None = None  # 'repr' (ServerArgs(...), <= 0.5.17) | 'dict' (0.5.23) | None
    state_pool_size_from_caps: bool = False  # 0.5.2: the Mamba line has no size; the pool had mrr slots
    post_capture_kv: bool = False  # the KV pool was re-sized after CUDA-graph capture (0.5.17+)
    boots_in_file: int = 1
    page_size: int = 1

    @property
    def effective_server_args(self) -> dict[str, object]:
        """`server_args`, plus what the log itself implies where that line is silent or absent: the TP size
        from the ranks that printed, and `auto` resolved as the log's release did. Logs whose KV line has no
        `dtype:` (<= 0.5.11) come from releases where `auto` always became no_buffer (formats.py)."""
        args = dict(self.server_args)
        if "tp_size" not in args and self.tp_ranks_seen > 1:
            args["tp_size"] = self.tp_ranks_seen
        field_name = "mamba_radix_cache_strategy" if "mamba_radix_cache_strategy" in args else "mamba_scheduler_strategy"
        if self.kv_pool.dtype is None and args.get(field_name, "auto") == "auto":
            args[field_name] = AUTO_STRATEGY_BEFORE_KV_DTYPE
        return args

    def serving_config(self) -> ServingConfig:
        """The config this boot ran with: its `server_args` (SGLang's defaults where silent), refined by the model
        class it loaded. A server_args field SGLang would refuse is an InputError naming it."""
        from advisor.sources.server_info import serving_config_from_args

        # the model class decides `auto` and the linear family only when it is a hybrid SGLang 0.5.23 knows
        known = self.model_class in EXTRA_BUFFER_ARCHITECTURES or linear_family_of(self.model_class or "") is not None
        config = serving_config_from_args(self.effective_server_args, where="boot log server_args",
                                          architecture=self.model_class if known else None)
        # The capped warning names the S SGLang used: it shows SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK, which the
        # server_args do not.
        logged = self.logged_slots_per_request
        if logged is not None and logged != slots_per_request(config):
            flipped = replace(config, skip_decode_lock=not config.skip_decode_lock,
                              skip_decode_lock_source=SKIP_SOURCE_BOOT_LOG)
            if slots_per_request(flipped) == logged:
                return flipped
        return config

    def pools(self, config: ServingConfig | None = None, *, state_bytes_per_slot: float | None = None) -> InvertedPools:
        """The byte constants and budget this boot's pools imply (`advisor.model.inversion`), inverted with the
        config the server ran with (its own `server_args` unless given). `state_bytes_per_slot` (from the model
        config) stands in when the state line rounds to `0.00GB` (a tiny model) and the ratio did not set the size."""
        serving = self.serving_config() if config is None else config
        stages = list(self.stages.values()) or [self._stage_of(self.state_pool, self.kv_pool)]
        return invert_pools(stages, serving, state_bytes_per_slot=state_bytes_per_slot)

    def _stage_of(self, state: StatePoolLine | None, kv: KVPoolLine | None) -> StagePools:
        return StagePools(
            max_mamba_cache_size=state.max_mamba_cache_size if state is not None else 0,
            kv_tokens=kv.tokens if kv is not None else 0,
            kv_pool_bytes=kv.kv_gib * GIB if kv is not None else 0.0,
            state_pool_bytes=state.persistent_gib * GIB if state is not None else None,
        )

    def constants(self) -> ByteConstants:
        """The byte constants of this boot (`pools()`); an InputError names what the log cannot give."""
        pools = self.pools()
        if pools.constants is None:
            raise InputError(f"boot log: {pools.missing}")
        return pools.constants

    @property
    def rest_bytes(self) -> float:
        """The budget both pools were cut from, per GPU, rebuilt so the split at the live ratio gives back the
        logged slot count (state + reserved spec scratch + rings + target and draft KV)."""
        pools = self.pools()
        if pools.rest_bytes is None:
            raise InputError(f"boot log: {pools.missing}")
        return pools.rest_bytes


# ------------------------------------------------------------------------------------------------ prefix

def split_prefix(line: str) -> tuple[Rank | None, str]:
    """(rank, message) of one log line, by the one prefix grammar (`formats.prefix_close`, `prefix_ranks`). Rank
    is None when the line has no SGLang prefix (bench prints, tqdm bars, `[Gloo]` lines); a line that lost its
    leading `[` is read all the same."""
    text = line.strip()
    close = prefix_close(text)
    if close < 0:
        return None, text
    start = 1 if text.startswith("[") else 0
    stamp_end = start + 19
    if text.startswith(".", stamp_end):
        stamp_end = text.find(" ", stamp_end, close)
        stamp_end = close if stamp_end < 0 else stamp_end
    ranks = prefix_ranks(text[stamp_end:close].strip())
    if ranks is None:
        return None, text
    return (ranks.get("DP", ranks.get("ATTN_DP", 0)), ranks.get("PP", 0), ranks.get("TP", 0)), text[close + 1 :].strip()


# ------------------------------------------------------------------------------------------------ lines

# Markers from the one format table (formats.LINE_FORMATS) the emulator writes from too.
_LOAD_BEGIN = line_format("load_weight_begin").marker
_LOAD_END = line_format("load_weight_end").marker
_MAMBA = line_format("mamba_pool").marker
_KV_MARKERS = (line_format("kv_pool_dtype").marker, "KV Cache VA upper bound.")
_POST_KV = line_format("kv_post_capture").marker
_POST_DRAFT_KV = line_format("kv_post_capture_draft").marker
_POOL_END = line_format("memory_pool_end").marker
_CAPS = line_format("caps").marker
_CAPPED = line_format("capped_by_state_pool").marker
_RING = line_format("replayssm_ring").marker
_HYBRID_HINTS = ("hybrid GDN", "hybrid linear attention", "Mamba", "mamba no_buffer", "GDN kernel")
_SWA_HINTS = (line_format("swa_pool").marker, "#swa token", "SWA KV Cache")


def _state_line(message: str) -> StatePoolLine | None:
    conv = float_after(message, "conv_state size:")
    ssm = float_after(message, "ssm_state size:")
    if conv is None or ssm is None:
        return None
    size = int_after(message, "max_mamba_cache_size:")
    if min(conv, ssm) < 0 or (size is not None and size < 0):
        return None
    return StatePoolLine(
        max_mamba_cache_size=-1 if size is None else size,
        conv_gib=conv,
        ssm_gib=ssm,
        intermediate_ssm_gib=float_after(message, "intermediate_ssm_state_cache size:") or 0.0,
        intermediate_conv_gib=float_after(message, "intermediate_conv_window_cache size:") or 0.0,
    )


def _ring_gib(message: str) -> float:
    """The sum of the `name=x.xxxGB` buffers of a `GDN ReplaySSM ring buffers allocated` line."""
    total = 0.0
    for token in message.replace(",", " ").split():
        name, sep, value = token.partition("=")
        if sep and name.isidentifier() and value.endswith("GB"):
            try:
                size = float(value[:-2])
            except ValueError:
                continue
            if size == size and 0 <= size < float("inf"):
                total += size
    return total


def _kv_sizes(message: str, at: int) -> float | None:
    whole = float_after(message, "KV size:", at)
    if whole is not None:
        return whole
    k = float_after(message, "K size:", at)
    v = float_after(message, "V size:", at)
    return None if k is None or v is None else k + v


def _kv_line(message: str, marker_at: int, upper_bound: bool) -> KVPoolLine | None:
    tokens = int_after(message, "#tokens:", marker_at)
    size = _kv_sizes(message, marker_at)
    if tokens is None or size is None or tokens < 0 or size < 0:
        return None
    label = message[:marker_at].strip() or None
    return KVPoolLine(word_after(message, "dtype: ", marker_at), tokens, size, label, upper_bound)


@dataclass
class _Caps:
    tokens: int
    mrr: int | None = None
    chunk: int | None = None
    ctx: int | None = None
    avail: float | None = None


@dataclass
class _RankLines:
    load_begin: float | None = None
    load_end: tuple[str | None, float | None, float | None] | None = None
    states: list[StatePoolLine] = field(default_factory=list)
    kvs: list[KVPoolLine] = field(default_factory=list)
    post_kv: KVPoolLine | None = None
    post_draft_kv: KVPoolLine | None = None
    pool_end: float | None = None
    caps: _Caps | None = None
    capped_slots: int | None = None
    ring_gib: float = 0.0

    def has_pools(self) -> bool:
        return bool(self.states) and bool(self.kvs or self.post_kv)

    def has_any_pool(self) -> bool:
        return bool(self.states) or bool(self.kvs or self.post_kv)


@dataclass
class _Boot:
    ranks: dict[Rank, _RankLines] = field(default_factory=dict)
    server_args: dict[str, object] = field(default_factory=dict)
    server_args_form: str | None = None
    swa_seen: bool = False
    hybrid_hint: bool = False
    model_class: str | None = None
    last_line: str | None = None
    prefixed_lines: int = 0  # lines with an SGLang `[time ranks]` prefix
    stats_lines: int = 0  # `Decode batch` / `Prefill batch` lines

    def at(self, rank: Rank) -> _RankLines:
        lines = self.ranks.get(rank)
        if lines is None:
            lines = self.ranks[rank] = _RankLines()
        return lines

    def has_states(self) -> bool:
        return any(r.states for r in self.ranks.values())

    def has_kv(self) -> bool:
        return any(r.kvs or r.post_kv for r in self.ranks.values())

    def started(self) -> bool:
        return bool(self.ranks) or bool(self.server_args) or self.prefixed_lines > 0


def _load_end(message: str) -> tuple[str | None, float | None, float | None]:
    return (
        word_after(message, "type="),
        float_after(message, "avail mem="),
        float_after(message, "mem usage="),
    )


def _caps(message: str) -> _Caps | None:
    tokens = int_after(message, _CAPS)
    if tokens is None or tokens < 0:
        return None
    avail = float_after(message, "available_gpu_mem=")
    if avail is None:
        avail = float_after(message, "available_cpu_mem=")
    mrr = int_after(message, "max_running_requests=")
    return _Caps(
        tokens,
        None if mrr is None or mrr < 0 else mrr,
        int_after(message, "chunked_prefill_size="),
        int_after(message, "context_len="),
        avail,
    )


def _read_line(boot: _Boot, boots: list[_Boot], rank: Rank | None, message: str) -> _Boot:
    """Fold one message into the current boot; returns the boot now current (a new one on a restart)."""
    here = (0, 0, 0) if rank is None else rank
    if message.startswith("server_args=") or message.find("server_args=", 0, 40) >= 0:
        fields = parse_server_args(message)
        if fields is not None:
            if boot.ranks:
                boots.append(boot)
                boot = _Boot()
            boot.server_args = fields
            boot.server_args_form = "dict" if "server_args={" in message[:60] else "repr"
            return boot
    if message.startswith(_LOAD_BEGIN):
        seen = boot.ranks.get(here)
        if seen is not None and (seen.states or seen.kvs or seen.caps):
            boots.append(boot)
            boot = _Boot()
        boot.at(here).load_begin = float_after(message, "avail mem=")
        boot.last_line = "Load weight begin"
        return boot
    if message.startswith(_LOAD_END):
        end = boot.at(here).load_end = _load_end(message)
        boot.model_class = boot.model_class or end[0]
        boot.last_line = "Load weight end"
        return boot
    if message.startswith(_MAMBA):
        state = _state_line(message)
        if state is not None:
            boot.at(here).states.append(state)
            boot.last_line = "Mamba Cache is allocated"
        return boot
    if message.startswith(_RING):
        boot.at(here).ring_gib = _ring_gib(message)
        return boot
    if message.startswith(_POST_DRAFT_KV):
        boot.at(here).post_draft_kv = _kv_line(message, len(_POST_DRAFT_KV), False)
        return boot
    if message.startswith(_POST_KV):
        boot.at(here).post_kv = _kv_line(message, len(_POST_KV), False)
        return boot
    for marker in _KV_MARKERS:
        at = message.find(marker)
        if at >= 0:
            kv = _kv_line(message, at, marker != _KV_MARKERS[0])
            if kv is not None:
                boot.at(here).kvs.append(kv)
                boot.last_line = "KV Cache is allocated"
                if kv.label is not None and "SWA" in kv.label:
                    boot.swa_seen = True
            return boot
    if message.startswith(_POOL_END):
        boot.at(here).pool_end = float_after(message, "avail mem=")
        return boot
    if message.startswith(_CAPS):
        caps = _caps(message)
        if caps is not None:
            boot.at(here).caps = caps
            boot.last_line = "max_total_num_tokens="
        return boot
    if message.startswith(_CAPPED) and "mamba state" in message:
        boot.at(here).capped_slots = _slots_per_request(message)
        return boot
    if rank is not None:
        boot.prefixed_lines += 1
        if message.startswith(("Decode batch", "Prefill batch")):
            boot.stats_lines += 1
    if not boot.swa_seen and any(hint in message for hint in _SWA_HINTS):
        boot.swa_seen = True
    elif not boot.hybrid_hint and any(hint in message for hint in _HYBRID_HINTS):
        boot.hybrid_hint = True
    return boot


def _slots_per_request(message: str) -> int | None:
    """`(max_mamba_cache_size=257, 5 state slots per request)` -> 5."""
    end = message.find(" state slots per request")
    if end < 0:
        return None
    start = message.rfind(" ", 0, end)
    digits = message[start + 1 : end]
    return int(digits) if digits.isdigit() else None


def _split_boots(text: str) -> list[_Boot]:
    boots: list[_Boot] = []
    boot = _Boot()
    for raw in text.splitlines():
        rank, message = split_prefix(raw)
        if message:
            boot = _read_line(boot, boots, rank, message)
    if boot.started() or boot.swa_seen or boot.hybrid_hint:
        boots.append(boot)
    return boots


def _refusal(boot: _Boot, source: str) -> str:
    """One line saying why this boot cannot give the pool sizes."""
    if not boot.has_states():
        if boot.swa_seen:
            return (
                f"{source}: an SWA-hybrid (sliding-window attention) model: full and SWA KV pools, no Mamba "
                "state pool, so --mamba-full-memory-ratio does not apply"
            )
        if boot.has_kv():
            if boot.hybrid_hint:
                return (
                    f"{source}: no 'Mamba Cache is allocated' line although the log is a hybrid GDN/Mamba model's "
                    "(an excerpt that starts after the state pool?); pass the whole boot log"
                )
            model = f" ({boot.model_class})" if boot.model_class else ""
            return (
                f"{source}: no 'Mamba Cache is allocated' line: a plain attention model{model} has no state pool "
                "(the advisor is for hybrid Mamba/GDN/KDA models)"
            )
        if boot.stats_lines and not boot.ranks:
            return (
                f"{source}: no boot block, only batch statistics: the log starts after the server booted; pass the "
                "log from the server's start (its 'Mamba Cache is allocated' and 'KV Cache is allocated' lines)"
            )
        last = f" (last boot line: '{boot.last_line}')" if boot.last_line else ""
        return (
            f"{source}: the log ends before the memory pools were allocated{last}: was the server still "
            "starting, or did it crash? (expected 'Mamba Cache is allocated' and 'KV Cache is allocated')"
        )
    return (
        f"{source}: the log ends after the 'Mamba Cache is allocated' line and before 'KV Cache is allocated': "
        "the server had not finished allocating its pools"
    )


def parse_boot_log(text: str, *, source: str = "boot log") -> BootInfo:
    """The last complete boot in `text`. Raises InputError with one line naming what is missing or why the
    log cannot be used (an SWA-hybrid or plain attention model, a log that ends before the pools)."""
    boots = _split_boots(text)
    if not boots:
        raise InputError(
            f"{source}: no SGLang boot lines found (expected 'Mamba Cache is allocated' and 'KV Cache is allocated')"
        )
    complete = [b for b in boots if any(r.has_pools() for r in b.ranks.values())]
    if not complete:
        raise InputError(_refusal(boots[-1], source))
    boot = complete[-1]
    with_pools = sorted(r for r, lines in boot.ranks.items() if lines.has_pools())
    rank = with_pools[0]
    lines = boot.ranks[rank]
    kv = lines.post_kv or lines.kvs[0]
    info = BootInfo(
        state_pool=lines.states[0],
        kv_pool=kv,
        server_args=boot.server_args,
        server_args_form=boot.server_args_form,
        post_capture_kv=lines.post_kv is not None,
        boots_in_file=len(boots),
    )
    if len(lines.states) > 1:
        info.draft_state_pool = lines.states[1]
    if lines.post_draft_kv is not None:
        info.draft_kv_pool = lines.post_draft_kv
    elif len(lines.kvs) > 1:
        info.draft_kv_pool = lines.kvs[1]
    info.avail_before_weights_gib = lines.load_begin
    if lines.load_end is not None:
        info.model_class, info.avail_after_weights_gib, info.weights_gib = lines.load_end
    info.memory_pool_end_avail_gib = lines.pool_end
    # The caps line and the capped warning come from TP0 of each DP replica (the last PP stage prints
    # nothing extra); bench_one_batch prints the caps line bare, with no prefix.
    dp = rank[0]
    for other_rank in sorted(boot.ranks):
        other = boot.ranks[other_rank]
        if other_rank[0] != dp:
            continue
        if other.caps is not None and info.max_total_num_tokens is None:
            info.max_total_num_tokens = other.caps.tokens
            info.max_running_requests = other.caps.mrr
            info.chunked_prefill_size = other.caps.chunk
            info.context_len = other.caps.ctx
            info.available_gpu_mem_gib = other.caps.avail
        if other.capped_slots is not None:
            info.capped_by_state_pool = True
            info.logged_slots_per_request = other.capped_slots
    if info.state_pool.max_mamba_cache_size < 0:
        # SGLang 0.5.2 (memory_pool.py MambaPool) logged no size: its state pool had max_running_requests slots.
        if info.max_running_requests is None:
            raise InputError(
                f"{source}: the 'Mamba Cache is allocated' line has no max_mamba_cache_size (SGLang 0.5.2) and "
                "no caps line gives max_running_requests, the pool's size in that release"
            )
        info.state_pool.max_mamba_cache_size = info.max_running_requests
        info.state_pool_size_from_caps = True
    info.tp_ranks_seen = len({r[2] for r in boot.ranks if r[0] == dp})
    info.dp_ranks_seen = len({r[0] for r in boot.ranks})
    info.replayssm_ring_gib = lines.ring_gib
    page_size = boot.server_args.get("page_size")
    if isinstance(page_size, int) and not isinstance(page_size, bool) and page_size > 0:
        info.page_size = page_size
    # Every PP stage's pools (the inversion charges the largest stage's state share and keeps the KV row of the
    # stage with the most attention layers); a stage without attention or without state layers is read too.
    staged = sorted(r for r, other in boot.ranks.items() if r[0] == dp and other.has_any_pool())
    stage_ids = sorted({r[1] for r in staged})
    info.pp_ranks_seen = max(len(stage_ids), 1)
    for stage in stage_ids:
        stage_lines = boot.ranks[min(r for r in staged if r[1] == stage)]
        stage_state = stage_lines.states[0] if stage_lines.states else None
        stage_kv = stage_lines.post_kv or (stage_lines.kvs[0] if stage_lines.kvs else None)
        stage_draft = stage_lines.post_draft_kv or (stage_lines.kvs[1] if len(stage_lines.kvs) > 1 else None)
        info.stage_pools[stage] = (stage_state, stage_kv)
        info.stages[stage] = StagePools(
            max_mamba_cache_size=stage_state.max_mamba_cache_size if stage_state is not None else 0,
            kv_tokens=stage_kv.tokens if stage_kv is not None else 0,
            kv_pool_bytes=stage_kv.kv_gib * GIB if stage_kv is not None else 0.0,
            state_pool_bytes=stage_state.persistent_gib * GIB if stage_state is not None else None,
            draft_kv_pool_bytes=stage_draft.kv_gib * GIB if stage_draft is not None else 0.0,
            draft_kv_tokens=stage_draft.tokens if stage_draft is not None else None,
            replayssm_ring_bytes=stage_lines.ring_gib * GIB,
        )
    if info.state_pool_size_from_caps and 0 in info.stages:
        info.stages[0] = replace(info.stages[0], max_mamba_cache_size=info.state_pool.max_mamba_cache_size)
    return info


MAX_BOOT_LOG_BYTES = 256 << 20  # a whole server log may be named; a boot block is a few KB of it


def read_boot_log(path: str | Path) -> BootInfo:
    """Read and parse a boot log file; a missing or unreadable file is an InputError."""
    text = read_local_text(path, "boot log", MAX_BOOT_LOG_BYTES)  # a regular file only: a FIFO would hang
    return parse_boot_log(text, source=str(path))
