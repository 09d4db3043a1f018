"""The free lever from SGLang's memory gauges (advisor.model.memory), worked by hand.

`startup_available_gpu_memory_gb` is measured after the worker is built (SGLang 0.5.23
managers/scheduler.py:1264-1266), so it is the idle memory; the card is idle + graphs + pools + weights.
"""

from __future__ import annotations

import pytest

from advisor.errors import InputError
from advisor.model.memory import free_memory_from_gauges
from advisor.model.pools import GIB

# The seed's TP8 boot (boot-tp8-default.log): weights 114.35 GiB, pools 0.46 + 13.04 + 15.03 GiB,
# decode graphs 1.73 GiB, caps line available_gpu_mem=29.97 GB, mem_fraction_static 0.85.
POOLS = (0.46 + 13.04 + 15.03) * GIB


def test_idle_memory_after_graphs_raises_mem_fraction_static() -> None:
    memory = free_memory_from_gauges(
        startup_available_gib=29.97, weight_gib=114.35, graph_gib=1.73, mem_fraction_static=0.85, pool_bytes=POOLS
    )
    card = 29.97 + 1.73 + 28.53 + 114.35  # 174.58 GiB
    assert memory.card_available_gib == pytest.approx(card)
    assert memory.idle_gib == 29.97
    # headroom max(4, 0.05 * 174.58) = 8.73; 0.85 + (29.97 - 8.73) / 174.58 = 0.97 -> the 0.92 ceiling
    assert memory.recommended_mem_fraction_static == pytest.approx(0.92)
    assert memory.note is not None and "30.0 GiB sits idle" in memory.note


def test_moderate_idle_gives_a_partial_raise() -> None:
    # card 100 GiB: idle 12, headroom max(4, 5) = 5 -> 0.80 + 7 / 100 = 0.87
    memory = free_memory_from_gauges(
        startup_available_gib=12.0, weight_gib=40.0, graph_gib=3.0, mem_fraction_static=0.80, pool_bytes=45 * GIB
    )
    assert memory.card_available_gib == pytest.approx(100.0)
    assert memory.recommended_mem_fraction_static == pytest.approx(0.87)


def test_little_idle_memory_is_no_lever() -> None:
    memory = free_memory_from_gauges(
        startup_available_gib=5.0, weight_gib=40.0, graph_gib=2.0, mem_fraction_static=0.88, pool_bytes=40 * GIB
    )
    assert memory.recommended_mem_fraction_static is None and memory.note is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"mem_fraction_static": 1.2}, "mem_fraction_static"), ({"weight_gib": -1.0}, "weight_gib")],
)
def test_bad_figures_name_the_field(kwargs: dict, field: str) -> None:
    args = {"startup_available_gib": 10.0, "weight_gib": 40.0, "graph_gib": 1.0, "mem_fraction_static": 0.85,
            "pool_bytes": 10 * GIB}
    args.update(kwargs)
    with pytest.raises(InputError, match=field):
        free_memory_from_gauges(**args)
