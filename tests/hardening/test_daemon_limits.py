"""The daemon applies the configured caps and restart detection: a target over a cap is a counted error naming
the setting, a URL flipping between two servers shows as restarts in /status without inflating the workload."""

from __future__ import annotations

from hostile_servers import HostileServer, respond
from support import METRICS

from advisor.config import config_from_dict
from advisor.daemon.runner import Advisor

GENUINE = (METRICS / "sglang-0.5.23-single.prom").read_bytes()


def _advisor(url: str, **extra) -> Advisor:
    return Advisor(config_from_dict({"targets": [{"name": "t", "url": url, **extra.pop("target", {})}],
                                     "interval_seconds": 5.0, "timeout_seconds": 2.0, **extra}, {}))


def _cycle(advisor: Advisor):
    try:
        return advisor.run_cycle()[0]
    finally:
        advisor.close()


def test_body_and_line_caps_come_from_the_config() -> None:
    long_line = b"# HELP padding " + b"x" * 5000 + b"\n"
    with HostileServer({"/big/": respond(lambda n: GENUINE), "/long/": respond(lambda n: long_line + GENUINE)}) as server:
        big = _cycle(_advisor(server.base_url + "/big", max_body_bytes=4096))
        long = _cycle(_advisor(server.base_url + "/long", max_line_bytes=1024))
    assert big.scrape_errors_total["metrics"] == 1 and "body larger than 4096 bytes" in big.last_errors[0]
    assert long.scrape_errors_total["metrics"] == 1 and "max_line_bytes=1024" in long.last_errors[0]


def test_overlong_log_lines_are_counted_under_logs(tmp_path) -> None:
    log = tmp_path / "server.log"
    log.write_text("[2026-11-29 15:00:01] " + "x" * 5000 + "\n[2026-11-29 15:00:02] fine\n")
    with HostileServer({"/": respond(lambda n: GENUINE)}) as server:
        status = _cycle(_advisor(server.base_url, max_line_bytes=1024, target={"log_paths": [str(log)]}))
    assert status.scrape_errors_total["logs"] == 1
    assert any("max_line_bytes=1024" in error for error in status.last_errors)


def _exposition(served: float) -> bytes:
    """A tokenizer-side exposition of a server that has finished `served` requests (half under 1000 tokens)."""
    lines = [f'sglang:num_requests_total{{model_name="m"}} {served}']
    for family, per_request in (("prompt_tokens", 800.0), ("generation_tokens", 200.0)):
        lines += [
            f'sglang:{family}_histogram_bucket{{le="1000.0",model_name="m"}} {served * 0.5}',
            f'sglang:{family}_histogram_bucket{{le="+Inf",model_name="m"}} {served}',
            f'sglang:{family}_histogram_sum{{model_name="m"}} {served * per_request}',
            f'sglang:{family}_histogram_count{{model_name="m"}} {served}',
        ]
    lines.append('sglang:num_running_reqs{dp_rank="0",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0')
    return ("\n".join(lines) + "\n").encode()


def test_a_url_flipping_between_two_servers_is_shown_as_restarts_not_as_traffic() -> None:
    # Scrape n goes to server A (even n, 50 000 served before) or B (odd n, 5 000 before); each serves 10
    # requests per scrape of it.
    def body(n: int) -> bytes:
        before, served_here = (50_000.0, n // 2) if n % 2 == 0 else (5_000.0, n // 2)
        return _exposition(before + 10 * (served_here + 1))

    with HostileServer({"/metrics": respond(body)}) as server:
        advisor = _advisor(server.base_url)
        try:
            for _ in range(20):
                status = advisor.run_cycle()[0]
        finally:
            advisor.close()
    assert status.restarts_total >= 18 and status.last_restart_reason is not None
    assert status.last_restart_timestamp is not None
    # the first scrape bootstraps from A's lifetime histogram (50 010); the rest adds 10 per scrape, at most.
    # Re-adding B's lifetime at every flip would put this near 100 000.
    assert status.workload.requests_observed < 50_010 + 20 * 10 + 1
