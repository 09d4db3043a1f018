"""The scheduler model's results against a stored reference: every figure of a goodput run (simulate) and a
summary of the event stream the emulator reads, on self-contained traffic over the shipped server shapes (TP8,
speculative decoding, DCP, DP2, retracted-to-front) at state-bound, balanced and KV-bound ratios. The engine is
rewritten for speed from time to time; its results must not move (the quality benchmark's oracle is cached by
the engine's fingerprint). `tests/fixtures/scheduler/README.md` says which engine computed the reference.

Regenerate (only when the model is meant to change): `python tests/scheduler/test_engine_reference.py`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from advisor.scheduler.engine import UNSET_MAX_NEW_TOKENS, Simulator, simulate
from advisor.scheduler.types import DecodeTick, PrefillBatch, RequestFinished, RequestSpec, Retraction
from advisor.sim.config import server_config_from_dict
from advisor.sim.workload import workload_from_dict

REFERENCE = Path(__file__).resolve().parent.parent / "fixtures" / "scheduler" / "engine_reference.json"
RELATIVE = 1e-9  # float figures may differ by rounding only

_CONSTANTS = {"state_bytes_per_slot": "13.50 GiB / 258", "kv_bytes_per_token": "15.03 GiB / 1167552"}
# advisor/data/servers/{default,spec,dcp8}.yaml as of this reference, inline so that retuning them does not move it
SERVERS: dict[str, dict[str, Any]] = {
    "tp8": {
        "name": "tp8", "enable_radix_prefix_reuse": True, "rest_bytes": "28.53 GiB", "constants": _CONSTANTS,
        "serving": {"tp_size": 8, "strategy": "auto", "mamba_full_memory_ratio": 0.9,
                    "kv_cache_dtype": "fp8_e4m3", "mamba_ssm_dtype": "float32", "mem_fraction_static": 0.85},
    },
    "spec": {
        "name": "spec", "enable_radix_prefix_reuse": True, "rest_bytes": "28.53 GiB", "constants": _CONSTANTS,
        "cost": {"spec_accept_length": 2.5, "spec_verify_per_draft_token": 0.15},
        "serving": {"tp_size": 8, "strategy": "auto", "speculative_algorithm": "EAGLE", "draft_tokens": 4,
                    "mamba_full_memory_ratio": 0.9, "kv_cache_dtype": "fp8_e4m3", "mamba_ssm_dtype": "float32"},
    },
    "dcp8": {
        "name": "dcp8", "enable_radix_prefix_reuse": True, "rest_bytes": "27.64 GiB", "constants": _CONSTANTS,
        "serving": {"tp_size": 8, "dcp_size": 8, "strategy": "auto", "mamba_full_memory_ratio": 5.97,
                    "kv_cache_dtype": "fp8_e4m3", "mamba_ssm_dtype": "float32"},
    },
}
UNUSED = workload_from_dict({"arrival": {"process": "poisson", "rate": 1}, "classes": [{"input": 100, "output": 10}]})


def _traffic(shape: str, seed: int, duration: float) -> list[RequestSpec]:
    """Deterministic traffic from the standard library's generator (its random() is stable across versions)."""
    rng = random.Random(seed)

    def exp(mean: float) -> float:
        return -mean * math.log(1.0 - rng.random())

    specs: list[RequestSpec] = []
    t = 0.0
    if shape == "sessions":  # multi-turn sessions whose cached prefix grows turn by turn
        session = 0
        while t < duration:
            t += exp(2.0)
            context, turn_time = 3000 + int(exp(3000)), t
            for _ in range(2 + int(exp(6))):
                output = 20 + int(exp(250))
                unset = rng.random() < 0.5
                specs.append(RequestSpec(turn_time, context, output, UNSET_MAX_NEW_TOKENS if unset else 8192,
                                         prefix_group=f"s{session}", prefix_tokens=max(0, context - 400),
                                         extends_prefix=True))
                context += output + 50 + int(exp(600))
                turn_time += exp(3.0) + 1.0
            session += 1
        return sorted(specs, key=lambda spec: spec.time)
    rate, prompt, output, cap = {"chat": (6.0, 1500, 500, 2048), "long": (0.9, 12000, 4000, 16384)}[shape]
    while t < duration:
        t += exp(1.0 / rate)
        tokens = 1 + int(exp(prompt))
        generated = 1 + int(exp(output))
        unset = rng.random() < 0.5
        specs.append(RequestSpec(t, tokens, generated if unset else min(generated, cap),
                                 UNSET_MAX_NEW_TOKENS if unset else cap))
    # refused at arrival: an input over the context, and a client cap that overruns it
    specs.append(RequestSpec(duration / 2, 300000, 10, 100))
    specs.append(RequestSpec(duration / 3, 200000, 10, 100000))
    return sorted(specs, key=lambda spec: spec.time)


# (server, variant, traffic shape, ratios): state-bound, balanced and KV-bound ratios for each
CASES = [
    ("tp8", "", "chat", (0.4, 2.0, 12.0)),
    ("tp8", "", "long", (0.6, 3.0, 14.0)),
    ("tp8", "", "sessions", (0.4, 2.0, 14.0)),
    ("tp8", "dp2", "chat", (0.4, 6.0)),
    ("tp8", "front", "long", (14.0,)),
    ("spec", "", "chat", (0.5, 8.0)),
    ("dcp8", "", "long", (0.8, 40.0)),
]
DURATION, WARMUP = 900.0, 90.0


