"""The daemon config: file, environment, flags; every mistake named."""

import pytest

from advisor.config import build_config, config_from_dict
from advisor.errors import InputError


def test_file_env_and_flags_layer(tmp_path):
    path = tmp_path / "advisor.yaml"
    path.write_text(
        "interval_seconds: 30\nlisten: 0.0.0.0:9999\nstate_bias: 0.7\n"
        "targets:\n  - name: a\n    url: http://127.0.0.1:30000/\n    log_paths: /var/log/a.log\n"
    )
    config = build_config(path, {"POOL_ADVISOR_INTERVAL_SECONDS": "20"}, {"listen": "127.0.0.1:9100", "target_urls": ["http://127.0.0.1:30001"]})
    assert config.interval_seconds == 20.0  # env beats file
    assert config.listen_port == 9100  # flag beats file
    assert config.state_bias == 0.7
    assert [t.name for t in config.targets] == ["a", "127.0.0.1:30001"]
    assert config.targets[0].url == "http://127.0.0.1:30000"
    assert config.targets[0].log_paths == ("/var/log/a.log",)


def test_api_key_from_env_is_not_in_repr(tmp_path):
    config = config_from_dict({"targets": [{"url": "http://127.0.0.1:1", "api_key_env": "SGL_KEY"}]}, {"SGL_KEY": "s3cret"})
    assert config.targets[0].api_key == "s3cret"
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"intervall_seconds": 3, "targets": ["http://x:1"]}, "unknown field 'intervall_seconds' in advisor config (did you mean 'interval_seconds'?)"),
        ({"targets": [{"url": "http://x:1", "log_path": "a"}]}, "unknown field 'log_path' in targets[0] (did you mean 'log_paths'?)"),
        ({"targets": [{"url": "ftp://x"}]}, "targets[0].url"),
        ({"interval_seconds": -1, "targets": ["http://x:1"]}, "'interval_seconds' must be > 0"),
        ({"interval_seconds": "soon", "targets": ["http://x:1"]}, "'interval_seconds' must be a number"),
        ({"listen": "nowhere", "targets": ["http://x:1"]}, "'listen' must be HOST:PORT"),
        ({"targets": [{"url": "http://x:1", "state_bytes_per_slot": 5}]}, "go together"),
        ({"targets": ["http://x:1", "http://x:1"]}, "duplicate target name"),
    ],
)
def test_mistakes_are_named(data, message):
    with pytest.raises(InputError) as err:
        config_from_dict(data)
    assert message in str(err.value)


def test_shipped_example_config_is_valid():
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "deploy" / "advisor.yaml"
    config = build_config(example, {}, {})  # runs as shipped: no API key needed
    assert config.targets[0].api_key is None and config.listen_port == 9415
    keyed = example.read_text().replace("# api_key_env: SGLANG_API_KEY", "api_key_env: SGLANG_API_KEY")
    assert "\n    api_key_env: SGLANG_API_KEY" in keyed  # uncommenting the documented line is all it takes
    import yaml

    from advisor.config import config_from_dict

    assert config_from_dict(yaml.safe_load(keyed), {"SGLANG_API_KEY": "k"}).targets[0].api_key == "k"


def test_no_targets_and_bad_yaml(tmp_path):
    with pytest.raises(InputError, match="no targets"):
        build_config(None, {}, {})
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets: [\n")
    with pytest.raises(InputError, match="not valid YAML at line"):
        build_config(bad, {}, {})


def test_skip_decode_lock_must_be_a_boolean():
    loaded = config_from_dict({"targets": [{"url": "http://127.0.0.1:1", "skip_decode_lock": True}]})
    assert loaded.targets[0].skip_decode_lock is True
    with pytest.raises(InputError, match=r"targets\[0\]\.skip_decode_lock"):
        config_from_dict({"targets": [{"url": "http://127.0.0.1:1", "skip_decode_lock": "yes"}]})


def test_a_direct_target_and_the_recommend_flags_share_one_bound():
    """The same byte-constant override is refused by the daemon config and by `recommend`, at the same bound."""
    import subprocess
    import sys

    from support import REPO

    with pytest.raises(InputError, match=r"'targets\[0\].kv_bytes_per_token' must be <= 1e\+10 bytes"):
        config_from_dict({"targets": [{"url": "http://x:1", "state_bytes_per_slot": 1e6, "kv_bytes_per_token": 2e10}]})
    done = subprocess.run([sys.executable, "-m", "advisor", "recommend", "-L", "9216", "--state-bytes-per-slot", "1e6",
                           "--kv-bytes-per-token", "2e10"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2
    assert "--kv-bytes-per-token must be a finite number in [1, 1e+10] bytes" in done.stderr
