"""Reads an SGLang boot log into the numbers the dual-pool model needs.

Handles every TP rank's copy of each line, `[... DPk PPk TPk]` prefixes, uvicorn noise, several boots in one
file (the last complete one wins) and a draft model's second pool. Line templates: SGLang 0.5.23
`mem_cache/memory_pool.py` (pool lines), `managers/scheduler.py` (caps line), `kv_cache_configurator.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from advisor.errors import InputError
from advisor.model.pools import GIB, ByteConstants

_PREFIX = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)(?P<ranks>(?: [A-Z_]+\d+)*)\]\s?(?P<msg>.*)$"
)
_RANK = re.compile(r"([A-Z_]+?)(\d+)")
_MAMBA = re.compile(
    r"Mamba Cache is allocated\. max_mamba_cache_size: (?P<size>\d+), conv_state size: (?P<conv>[\d.]+) ?GB, "
    r"ssm_state size: (?P<ssm>[\d.]+) ?GB"
    r"(?:,? intermediate_ssm_state_cache size: (?P<iss>[\d.]+) ?GB)?"
    r"(?:,? intermediate_conv_window_cache size: (?P<icw>[\d.]+) ?GB)?"
)
_KV = re.compile(
    r"(?:(?P<label>\S+) )?KV Cache (?:is allocated|VA upper bound)\. dtype: (?P<dtype>[\w.]+), #tokens: (?P<tokens>\d+), "
    r"(?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)"
)
_LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=(?P<avail>[\d.]+) GB")
_LOAD_END = re.compile(
    r"Load weight end\..*?type=(?P<type>[\w.]+).*?avail mem=(?P<avail>[\d.]+) GB, mem usage=(?P<usage>[\d.]+) GB"
)
_POOL_END = re.compile(r"Memory pool end\. avail mem=(?P<avail>[\d.]+) GB")
_CAPS = re.compile(
    r"max_total_num_tokens=(?P<tokens>\d+), chunked_prefill_size=(?P<chunk>-?\d+), max_prefill_tokens=(?P<prefill>\d+), "
    r"max_running_requests=(?P<mrr>\d+), context_len=(?P<ctx>\d+), available_(?:gpu|cpu)_mem=(?P<avail>[\d.]+) GB"
)
_CAPPED = re.compile(
    r"max_running_requests is capped to (?P<cap>\d+) by the mamba state cache \(max_mamba_cache_size=(?P<size>\d+), "
    r"(?P<slots>\d+) state slots per request\)"
)
_SERVER_ARGS = re.compile(r"server_args=ServerArgs\((?P<body>.*)\)\s*$")
_ARG = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^,()]+)")


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
    dtype: str
    tokens: int
    kv_gib: float
    label: str | None = None


@dataclass
class BootInfo:
    """One SGLang boot as seen on the lowest DP/TP rank that printed it."""

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
    server_args: dict[str, object] = field(default_factory=dict)
    boots_in_file: int = 1
    page_size: int = 1

    @property
    def state_bytes_per_slot(self) -> float:
        """Per-slot bytes: the state tensors hold max_mamba_cache_size + 1 slots (one padding slot)."""
        return self.state_pool.persistent_gib * GIB / (self.state_pool.max_mamba_cache_size + 1)

    @property
    def kv_bytes_per_token(self) -> float:
        """Per-token bytes: the KV buffers hold #tokens + page_size slots (one padding page)."""
        return self.kv_pool.kv_gib * GIB / (self.kv_pool.tokens + self.page_size)

    @property
    def draft_kv_bytes_per_token(self) -> float:
        if self.draft_kv_pool is None or self.draft_kv_pool.tokens <= 0:
            return 0.0
        return self.draft_kv_pool.kv_gib * GIB / (self.draft_kv_pool.tokens + self.page_size)

    def constants(self) -> ByteConstants:
        return ByteConstants(self.state_bytes_per_slot, self.kv_bytes_per_token, self.draft_kv_bytes_per_token)

    @property
    def rest_bytes(self) -> float:
        """The budget both pools were cut from: state pool (with spec scratch) + KV pool, per GPU."""
        return (self.state_pool.total_gib + self.kv_pool.kv_gib) * GIB


@dataclass
class _Boot:
    lines_by_rank: dict[tuple[int, int], dict[str, list[re.Match[str]]]] = field(default_factory=dict)
    server_args: dict[str, object] = field(default_factory=dict)
    complete_markers: int = 0

    def add(self, rank: tuple[int, int], kind: str, match: re.Match[str]) -> None:
        self.lines_by_rank.setdefault(rank, {}).setdefault(kind, []).append(match)

    def has(self, kind: str) -> bool:
        return any(kind in kinds for kinds in self.lines_by_rank.values())


def _parse_value(raw: str) -> object:
    raw = raw.strip()
    if raw[:1] in "'\"":
        return raw[1:-1]
    if raw in ("True", "False"):
        return raw == "True"
    if raw == "None":
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def _ranks(prefix: str) -> tuple[int, int]:
    dims = {name: int(num) for name, num in _RANK.findall(prefix)}
    return dims.get("DP", 0), dims.get("TP", 0)


_MATCHERS = (
    ("load_begin", _LOAD_BEGIN),
    ("load_end", _LOAD_END),
    ("mamba", _MAMBA),
    ("kv", _KV),
    ("pool_end", _POOL_END),
    ("caps", _CAPS),
    ("capped", _CAPPED),
)


