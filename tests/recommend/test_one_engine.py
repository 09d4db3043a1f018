"""Offline `recommend --boot-log` and the daemon's engine agree: for the same boot log and a point-mass workload
(every request the same length, steady), the same ratio, the same clamp at it and the same caveats."""

import pytest
from support import FIXTURES

from advisor.estimate.summary import WorkloadSummary
from advisor.feeder import serving_config_of
from advisor.model.advice import MemoryFacts, advise, caveats
from advisor.recommend.engine import RecommenderSettings, ServerModel, WorkloadPicture, recommend
from advisor.sources.bootlog import read_boot_log

BOOT_LOGS = [
    FIXTURES / "logs" / "boot-tp8-default.log",
    FIXTURES / "logs" / "runtime-kvbound-single.log",
    FIXTURES / "real" / "022-qwen3.5-9b-tp2-dev11582-2026-04-14-startup.log",
    FIXTURES / "real" / "011-qwen3.6-27b-awq-v0.5.11-rocm-tp2-full.log",
]


@pytest.mark.parametrize("path", BOOT_LOGS, ids=lambda p: p.name)
@pytest.mark.parametrize("context_length", [2048.0, 9216.0, 40000.0])
def test_offline_advice_is_the_engine_on_a_point_mass(path, context_length):
    boot = read_boot_log(str(path))
    serving = serving_config_of(None, boot)
    constants, rest = boot.constants(), boot.rest_bytes
    if constants is None or rest is None:
        pytest.skip(f"{path.name} gives no byte constants")
    context_len = boot.context_len or 262144
    offline = advise(serving, constants, context_length, rest_bytes=rest, memory=MemoryFacts(),
                     model_context_len=context_len)
    point_mass = WorkloadSummary(context_length_mean=context_length, effective_context_length=context_length,
                                 spikiness=0.0, requests_observed=10_000, history_seconds=3600.0)
    model = ServerModel(serving=serving, constants=constants, rest_bytes=rest, model_context_len=context_len)
    online = recommend(model, WorkloadPicture(point_mass, context_length, 1.0), RecommenderSettings())
    assert online.ratio == pytest.approx(offline.ratio, rel=1e-9)
    if offline.pin_max_mamba_cache_size is None:
        assert online.recommended_max_mamba_cache_size is None
        assert online.predicted_max_running_requests_recommended == offline.predicted_max_running_requests
    else:
        assert online.recommended_max_mamba_cache_size == offline.pin_max_mamba_cache_size
    shared = caveats(serving, constants)
    if (serving.kv_cache_dtype or "").startswith("fp8"):
        assert any("accuracy gate" in note for note in shared)  # the daemon reports the dtype gates too
    assert all(note in offline.notes for note in shared) and all(note in online.notes for note in shared)
