"""The free lever from SGLang's own memory gauges, for a server whose boot log is not followed.

Pure: GiB figures in (the `sglang:*_memory_*_gb` gauges or /server_info `memory_usage`), the idle memory
and a recommended --mem-fraction-static out, by the same thresholds as the boot-log path (`advice.free_lever`).
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.errors import InputError
from advisor.model.advice import MemoryFacts, free_lever
from advisor.model.pools import GIB


@dataclass(frozen=True)
class GaugeMemory:
    """What the gauges say of one GPU's memory, and what to do with the idle part."""

    idle_gib: float  # free after weights, pools and graph capture
    card_available_gib: float  # reconstructed pre-load free memory: idle + graphs + pools + weights
    mem_fraction_static: float
    recommended_mem_fraction_static: float | None  # None: no lever worth pulling
    note: str | None


def free_memory_from_gauges(
    *,
    startup_available_gib: float,
    weight_gib: float,
    graph_gib: float,
    mem_fraction_static: float,
    pool_bytes: float,
) -> GaugeMemory:
    """Idle memory and a recommended --mem-fraction-static from SGLang 0.5.23's gauges.

    `startup_available_gib` is `sglang:startup_available_gpu_memory_gb`: SGLang measures it in
    `Scheduler.__init__` after the worker (weights, pools, CUDA graphs) is built (managers/scheduler.py:1264-1266,
    the `available_gpu_mem` of the caps line), so it is the idle memory itself. The memory SGLang sized
    from (`pre_model_load_memory`, the base of mem_fraction_static) is rebuilt as idle + graphs + both
    pools + weights. `pool_bytes` is the two pools' bytes (state + KV) on one GPU.
    """
    figures = {
        "startup_available_gib": startup_available_gib,
        "weight_gib": weight_gib,
        "graph_gib": graph_gib,
        "pool_bytes": pool_bytes,
    }
    for name, value in figures.items():
        if value < 0:
            raise InputError(f"{name} must be >= 0, got {value:g}")
    if not 0 < mem_fraction_static < 1:
        raise InputError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static:g}")
    card = startup_available_gib + graph_gib + pool_bytes / GIB + weight_gib
    target, note = free_lever(
        MemoryFacts(
            card_available_gib=card,
            idle_after_graphs_gib=startup_available_gib,
            mem_fraction_static=mem_fraction_static,
        )
    )
    return GaugeMemory(
        idle_gib=startup_available_gib,
        card_available_gib=card,
        mem_fraction_static=mem_fraction_static,
        recommended_mem_fraction_static=target,
        note=note,
    )