def _split_boots(text: str) -> list[_Boot]:
    boots: list[_Boot] = []
    current = _Boot()
    for raw in text.splitlines():
        m = _PREFIX.match(raw)
        msg = m.group("msg") if m else raw
        rank = _ranks(m.group("ranks")) if m else (0, 0)
        sa = _SERVER_ARGS.search(msg)
        if sa:
            if current.lines_by_rank:
                boots.append(current)
                current = _Boot()
            current.server_args = {k: _parse_value(v) for k, v in _ARG.findall(sa.group("body"))}
            continue
        for kind, pattern in _MATCHERS:
            hit = pattern.search(msg)
            if not hit:
                continue
            seen = current.lines_by_rank.get(rank, {})
            if kind == "load_begin" and ("mamba" in seen or "kv" in seen or "caps" in seen):
                boots.append(current)
                current = _Boot()
            current.add(rank, kind, hit)
            break
    if current.lines_by_rank or current.server_args:
        boots.append(current)
    return boots


def parse_boot_log(text: str, *, source: str = "boot log") -> BootInfo:
    """The last complete boot in `text`. Raises InputError naming the missing line."""
    boots = _split_boots(text)
    if not boots:
        raise InputError(f"{source}: no SGLang boot lines found (expected 'Mamba Cache is allocated' and 'KV Cache is allocated')")
    complete = [b for b in boots if b.has("mamba") and b.has("kv")]
    if not complete:
        last = boots[-1]
        missing = "'Mamba Cache is allocated' line" if not last.has("mamba") else "'KV Cache is allocated' line"
        hint = " (is this a hybrid Mamba/GDN/KDA model's log?)" if not last.has("mamba") else ""
        raise InputError(f"{source}: no {missing}{hint}")
    boot = complete[-1]
    ranks_with_pools = sorted(r for r, kinds in boot.lines_by_rank.items() if "mamba" in kinds and "kv" in kinds)
    if not ranks_with_pools:
        raise InputError(f"{source}: no rank printed both the 'Mamba Cache is allocated' and 'KV Cache is allocated' lines")
    rank = ranks_with_pools[0]
    kinds = boot.lines_by_rank[rank]

    def state_line(m: re.Match[str]) -> StatePoolLine:
        return StatePoolLine(
            max_mamba_cache_size=int(m.group("size")),
            conv_gib=float(m.group("conv")),
            ssm_gib=float(m.group("ssm")),
            intermediate_ssm_gib=float(m.group("iss") or 0.0),
            intermediate_conv_gib=float(m.group("icw") or 0.0),
        )

    def kv_line(m: re.Match[str]) -> KVPoolLine:
        if m.group("kv") is not None:
            size = float(m.group("kv"))
        else:
            size = float(m.group("k")) + float(m.group("v"))
        return KVPoolLine(dtype=m.group("dtype"), tokens=int(m.group("tokens")), kv_gib=size, label=m.group("label"))

    info = BootInfo(
        state_pool=state_line(kinds["mamba"][0]),
        kv_pool=kv_line(kinds["kv"][0]),
        server_args=boot.server_args,
        boots_in_file=len(boots),
    )
    if len(kinds["mamba"]) > 1:
        info.draft_state_pool = state_line(kinds["mamba"][1])
    if len(kinds["kv"]) > 1:
        info.draft_kv_pool = kv_line(kinds["kv"][1])
    if "load_begin" in kinds:
        info.avail_before_weights_gib = float(kinds["load_begin"][0].group("avail"))
    if "load_end" in kinds:
        end = kinds["load_end"][0]
        info.model_class = end.group("type")
        info.avail_after_weights_gib = float(end.group("avail"))
        info.weights_gib = float(end.group("usage"))
    if "pool_end" in kinds:
        info.memory_pool_end_avail_gib = float(kinds["pool_end"][0].group("avail"))
    # The caps line and the capped warning are printed by TP0 of each DP replica only.
    dp = rank[0]
    for other_rank in sorted(boot.lines_by_rank):
        other = boot.lines_by_rank[other_rank]
        if other_rank[0] != dp:
            continue
        if "caps" in other and info.max_total_num_tokens is None:
            caps = other["caps"][-1]
            info.max_total_num_tokens = int(caps.group("tokens"))
            info.max_running_requests = int(caps.group("mrr"))
            info.chunked_prefill_size = int(caps.group("chunk"))
            info.context_len = int(caps.group("ctx"))
            info.available_gpu_mem_gib = float(caps.group("avail"))
        if "capped" in other:
            info.capped_by_state_pool = True
            info.logged_slots_per_request = int(other["capped"][-1].group("slots"))
    info.tp_ranks_seen = len({r[1] for r in boot.lines_by_rank if r[0] == dp})
    info.dp_ranks_seen = len({r[0] for r in boot.lines_by_rank})
    page_size = boot.server_args.get("page_size")
    if isinstance(page_size, int) and page_size > 0:
        info.page_size = page_size
    return info


def read_boot_log(path: str | Path) -> BootInfo:
    """Read and parse a boot log file; a missing or unreadable file is an InputError."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"cannot read boot log {path}: {exc.strerror or exc}") from None
    return parse_boot_log(text, source=str(path))
