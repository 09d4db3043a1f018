"""The `kind: prometheus` target in the daemon config: defaults, secrets from the environment, and every bad
value as an InputError naming the field."""

from __future__ import annotations

import pytest

from advisor.config import config_from_dict
from advisor.errors import InputError
from advisor.store_config import DEFAULT_HISTORY_SECONDS


def store(**fields: object) -> dict[str, object]:
    return {"targets": [{"kind": "prometheus", "url": "https://prom.example:9090/", **fields}]}


def test_defaults_and_mixing_with_direct_targets():
    config = config_from_dict({"targets": [{"kind": "prometheus", "url": "http://prom:9090"}, "http://gpu-1:30000"]})
    (target,) = config.store_targets
    assert [t.name for t in config.targets] == ["gpu-1:30000"]
    assert target.name == "prom:9090" and target.selector == "" and target.server_labels == ("instance",)
    assert target.history_seconds == DEFAULT_HISTORY_SECONDS and target.assumed_ratio == 0.9
    assert target.server_info_base({"instance": "10.0.0.7:30000"}) == "http://10.0.0.7:30000"


def test_fields_and_secrets_from_the_environment():
    config = config_from_dict(store(
        selector='{job="sglang"}', server_labels=["cluster", "instance"], history="2d", step="5m",
        server_info_url="https://{instance}.{cluster}.svc/", bearer_token_env="PROM_TOKEN", ca_file="/etc/ca.pem",
        server_api_key_env="SGLANG_KEY", assumed_ratio=1.5, forget_after_seconds="1h",
    ), env={"PROM_TOKEN": "tok", "SGLANG_KEY": "sk"})
    (target,) = config.store_targets
    assert target.url == "https://prom.example:9090" and target.matchers == 'job="sglang"'
    assert (target.history_seconds, target.step_seconds, target.forget_after_seconds) == (172800, 300, 3600)
    assert target.auth.bearer_token == "tok" and target.auth.ca_file == "/etc/ca.pem" and target.server_api_key == "sk"
    assert target.server_info_base({"cluster": "eu", "instance": "gpu-3"}) == "https://gpu-3.eu.svc"
    assert "tok" not in repr(target) and "sk'" not in repr(target)


@pytest.mark.parametrize("fields, message", [
    ({"selectr": '{job="x"}'}, "unknown field 'selectr' in targets[0] (did you mean 'selector'?)"),
    ({"selector": 'job="x"'}, "targets[0].selector"),
    ({"history": "a week"}, "targets[0].history"),
    ({"server_labels": ["in-stance"]}, "targets[0].server_labels"),
    ({"server_info_url": "http://{pod}:30000"}, "targets[0].server_info_url"),
    ({"assumed_ratio": 0}, "targets[0].assumed_ratio"),
    ({"assumed_ratio": "0.9x"}, "field 'targets[0].assumed_ratio' must be a number"),
    ({"assumed_ratio": 1e5}, "field 'targets[0].assumed_ratio' must be <= 10000"),
    ({"timeout_seconds": "2h"}, "field 'targets[0].timeout_seconds' must be <= 3600 seconds"),
    ({"bearer_token_env": "NOT_SET_ANYWHERE"}, "NOT_SET_ANYWHERE is not set"),
    ({"bearer_token": "t", "username": "u"}, "not both"),
    ({"url": "prom:9090"}, "targets[0].url"),
    ({"shard": {"index": 2, "total": 2}}, "field 'targets[0].shard.index' must be < shard.total (2), got 2"),
    ({"shard": {"index": -1, "total": 2}}, "field 'targets[0].shard.index' must be >= 0"),
    ({"shard": {"index": 0, "total": 0}}, "field 'targets[0].shard.total' must be > 0"),
    ({"shard": {"index": 0.5, "total": 2}}, "field 'targets[0].shard.index' must be a whole number"),
    ({"shard": {"index": 0}}, "field 'targets[0].shard.total' is missing"),
    ({"shard": {"idx": 0, "total": 2}}, "unknown field 'idx' in targets[0].shard (did you mean 'index'?)"),
    ({"shard": 1}, "field 'targets[0].shard' must be a mapping"),
    ({"shrad": {"index": 0, "total": 2}}, "unknown field 'shrad' in targets[0] (did you mean 'shard'?)"),
])
def test_bad_values_are_named(fields, message):
    with pytest.raises(InputError) as caught:
        config_from_dict(store(**fields), env={})
    assert message in str(caught.value)


def test_a_shard_is_read_and_none_by_default():
    (sharded,) = config_from_dict(store(shard={"index": 1, "total": 3})).store_targets
    assert (sharded.shard.index, sharded.shard.total) == (1, 3)
    (whole,) = config_from_dict(store()).store_targets
    assert whole.shard is None


def test_a_store_url_password_never_reaches_the_name_or_an_error():
    from advisor.store_config import store_target_from_dict

    target = store_target_from_dict({"kind": "prometheus", "url": "http://admin:hunter2@127.0.0.1:9090"}, "targets[0]", {})
    assert "hunter2" not in target.name and target.name == "127.0.0.1:9090"
