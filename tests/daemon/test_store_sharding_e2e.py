"""Sharded store targets against a real Prometheus: replicas with `shard: {index, total}` export disjoint
server sets whose union is the fleet, and each keeps exactly the servers Prometheus' own `hashmod` relabel
action assigns to its index (the store labels every series with its hashmod, so the advisor's split is checked
against Prometheus' code, not against a copy of the formula)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from support import METRICS, TESTS, LoopbackServer

sys.path.insert(0, str(TESTS / "export"))  # the real-Prometheus harness lives beside the exporter's tests
from prom_harness import PrometheusServer, require_binary, wait_for  # noqa: E402

from advisor.config import config_from_dict  # noqa: E402
from advisor.daemon.runner import Advisor  # noqa: E402

SERVERS = 12
TOTAL = 3  # shards
EXPOSITION = (METRICS / "sglang-0.5.23-single.prom").read_bytes()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, list[str]]]:
    require_binary("prometheus")
    servers = [LoopbackServer({"/metrics": (200, "text/plain; version=0.0.4", EXPOSITION, 0.0)})
               for _ in range(SERVERS)]
    hosts = [server.base_url.split("://", 1)[1] for server in servers]
    # Prometheus' own hashmod of the instance label, kept on every series as `prom_shard`.
    hashmod = [{"source_labels": ["__address__"], "target_label": "__tmp_hash", "modulus": TOTAL, "action": "hashmod"},
               {"source_labels": ["__tmp_hash"], "target_label": "prom_shard"}]
    prometheus = PrometheusServer(tmp_path_factory.mktemp("prometheus"), {"sglang": hosts},
                                  relabel_configs={"sglang": hashmod})
    try:
        for server in servers:
            server.__enter__()
        prometheus.start()
        wait_for(lambda: len(prometheus.query('up{job="sglang"} == 1')) == SERVERS, 30,
                 what="prometheus scraping every server")
        yield prometheus, hosts
    finally:
        prometheus.stop()
        for server in servers:
            server.__exit__(None, None, None)


def advisor_of(prometheus: PrometheusServer, shard: dict[str, int] | None) -> Advisor:
    target = {"kind": "prometheus", "url": prometheus.url, "selector": '{job="sglang"}', "history": "1m",
              "step": "15s", "server_info_url": "", **({"shard": shard} if shard else {})}
    return Advisor(config_from_dict({"targets": [target], "interval_seconds": 5.0, "timeout_seconds": 2.0}))


def exported_servers(advisor: Advisor) -> set[str]:
    return {status.server for status in advisor.store.latest()}


def test_sharded_replicas_export_disjoint_servers_whose_union_is_the_fleet(store):
    prometheus, hosts = store
    whole = advisor_of(prometheus, None)
    replicas = [advisor_of(prometheus, {"index": index, "total": TOTAL}) for index in range(TOTAL)]
    try:
        whole.run_cycle(timeout=30.0)
        for replica in replicas:
            replica.run_cycle(timeout=30.0)
        fleet = exported_servers(whole)
        assert fleet == set(hosts)
        shares = [exported_servers(replica) for replica in replicas]
        assert set().union(*shares) == fleet
        assert sum(len(share) for share in shares) == len(fleet)  # disjoint
        # each replica holds what Prometheus' hashmod puts at its index
        assigned = {row["metric"]["instance"]: int(row["metric"]["prom_shard"])
                    for row in prometheus.query('up{job="sglang"}')}
        for index, share in enumerate(shares):
            assert share == {host for host, shard in assigned.items() if shard == index}, index
        # the queries per cycle stay the fleet's constant, whatever the share
        for replica in replicas:
            (fleet_target,) = replica.fleets
            sent = fleet_target.client.queries_sent
            statuses = replica.run_cycle(timeout=30.0)
            assert fleet_target.client.queries_sent - sent == fleet_target.queries_per_cycle == 5
            assert all(status.up for status in statuses)
    finally:
        whole.close()
        for replica in replicas:
            replica.close()
