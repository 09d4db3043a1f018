"""dashboards/generate.py, the one generator of both dashboards (Grafana's Foundation SDK): the committed
JSON is what it writes, `--check` fails naming a stale dashboard, and the committed JSON decodes into the
SDK's typed models (dashboard, each panel type's options and field config, Prometheus queries) and encodes
back unchanged: no key Grafana's schema does not know, no value of the wrong type."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from promql_refs import DASHBOARD, DASHBOARD_GENERATOR, FLEET_DASHBOARD

if sys.version_info < (3, 11):
    pytest.skip("grafana-foundation-sdk needs Python >= 3.11", allow_module_level=True)

DASHBOARDS = {DASHBOARD.name: "sglang-pool-advisor", FLEET_DASHBOARD.name: "sglang-pool-advisor-fleet"}


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DASHBOARD_GENERATOR), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_committed_dashboards_are_what_the_generator_writes():
    result = generate("--check")
    assert result.returncode == 0, result.stderr


def test_check_names_a_stale_dashboard_and_writes_nothing(tmp_path: Path):
    for name in DASHBOARDS:
        shutil.copy(DASHBOARD.parent / name, tmp_path / name)
    stale = tmp_path / FLEET_DASHBOARD.name
    edited = stale.read_text().replace("Top 10 predicted gains", "Top 9 predicted gains", 1)
    assert edited != stale.read_text()
    stale.write_text(edited)
    result = generate("--check", "--dir", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == (f"stale dashboards: {FLEET_DASHBOARD.name}; "
                                     "run python3 dashboards/generate.py")
    assert stale.read_text() == edited  # --check never writes
    (tmp_path / DASHBOARD.name).unlink()  # a missing dashboard is stale too
    result = generate("--check", "--dir", str(tmp_path))
    assert result.returncode == 1 and DASHBOARD.name in result.stderr and FLEET_DASHBOARD.name in result.stderr


def test_writes_both_dashboards(tmp_path: Path):
    result = generate("--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(DASHBOARDS)
    for name in DASHBOARDS:
        assert (tmp_path / name).read_text() == (DASHBOARD.parent / name).read_text(), name


def test_a_missing_directory_is_a_usage_error(tmp_path: Path):
    result = generate("--check", "--dir", str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "is not a directory" in result.stderr
    assert len(result.stderr.strip().splitlines()[-1:]) == 1


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
