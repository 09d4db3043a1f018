"""The landing page's server-side SVG charts, from a real daemon watching an emulated server: the pool
model's curves with live and recommended r, the context histogram with its quantiles, the history; then
a screenshot in headless Chromium (Debian `chromium`) to show the page renders."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import time
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prom_harness import REQUIRE_BINARIES_ENV

from advisor.config import config_from_dict
from advisor.daemon.runner import Advisor
from advisor.export.server import ExporterServer
from advisor.export.svg import concurrency_curve
from advisor.recommend.replay import ReplaySettings
from advisor.sim.config import load_server_config
from advisor.sim.emulator import EmulatedServer
from advisor.sim.workload import load_workload

SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def watched(tmp_path_factory) -> Iterator[Advisor]:
    """An advisor that has watched the demo workload on an emulated server until it recommends."""
    workdir = tmp_path_factory.mktemp("watched")
    log_path = str(workdir / "sglang.log")
    emulator = EmulatedServer(load_server_config("default"), load_workload("demo"), speed=300.0, seed=1,
                              log_path=log_path, request_log_path=log_path)
    emulator.start()
    config = config_from_dict({"targets": [{"name": "demo", "url": emulator.url, "log_paths": [log_path]}],
                               "interval_seconds": 1.0, "time_scale": 300.0, "timeout_seconds": 2.0,
                               "replay_min_window_seconds": 300.0})
    advisor = Advisor(config)
    try:
        # each cycle is a poll that takes what the emulator served since the last one, so how much traffic a
        # cycle sees depends on the machine's speed: poll until there is a ratio and a short history, with a
        # pause between polls and a wall-clock bound rather than a fixed count
        deadline = time.monotonic() + 90.0
        while time.monotonic() < deadline:
            status = advisor.run_cycle(timeout=5.0)[0]
            with_ratio = [point for point in advisor.store.history("demo") if point.ratio]
            if status.recommendation and status.recommendation.ratio and len(with_ratio) >= 4:
                break
            time.sleep(0.05)
        yield advisor
    finally:
        advisor.close()
        emulator.stop()


@pytest.fixture(scope="module")
def page(watched) -> Iterator[tuple[str, str]]:
    with ExporterServer(watched.store, "127.0.0.1", 0) as exporter:
        response = requests.get(f"{exporter.url}/", timeout=10)
        assert response.status_code == 200
        yield response.text, exporter.url


def _svgs(html_text: str) -> dict[str, ET.Element]:
    found = {}
    for match in re.finditer(r"<svg .*?</svg>", html_text, flags=re.S):
        element = ET.fromstring(match.group())  # each chart is well-formed XML on its own
        found[element.attrib["id"]] = element
    return found


def _texts(svg: ET.Element) -> list[str]:
    return [node.text or "" for node in svg.iter(f"{SVG_NS}text")]


def test_concurrency_chart_marks_live_and_recommended_r_on_the_model_curves(watched, page):
    status = watched.store.latest()[0]
    rec = status.recommendation
    assert rec is not None and rec.ratio is not None and rec.live_ratio is not None
    chart = _svgs(page[0])["concurrency-0"]
    texts = _texts(chart)
    assert f"live r {rec.live_ratio:.3g}" in texts and f"recommended r {rec.ratio:.3g}" in texts
    assert len(list(chart.iter(f"{SVG_NS}polyline"))) == 2  # state clamp and KV capacity
    # the curves are the pool model's: at the live r the state clamp is the recommendation's live clamp
    model = watched.store.model("demo")
    context = status.workload.effective_context_length
    curve = concurrency_curve(model, context, [rec.live_ratio, rec.ratio])
    assert curve.state_clamp[0] == pytest.approx(rec.predicted_max_running_requests_live, abs=1)
    # and at the recommended r (the replay may put it past the balance point: the clamp, not the smaller pool)
    assert curve.state_clamp[1] == pytest.approx(rec.predicted_max_running_requests_recommended, abs=1)


def test_context_chart_shows_the_distribution_and_its_quantiles(watched, page):
    workload = watched.store.latest()[0].workload
    chart = _svgs(page[0])["context-0"]
    bars = [rect for rect in chart.iter(f"{SVG_NS}rect") if rect.attrib.get("fill-opacity") == "0.55"]
    assert len(bars) >= 5
    texts = " ".join(_texts(chart))
    for label in ("p50", "p90", "p99", "mean", "L_eff"):
        assert label in texts
    assert workload.context_length_p50 and workload.context_length_p99
    assert workload.context_length_p50 < workload.context_length_p99


def test_history_chart_draws_the_recommendation_over_time(watched, page):
    chart = _svgs(page[0])["history-0"]
    lines = list(chart.iter(f"{SVG_NS}polyline"))
    assert len(lines) == 2  # recommended and live r
    assert all(len(line.attrib["points"].split()) >= 3 for line in lines)
    assert len(watched.store.history("demo")) >= 4


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    message = "`chromium` not found; install it with `apt-get install chromium` to screenshot the landing page"
    if os.environ.get(REQUIRE_BINARIES_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_BINARIES_ENV}=1 forbids skipping)")
    pytest.skip(message)


def _png_size_and_rows(path: Path) -> tuple[int, int, bytes]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, offset = b"", 8
    while offset < len(data):
        length = struct.unpack(">I", data[offset:offset + 4])[0]
        kind = data[offset + 4:offset + 8]
        if kind == b"IDAT":
            idat += data[offset + 8:offset + 8 + length]
        offset += 12 + length
    return width, height, zlib.decompress(idat)


def test_headless_chromium_renders_the_page(page, tmp_path):
    chromium = _chromium()
    screenshot = tmp_path / "landing.png"
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1300,1500",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={screenshot}", page[1] + "/"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert screenshot.exists(), result.stderr[-2000:]
    width, height, pixels = _png_size_and_rows(screenshot)
    assert (width, height) == (1300, 1500)
    # a blank page filters to almost all zero bytes; charts, table and text do not
    assert sum(1 for byte in pixels if byte) > len(pixels) // 50
    keep = os.environ.get("POOL_ADVISOR_SCREENSHOT")
    if keep:
        shutil.copy(screenshot, keep)


def test_the_daemon_times_every_step_of_its_cycles(watched, page):
    text = requests.get(f"{page[1]}/metrics", timeout=10).text
    counts = {}
    for match in re.finditer(r'^sglang_advisor_cycle_step_duration_seconds_count\{step="(\w+)"\} (\S+)$', text, re.M):
        counts[match.group(1)] = float(match.group(2))
    cycles = len(watched.store.history("demo"))
    for step in ("logs", "metrics", "recommend", "target", "cycle", "checkpoint"):
        assert counts[step] == cycles, (step, counts)
    assert 1 <= counts["server_info"] <= cycles  # refreshed every server_info_every cycles or when due


def test_goodput_chart_draws_the_replayed_curve_with_live_and_recommended_r(watched, page):
    rec = watched.store.latest()[0].recommendation
    assert rec is not None and len(rec.goodput_curve) >= 5  # the replay ran on the demo traffic
    chart = _svgs(page[0])["goodput-0"]
    texts = _texts(chart)
    assert f"live r {rec.live_ratio:.3g}" in texts and f"recommended r {rec.ratio:.3g}" in texts
    assert len(list(chart.iter(f"{SVG_NS}circle"))) == len(rec.goodput_curve)  # one mark per replayed ratio
    # the recommended r and the curve's best both sit on the plateau the replay found; the hold band lies inside it
    # where the plateau is wider than the smallest move either side of the recommended r, else spans that move
    best_ratio = max(rec.goodput_curve, key=lambda point: point[1])[0]
    assert rec.goodput_plateau is not None
    plateau_low, plateau_high = rec.goodput_plateau
    assert plateau_low <= best_ratio <= plateau_high and plateau_low <= rec.ratio <= plateau_high
    min_move = ReplaySettings().min_move
    assert rec.ratio_lower is not None and rec.ratio_upper is not None
    assert min(plateau_low, rec.ratio / min_move) * (1 - 1e-9) <= rec.ratio_lower <= rec.ratio
    assert rec.ratio <= rec.ratio_upper <= max(plateau_high, rec.ratio * min_move) * (1 + 1e-9)
