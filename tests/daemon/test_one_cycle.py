"""Every server runs the same cycle however it is observed: a server read directly and one read through a store
(the same genuine SGLang bodies behind both, on loopback) show the same landing-page charts, the same /status
fields, the same deadline accounting and target_up when their source hangs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_store import FakeStore, fixture_samples
from prometheus_client.parser import text_string_to_metric_families
from replay_server import ReplayServer

from advisor.config import config_from_dict
from advisor.daemon.runner import Advisor
from advisor.export.collector import build_registry
from advisor.export.server import landing_page, status_document
from advisor.status import TargetStatus

STORE_SERVER = "a:1"
NOT_DRAWN = ("unknown yet", "no finished requests observed yet", "cannot draw")


@pytest.fixture
def both() -> Iterator[tuple[Advisor, ReplayServer, FakeStore]]:
    """One advisor watching the replay server directly ("direct") and through a store (server "a:1", whose
    /server_info is the same replay server)."""
    with ReplayServer() as replay, FakeStore({STORE_SERVER: fixture_samples("sglang-0.5.23-single.prom")}) as store:
        advisor = Advisor(config_from_dict({
            "targets": [
                {"name": "direct", "url": replay.url},
                {"kind": "prometheus", "url": store.url, "history": "10m", "step": "60s", "timeout_seconds": "5s",
                 "server_info_url": replay.url},
            ],
            "timeout_seconds": 5.0,
        }))
        try:
            yield advisor, replay, store
        finally:
            advisor.close()


def target_up(advisor: Advisor) -> dict[str, float]:
    text = "".join(line.decode() + "\n" for line in _exposition(advisor).splitlines())
    return {sample.labels["server"]: sample.value
            for family in text_string_to_metric_families(text) if family.name == "sglang_advisor_target_up"
            for sample in family.samples}


def _exposition(advisor: Advisor) -> bytes:
    from prometheus_client.exposition import generate_latest

    return generate_latest(build_registry(advisor.store, daemon_metrics=False))


def test_a_store_server_shows_what_a_direct_one_shows(both):
    advisor, _, _ = both
    statuses = {status.server: status for status in advisor.run_cycle(timeout=20.0)}
    assert set(statuses) == {"direct", STORE_SERVER}
    direct, stored = statuses["direct"], statuses[STORE_SERVER]
    assert direct.up and stored.up, (direct.last_errors, stored.last_errors)
    assert stored.recommendation is not None and direct.recommendation is not None
    assert stored.recommendation.token_equiv == pytest.approx(direct.recommendation.token_equiv)
    # /status: the same fields, filled alike (the cycle duration and the error ledger's sources included)
    documents = {target["server"]: target for target in status_document(advisor.store)["targets"]}
    for field in ("last_cycle_duration_seconds", "last_success_timestamp", "model_name"):
        assert documents["direct"][field] is not None and documents[STORE_SERVER][field] is not None, field
    assert set(documents["direct"]["scrape_errors_total"]) == set(documents[STORE_SERVER]["scrape_errors_total"])
    # /: both servers get the pool model's curves, the context histogram and a history point
    for server in ("direct", STORE_SERVER):
        page = landing_page(advisor.store, server)
        assert not [text for text in NOT_DRAWN if text in page], server
        assert advisor.store.model(server) is not None and advisor.store.context_weights(server)
        assert len(advisor.store.history(server)) == 1
    advisor.run_cycle(timeout=20.0)
    assert len(advisor.store.history(STORE_SERVER)) == len(advisor.store.history("direct")) == 2


def test_a_hung_source_is_a_deadline_for_a_direct_and_a_store_server_alike(both):
    advisor, replay, store = both
    assert target_up(advisor) == {}
    advisor.run_cycle(timeout=20.0)
    assert target_up(advisor) == {"direct": 1.0, STORE_SERVER: 1.0}
    replay.fault, store.mode = "hang", "hang"
    statuses = {status.server: status for status in advisor.run_cycle(timeout=0.5)}
    assert not advisor._busy["direct"].done() and not advisor._busy[advisor.fleets[0].name].done()
    for server in ("direct", STORE_SERVER):
        status: TargetStatus = statuses[server]
        assert not status.up, server
        assert status.scrape_errors_total["deadline"] == 1, server
        assert status.last_errors[0].startswith("deadline: cycle still running"), server
        assert status.recommendation is not None  # the last recommendation is kept, shown down
    assert target_up(advisor) == {"direct": 0.0, STORE_SERVER: 0.0}
    # still stuck at the next cycle: counted again, not queued behind itself
    statuses = {status.server: status for status in advisor.run_cycle(timeout=0.3)}
    assert statuses["direct"].scrape_errors_total["deadline"] == statuses[STORE_SERVER].scrape_errors_total["deadline"] == 2


def test_a_store_hung_at_restart_shows_its_checkpointed_servers_down_under_deadline(tmp_path):
    """After a restart the fleet's servers are known from the checkpoint before the store answers: a store that
    hangs then (in the history replay) is a fleet-level deadline for each of them, as for a direct target."""
    servers = {f"gpu-{i}:30000": fixture_samples("sglang-0.5.23-single.prom") for i in range(3)}
    with FakeStore(servers) as store:
        config = config_from_dict({
            "targets": [{"kind": "prometheus", "url": store.url, "history": "10m", "step": "60s",
                         "timeout_seconds": "30s", "server_info_url": ""}],
            "timeout_seconds": 5.0, "checkpoint_path": str(tmp_path / "state.json"),
        })
        first = Advisor(config)
        try:
            assert all(status.up for status in first.run_cycle(timeout=20.0))
        finally:
            first.close()
        store.mode = "hang"
        restarted = Advisor(config)
        try:
            assert restarted.load_checkpoint() is None
            statuses = {status.server: status for status in restarted.run_cycle(timeout=0.5)}
            assert set(statuses) == set(servers)
            for status in statuses.values():
                assert not status.up and status.scrape_errors_total["deadline"] == 1
                assert status.last_errors[0].startswith("deadline: cycle still running")
            assert target_up(restarted) == dict.fromkeys(servers, 0.0)
        finally:
            restarted.close()
