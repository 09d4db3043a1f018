"""Workloads: the shipped library, arrival processes, length distributions, phases, spikes,
replay of both SGLang request-log formats, and errors that name the offending field."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from advisor.errors import InputError
from advisor.sim.workload import (
    UNSET_MAX_NEW_TOKENS,
    available_workloads,
    load_replay,
    load_workload,
    workload_from_dict,
)

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
REQUESTS_JSON = LOGS / "requests-json.log"
REQUEST_METRICS = LOGS / "sglang-request-metrics-20261129_15.log"

REQUIRED = {
    "steady-chat",
    "steady-long-docs",
    "bimodal-chat-docs",
    "heavy-tail-outputs",
    "regime-shift",
    "diurnal",
    "doc-bursts",
    "overload",
    "spec-decode",
    "dcp",
    "demo",
    "rag-long-prompt",
    "reasoning-long-output",
    "agentic-sessions",
    "underload",
    "bursty-mixed",
}


def _one_class(**overrides: object) -> dict:
    workload = {
        "arrival": {"process": "poisson", "rate": 10},
        "classes": [
            {"name": "a", "input": {"median": 1000, "sigma": 0.5}, "output": {"median": 200, "sigma": 0.5}}
        ],
    }
    workload.update(overrides)
    return workload


def test_library_ships_the_named_workloads():
    assert REQUIRED <= set(available_workloads())
    for name in available_workloads():
        workload = load_workload(name)
        specs = workload.requests(seed=0, duration=600)
        assert specs, name
        assert all(s.output_tokens <= s.max_new_tokens for s in specs)
        assert all(s.input_tokens >= 1 and s.output_tokens >= 1 for s in specs)


def test_the_benchmarks_held_out_shapes_load_and_differ_from_the_library():
    heldout = sorted((Path(__file__).resolve().parents[2] / "bench" / "heldout").glob("*.yaml"))
    assert len(heldout) >= 5
    for path in heldout:
        workload = load_workload(str(path))
        assert workload.name == path.stem and workload.name not in available_workloads()
        specs = workload.requests(seed=0, duration=600)
        assert specs, path.name
        assert all(s.output_tokens <= s.max_new_tokens for s in specs)


def test_workloads_name_their_server_configs():
    assert load_workload("spec-decode").server == "spec"
    assert load_workload("dcp").server == "dcp8"
    assert load_workload("demo").server == "default"


def test_demo_optimum_is_far_from_the_default_ratio():
    # r* = S * token_equiv / L for the example model (S = 5, token_equiv ~ 4065)
    formula = 5 * 4065 / load_workload("demo").mean_context(seed=0, duration=1800)
    assert formula > 4


def test_arrivals_are_deterministic_sorted_and_windowed():
    workload = load_workload("bimodal-chat-docs")
    first = workload.requests(seed=11, duration=900)
    assert first == workload.requests(seed=11, duration=900)
    assert first != workload.requests(seed=12, duration=900)
    times = [s.time for s in first]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 900
    window = list(workload.arrivals(np.random.default_rng(11), 300.0, 600.0))
    assert window == [s for s in first if 300 <= s.time < 600]


def test_poisson_rate_and_lognormal_medians():
    workload = workload_from_dict(_one_class())
    specs = workload.requests(seed=1, duration=2000)
    assert len(specs) == pytest.approx(10 * 2000, rel=0.05)
    assert np.median([s.input_tokens for s in specs]) == pytest.approx(1000, rel=0.05)
    mean_form = workload_from_dict(
        _one_class(
            classes=[{"input": {"mean": 1000, "sigma": 0.5}, "output": {"fixed": 50}, "max_new_tokens": 50}]
        )
    )
    sample = mean_form.requests(seed=1, duration=2000)
    assert np.mean([s.input_tokens for s in sample]) == pytest.approx(1000, rel=0.05)
    assert {s.output_tokens for s in sample} == {50} and {s.max_new_tokens for s in sample} == {50}


def test_lengths_are_clipped_to_their_bounds():
    workload = workload_from_dict(
        _one_class(classes=[{"input": {"median": 1000, "sigma": 2.0, "min": 500, "max": 1500}, "output": 10}])
    )
    inputs = [s.input_tokens for s in workload.requests(seed=2, duration=200)]
    assert min(inputs) == 500 and max(inputs) == 1500


def test_max_new_tokens_policies():
    multiple = workload_from_dict(
        _one_class(
            classes=[
                {"input": 100, "output": {"median": 200, "sigma": 0.5}, "max_new_tokens": {"multiple": 3}}
            ]
        )
    )
    for spec in multiple.requests(seed=3, duration=100):
        assert spec.max_new_tokens == math.ceil(3 * spec.output_tokens)
    capped = workload_from_dict(
        _one_class(
            classes=[
                {"input": 100, "output": {"median": 2000, "sigma": 0.5}, "max_new_tokens": {"fixed": 1000}}
            ]
        )
    )
    specs = capped.requests(seed=3, duration=100)
    assert max(s.output_tokens for s in specs) == 1000  # a request stops at its cap
    assert {s.max_new_tokens for s in specs} == {1000}


def test_onoff_bursts_only_arrive_while_on():
    workload = workload_from_dict(
        _one_class(
            arrival={"process": "onoff", "on_rate": 20, "off_rate": 0, "on_seconds": 10, "off_seconds": 30}
        )
    )
    specs = workload.requests(seed=4, duration=400)
    assert specs and all(s.time % 40 < 10 for s in specs)
    assert len(specs) == pytest.approx(20 * 10 * 10, rel=0.15)


def test_diurnal_rate_follows_the_sine():
    workload = workload_from_dict(
        _one_class(arrival={"process": "diurnal", "rate": 10, "amplitude": 0.8, "period_seconds": 1000})
    )
    times = np.array([s.time for s in workload.requests(seed=5, duration=1000)])
    peak = ((times >= 0) & (times < 500)).sum()  # sin > 0
    trough = ((times >= 500) & (times < 1000)).sum()
    assert peak > 2 * trough
    assert len(times) == pytest.approx(10 * 1000, rel=0.1)


def test_phases_shift_the_class_mix_and_rate():
    workload = workload_from_dict(
        {
            "arrival": {"process": "poisson", "rate": 10},
            "classes": [
                {"name": "chat", "input": {"fixed": 100}, "output": 10},
                {"name": "docs", "input": {"fixed": 50000}, "output": 10},
            ],
            "phases": [
                {"duration": 100, "weights": {"chat": 1}},
                {"duration": 100, "rate": 2, "weights": {"docs": 1}},
            ],
        }
    )
    specs = workload.requests(seed=6, duration=400)
    for spec in specs:
        in_first = spec.time % 200 < 100
        assert spec.input_tokens == (100 if in_first else 50000)
    docs = sum(s.input_tokens == 50000 for s in specs)
    assert docs == pytest.approx(2 * 200, rel=0.25)


def test_spikes_add_long_documents_only_inside_their_windows():
    workload = load_workload("doc-bursts")
    specs = workload.requests(seed=7, duration=1200)
    long_docs = [s for s in specs if s.input_tokens >= 20000]
    assert long_docs
    assert all((s.time - 150) % 300 < 30 for s in long_docs)


def test_prefix_groups_are_assigned():
    workload = workload_from_dict(
        _one_class(
            classes=[
                {
                    "name": "agent",
                    "input": {"fixed": 5000},
                    "output": 10,
                    "prefix": {"groups": 3, "tokens": 4000},
                }
            ]
        )
    )
    specs = workload.requests(seed=8, duration=60)
    assert {s.prefix_group for s in specs} == {"agent-0", "agent-1", "agent-2"}
    assert {s.prefix_tokens for s in specs} == {4000}


# ------------------------------------------------------------------ replay


def _fixture_records(path: Path) -> list[dict]:
    records = []
    for line in path.read_text().splitlines():
        data = json.loads(line[line.index("{") :])
        records.append(data["out"]["meta_info"] if "out" in data else data)
    return records


def test_replay_of_log_requests_json_uses_finish_time_minus_latency():
    workload = load_workload(str(REQUESTS_JSON))
    trace = workload.replay
    assert trace is not None and trace.offsets is not None
    records = _fixture_records(REQUESTS_JSON)
    assert len(trace.input_tokens) == len(records) == 500
    assert int(trace.input_tokens.sum()) == sum(r["prompt_tokens"] for r in records)
    assert int(trace.output_tokens.sum()) == sum(r["completion_tokens"] for r in records)
    # the first request finished 15:00:01.046830 after 6.7388 s; arrivals are sorted offsets from the earliest
    lines = REQUESTS_JSON.read_text().splitlines()
    first = json.loads(lines[0][lines[0].index("{") :])
    assert first["out"]["meta_info"]["e2e_latency"] == pytest.approx(6.7388)
    assert trace.offsets[0] == 0 and np.all(np.diff(trace.offsets) >= 0)
    specs = workload.requests(seed=0, duration=float(trace.offsets[-1]) + 1e-6)
    assert len(specs) == 500
    # finish_reason length: the request stopped at its cap, so max_new_tokens = completion_tokens
    assert all(s.max_new_tokens == s.output_tokens for s in specs)


def test_replay_of_export_metrics_file_arrives_at_the_given_rate_and_loops():
    workload = workload_from_dict({"replay": {"path": str(REQUEST_METRICS), "rate": 4.0}}, name="metrics")
    trace = workload.replay
    assert trace is not None and trace.offsets is None  # that format has no timestamps
    records = _fixture_records(REQUEST_METRICS)
    assert int(trace.input_tokens.sum()) == sum(r["prompt_tokens"] for r in records)
    specs = workload.requests(seed=1, duration=250)  # ~1000 arrivals: the 500 records twice
    assert len(specs) == pytest.approx(1000, rel=0.1)
    assert [s.input_tokens for s in specs[:500]] == [r["prompt_tokens"] for r in records]
    assert specs[500].input_tokens == records[0]["prompt_tokens"]
    no_loop = workload_from_dict({"replay": {"path": str(REQUEST_METRICS), "rate": 4.0, "loop": False}})
    assert len(no_loop.requests(seed=1, duration=10_000)) == 500


def test_replay_paths_are_relative_to_the_workload_file(tmp_path):
    (tmp_path / "trace.log").write_text(REQUESTS_JSON.read_text())
    (tmp_path / "mine.yaml").write_text("name: mine\nreplay: {path: trace.log, speed: 2.0, loop: false}\n")
    workload = load_workload(str(tmp_path / "mine.yaml"))
    full = load_replay(REQUESTS_JSON)
    assert workload.replay is not None and full.offsets is not None and workload.replay.offsets is not None
    assert workload.replay.offsets[-1] == pytest.approx(full.offsets[-1] / 2)


def test_replay_of_garbage_is_an_input_error(tmp_path):
    path = tmp_path / "garbage.log"
    path.write_text('not a log\n{"hello": 1}\n')
    with pytest.raises(InputError, match="no request records"):
        workload_from_dict({"replay": {"path": str(path)}})


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (
            _one_class(classes=[{"input": {"median": 100, "sigma": "wide"}, "output": 10}]),
            "classes[0].input.sigma",
        ),
        (
            _one_class(classes=[{"input": {"median": 100}, "output": {"median": -5}}]),
            "classes[0].output.median",
        ),
        (_one_class(classes=[{"input": {"median": 100, "mean": 90}, "output": 10}]), "classes[0].input"),
        (_one_class(classes=[{"output": 10}]), "classes[0].input"),
        (
            _one_class(classes=[{"input": 10, "output": 10, "max_new_tokens": {"multiple": 0.5}}]),
            "classes[0].max_new_tokens.multiple",
        ),
        (_one_class(classes=[{"input": 10, "output": 10, "colour": "red"}]), "classes[0].colour"),
        (_one_class(classes=[]), "classes"),
        (_one_class(arrival={"process": "poisson"}), "arrival.rate"),
        (_one_class(arrival={"process": "fractal", "rate": 1}), "arrival.process"),
        (_one_class(arrival={"process": "diurnal", "rate": 1, "amplitude": 2}), "arrival.amplitude"),
        (_one_class(phases=[{"duration": 10, "weights": {"nope": 1}}]), "phases[0].weights.nope"),
        (_one_class(phases=[{"weights": {"a": 1}}]), "phases[0].duration"),
        (_one_class(spikes=[{"every": 10, "duration": 20, "rate": 1, "class": "a"}]), "spikes[0].duration"),
        (_one_class(spikes=[{"every": 10, "duration": 2, "rate": 1}]), "spikes[0].class"),
        (_one_class(tempo=3), "workload.tempo"),
        ({"replay": {"rate": 1}}, "replay.path"),
    ],
)
def test_workload_errors_name_the_field(data, field):
    with pytest.raises(InputError, match=field.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        workload_from_dict(data)


def test_bad_workload_files_are_input_errors(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("classes: [unclosed\n")
    with pytest.raises(InputError, match="broken.yaml: not valid YAML"):
        load_workload(str(broken))
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("arrival: {process: poisson, rate: 1}\nclasses:\n  - {input: {median: 0}, output: 1}\n")
    with pytest.raises(InputError, match=r"wrong.yaml: classes\[0\]\.input\.median"):
        load_workload(str(wrong))
    with pytest.raises(InputError, match="neither a file nor a shipped workload"):
        load_workload("no-such-workload")


def test_sparse_and_finite_workloads_terminate():
    sparse = workload_from_dict(_one_class(arrival={"process": "poisson", "rate": 0.0001}))
    assert len(sparse.requests(seed=0, duration=600)) <= 2  # empty blocks do not hang the window
    finite = workload_from_dict(
        _one_class(phases=[{"duration": 120}, {"duration": 60, "rate_scale": 0}], phases_repeat=False)
    )
    specs = list(finite.arrivals(np.random.default_rng(0)))  # no end: stops once silent for good
    assert specs and max(s.time for s in specs) < 120


def test_replay_workloads_compare_and_hash_by_identity():
    first, second = load_workload(str(REQUESTS_JSON)), load_workload(str(REQUESTS_JSON))
    assert first == first and first != second
    assert len({first, second}) == 2


def _sessions(**overrides: object) -> dict:
    session = {
        "name": "agent",
        "rate": 0.05,
        "turns": {"fixed": 5},
        "first_input": {"fixed": 4000},
        "turn_input": {"fixed": 300},
        "output": {"fixed": 100},
        "max_new_tokens": 1000,
        "think_seconds": {"fixed": 2},
    }
    session.update(overrides)
    return {"sessions": [session]}


def test_sessions_resend_the_conversation_so_their_prefix_grows_turn_by_turn():
    specs = workload_from_dict(_sessions()).requests(seed=4, duration=3600)
    by_session: dict[str, list] = {}
    for spec in specs:
        by_session.setdefault(spec.prefix_group, []).append(spec)
    assert len(by_session) == pytest.approx(0.05 * 3600, rel=0.25)
    complete = [turns for turns in by_session.values() if turns[0].time < 3000]
    for turns in complete:
        assert [t.input_tokens for t in turns] == [4000, 4400, 4800, 5200, 5600]
        # each turn's prefix is the previous turn's input + output, the sequence the radix cache holds
        assert [t.prefix_tokens for t in turns] == [0, 4100, 4500, 4900, 5300]
        assert all(t.extends_prefix for t in turns)
        gaps = np.diff([t.time for t in turns])
        assert np.allclose(gaps, 100 * 0.03 + 2.0)  # the answer at the client's pace + the think time
    assert load_workload("agentic-sessions").mean_rate > 1.0


def test_a_session_ends_before_its_context_passes_the_cap():
    specs = workload_from_dict(_sessions(turns={"fixed": 50}, max_context=6000)).requests(seed=1, duration=1200)
    assert specs and max(s.input_tokens + s.output_tokens for s in specs) <= 6000


def test_clients_without_max_tokens_send_the_unset_marker():
    mixed = workload_from_dict(
        _one_class(
            classes=[{"input": 100, "output": 50, "max_new_tokens": {"fixed": 500, "unset_fraction": 0.4}}]
        )
    )
    caps = [s.max_new_tokens for s in mixed.requests(seed=5, duration=200)]
    assert set(caps) == {500, UNSET_MAX_NEW_TOKENS}
    assert caps.count(UNSET_MAX_NEW_TOKENS) / len(caps) == pytest.approx(0.4, abs=0.05)
    unset = workload_from_dict(_one_class(classes=[{"input": 100, "output": 50, "max_new_tokens": {"unset": True}}]))
    assert {s.max_new_tokens for s in unset.requests(seed=5, duration=50)} == {UNSET_MAX_NEW_TOKENS}
    with pytest.raises(InputError, match=r"max_new_tokens\.unset cannot be combined"):
        workload_from_dict(
            _one_class(classes=[{"input": 1, "output": 1, "max_new_tokens": {"unset": True, "fixed": 3}}])
        )
    with pytest.raises(InputError, match=r"unset_fraction must be in \[0, 1\]"):
        workload_from_dict(
            _one_class(classes=[{"input": 1, "output": 1, "max_new_tokens": {"fixed": 3, "unset_fraction": 2}}])
        )


def test_scaled_multiplies_every_arrival_rate():
    for name in ("bursty-mixed", "regime-shift", "agentic-sessions", "diurnal"):
        workload = load_workload(name)
        base = len(workload.requests(seed=2, duration=3600))
        assert len(workload.scaled(0.5).requests(seed=2, duration=3600)) == pytest.approx(base / 2, rel=0.12), name
    with pytest.raises(ValueError, match="rate factor"):
        load_workload("steady-chat").scaled(0)