def _server(name: str, variant: str, ratio: float) -> Any:
    server = server_config_from_dict(SERVERS[name]).with_ratio(ratio)
    if variant == "dp2":
        server = dataclasses.replace(server, serving=dataclasses.replace(server.serving, dp_size=2))
    elif variant == "front":
        server = dataclasses.replace(server, retract_to_front=True)
    return server


def _event_summary(server: Any, traffic: list[RequestSpec]) -> dict[str, Any]:
    """The emulator's path: log lines on, advanced in uneven slices, with requests submitted on the way."""
    sim = Simulator(server, UNUSED, arrivals=traffic, seed=5)
    summary: dict[str, Any] = {}
    t, index = 0.0, 0
    while t < 600.0:
        t += 0.7 + (index % 7) * 1.3
        index += 1
        if index % 5 == 0:
            sim.submit(RequestSpec(t, 3000 + 100 * index, 300, UNSET_MAX_NEW_TOKENS))
        for event in sim.advance(t):
            kind = type(event).__name__
            row = summary.setdefault(kind, {"count": 0, "time": 0.0})
            row["count"] += 1
            row["time"] += event.time
            if isinstance(event, DecodeTick):
                for name in ("running_requests", "queued_requests", "kv_used_tokens", "gen_throughput"):
                    row[name] = row.get(name, 0) + getattr(event, name)
            elif isinstance(event, PrefillBatch):
                for name in ("new_seqs", "new_tokens", "cached_tokens", "queued_requests", "input_throughput"):
                    row[name] = row.get(name, 0) + getattr(event, name)
            elif isinstance(event, RequestFinished):
                for name in ("completion_tokens", "cached_tokens", "num_retractions", "queue_time", "e2e_latency",
                             "aborted"):
                    row[name] = row.get(name, 0) + getattr(event, name)
            elif isinstance(event, Retraction):
                for name in ("retracted_requests", "output_tokens", "new_tokens_gained", "new_token_ratio_after"):
                    row[name] = row.get(name, 0) + getattr(event, name)
    summary["snapshot"] = dataclasses.asdict(sim.snapshot())
    return summary


def reference_results() -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, variant, shape, ratios in CASES:
        traffic = _traffic(shape, 7, DURATION)
        for ratio in ratios:
            server = _server(name, variant, ratio)
            result = simulate(server, UNUSED, duration=DURATION, warmup=WARMUP, arrivals=traffic)
            results[f"simulate/{name}{'-' + variant if variant else ''}/{shape}/{ratio}"] = result.to_dict()
    for name, shape, ratio in (("tp8", "sessions", 2.0), ("spec", "chat", 8.0), ("tp8", "long", 14.0)):
        results[f"events/{name}/{shape}/{ratio}"] = _event_summary(_server(name, "", ratio),
                                                                   _traffic(shape, 11, 600.0))
    return json.loads(json.dumps(results))  # as stored: tuples as lists, keys as strings


def _differences(expected: Any, actual: Any, path: str) -> list[str]:
    if isinstance(expected, dict) and isinstance(actual, dict):
        if set(expected) != set(actual):
            return [f"{path}: fields {sorted(set(expected) ^ set(actual))} differ"]
        return [d for key in expected for d in _differences(expected[key], actual[key], f"{path}.{key}")]
    if isinstance(expected, float) or isinstance(actual, float):
        if isinstance(expected, (int, float)) and isinstance(actual, (int, float)) and (
            expected == actual or abs(expected - actual) <= RELATIVE * max(abs(expected), abs(actual))
        ):
            return []
        return [f"{path}: {actual!r}, reference {expected!r}"]
    return [] if expected == actual else [f"{path}: {actual!r}, reference {expected!r}"]


def test_the_cases_exercise_every_pool_outcome() -> None:
    """The reference is only worth its name if it covers state-bound and KV-bound runs, retractions and refusals."""
    reference = json.loads(REFERENCE.read_text())
    runs = [row for key, row in reference.items() if key.startswith("simulate/")]
    assert any(row["state_bound_fraction"] > 0.5 for row in runs)
    assert any(row["kv_bound_fraction"] > 0.5 for row in runs)
    assert any(row["retractions"] > 0 for row in runs)
    assert any(row["aborted_requests"] > 0 for row in runs)
    assert any(row["dp_size"] == 2 for row in runs)
    events = [row for key, row in reference.items() if key.startswith("events/")]
    assert any("Retraction" in row for row in events)
    assert all(row["DecodeTick"]["count"] > 0 and row["PrefillBatch"]["count"] > 0 for row in events)


@pytest.mark.parametrize("prefix", ["simulate/", "events/"])
def test_results_match_the_reference(prefix: str) -> None:
    reference = {key: row for key, row in json.loads(REFERENCE.read_text()).items() if key.startswith(prefix)}
    actual = {key: row for key, row in reference_results().items() if key.startswith(prefix)}
    differences = _differences(reference, actual, prefix.rstrip("/"))
    assert not differences, "\n".join(differences[:20])


if __name__ == "__main__":
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_text(json.dumps(reference_results(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {REFERENCE}", file=sys.stderr)
