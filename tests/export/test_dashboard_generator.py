"""dashboards/generate.py, the one generator of both dashboards (Grafana's Foundation SDK) and of the
kustomize ConfigMap holding them: the committed files are what it writes, `--check` fails naming a stale
one, and the committed JSON decodes into the
SDK's typed models (dashboard, each panel type's options and field config, Prometheus queries) and encodes
back unchanged: no key Grafana's schema does not know, no value of the wrong type."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from promql_refs import DASHBOARD, DASHBOARD_GENERATOR, FLEET_DASHBOARD, REPO

if sys.version_info < (3, 11):
    pytest.skip("grafana-foundation-sdk needs Python >= 3.11", allow_module_level=True)

DASHBOARDS = {DASHBOARD.name: "sglang-pool-advisor", FLEET_DASHBOARD.name: "sglang-pool-advisor-fleet"}
# Everything the generator writes, relative to the repository.
WRITTEN = ["dashboards/sglang-pool-advisor.json", "dashboards/sglang-pool-advisor-fleet.json",
           "deploy/kubernetes/grafana-dashboards.yaml"]


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DASHBOARD_GENERATOR), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_committed_dashboards_are_what_the_generator_writes():
    result = generate("--check")
    assert result.returncode == 0, result.stderr


def test_check_names_a_stale_dashboard_and_writes_nothing(tmp_path: Path):
    for name in WRITTEN:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    stale = tmp_path / WRITTEN[1]
    edited = stale.read_text().replace("Top 10 predicted gains", "Top 9 predicted gains", 1)
    assert edited != stale.read_text()
    stale.write_text(edited)
    result = generate("--check", "--root", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == f"stale: {WRITTEN[1]}; run python3 dashboards/generate.py"
    assert stale.read_text() == edited  # --check never writes
    (tmp_path / WRITTEN[2]).unlink()  # a missing file is stale too
    result = generate("--check", "--root", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == f"stale: {WRITTEN[1]}, {WRITTEN[2]}; run python3 dashboards/generate.py"


def test_writes_both_dashboards_and_the_configmap(tmp_path: Path):
    result = generate("--root", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*") if path.is_file()) == sorted(WRITTEN)
    for name in WRITTEN:
        assert (tmp_path / name).read_text() == (REPO / name).read_text(), name


def test_a_missing_root_is_a_usage_error(tmp_path: Path):
    result = generate("--check", "--root", str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "is not a directory" in result.stderr


def round_trip(document: dict) -> dict:
    """The document decoded into the SDK's typed models (panel options by panel type) and encoded again."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    again = json.loads(json.dumps(Dashboard.from_json(document), cls=JSONEncoder))
    again["id"] = None  # the model leaves a null id out; Grafana assigns one on import
    return again


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_committed_json_round_trips_through_the_sdk_models(name: str):
    document = json.loads((DASHBOARD.parent / name).read_text())
    assert document["uid"] == DASHBOARDS[name] and document["id"] is None
    assert round_trip(document) == document


def test_round_trip_catches_a_misspelt_option():
    document = json.loads(DASHBOARD.read_text())
    panel = next(p for p in document["panels"] if p["type"] == "timeseries")
    panel["options"]["legend"]["showLegends"] = True
    assert round_trip(document) != document
