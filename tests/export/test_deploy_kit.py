"""The deploy kit, offline: the kustomize base builds with `kubectl kustomize` and passes a structural
schema check (kinds, selectors, ports, probes, a non-root read-only container, a config the advisor
accepts, the PrometheusRule equal to alerts.yml); the Containerfile and the systemd unit are linted.
Run as a script with --write to regenerate prometheusrule.yaml from alerts.yml."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZE = DEPLOY / "kubernetes"


def _render_rules() -> Any:
    """deploy/prometheus/render_rules.py as a module (deploy/ is not a package)."""
    spec = importlib.util.spec_from_file_location("render_rules", DEPLOY / "prometheus" / "render_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prometheus_rule_text() -> str:
    rules = _render_rules()
    return str(rules.prometheus_rule(rules.render()))


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path:
        return path
    message = "`kubectl` not found; install it (Debian: apt-get install kubernetes-client) to build the kustomize base"
    if os.environ.get("POOL_ADVISOR_REQUIRE_BINARIES") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def built() -> dict[str, dict[str, Any]]:
    result = subprocess.run([_kubectl(), "kustomize", str(KUSTOMIZE)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    documents = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return {doc["kind"]: doc for doc in documents}


def test_the_base_has_every_kind_once(built):
    assert set(built) == {"Deployment", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap", "Secret"}
    for doc in built.values():
        assert doc["apiVersion"] and doc["metadata"]["name"] and doc["metadata"]["namespace"] == "sglang-pool-advisor"


def test_deployment_runs_non_root_read_only_and_probes_healthz(built):
    spec = built["Deployment"]["spec"]
    pod = spec["template"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True and pod["spec"]["securityContext"]["runAsUser"] > 0
    (container,) = pod["spec"]["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    port_names = {port["name"] for port in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz" and container[probe]["httpGet"]["port"] in port_names
    writable = {mount["mountPath"] for mount in container["volumeMounts"] if not mount.get("readOnly")}
    assert "/var/lib/pool-advisor" in writable  # the checkpoint's directory: the only state
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == built["ConfigMap"]["metadata"]["name"]  # hashed name followed
    assert volumes["web-config"]["secret"]["secretName"] == built["Secret"]["metadata"]["name"]
    assert container["image"].startswith("localhost/sglang-pool-advisor:")


def test_service_and_servicemonitor_select_what_they_should(built):
    pod_labels = built["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service = built["Service"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {p["name"] for p in built["Deployment"]["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    monitor = built["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    # the job label comes from this Service label; SGLangPoolAdvisorDown selects job="sglang-pool-advisor"
    assert service["metadata"]["labels"][monitor["jobLabel"]] == "sglang-pool-advisor"


def test_config_and_web_config_are_accepted_by_the_advisor(built):
    import base64

    from advisor.config import config_from_dict
    from advisor.export.webconfig import web_config_from_dict

    config = config_from_dict(yaml.safe_load(built["ConfigMap"]["data"]["advisor.yaml"]), env={})
    assert config.listen_host == "0.0.0.0" and config.checkpoint_path.startswith("/var/lib/pool-advisor/")
    web = yaml.safe_load(base64.b64decode(built["Secret"]["data"]["web.yml"]))
    assert web_config_from_dict(web).ssl_context is None


def test_prometheus_rule_is_alerts_yml(built):
    assert (KUSTOMIZE / "prometheusrule.yaml").read_text() == prometheus_rule_text(), \
        "regenerate: python3 deploy/prometheus/render_rules.py --prometheus-rule > deploy/kubernetes/prometheusrule.yaml"
    assert built["PrometheusRule"]["spec"] == yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())


def test_containerfile_lint():
    text = (DEPLOY / "Containerfile").read_text()
    instructions = [line.split(None, 1) for line in text.splitlines() if line and not line.startswith(("#", " "))]
    keywords = [parts[0] for parts in instructions]
    assert keywords.index("ARG") < keywords.index("FROM")  # the base is a build argument
    assert re.search(r"^FROM \$\{BASE\}$", text, flags=re.M)
    user = next(parts[1] for parts in instructions if parts[0] == "USER")
    assert re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", user.strip()), "USER must be a numeric non-root uid"
    assert re.search(r'^ENTRYPOINT \[".+"\]$', text, flags=re.M), "exec-form ENTRYPOINT (signals reach the advisor)"
    assert "ADD " not in text and "curl" not in text and "wget" not in text  # nothing fetched at build time
    for source in re.findall(r"^COPY (\S+) ", text, flags=re.M):
        assert source == "dist/wheels" or (REPO / source).exists(), source


def test_systemd_unit_reads_an_environment_file():
    unit = (DEPLOY / "pool-advisor.service").read_text()
    assert re.search(r"^EnvironmentFile=-?/etc/pool-advisor/pool-advisor\.env$", unit, flags=re.M)
    assert re.search(r"^ExecStart=\S*pool-advisor run --config /etc/pool-advisor/advisor\.yaml$", unit, flags=re.M)
    assert (DEPLOY / "pool-advisor.env").exists()
    analyze = shutil.which("systemd-analyze")
    if analyze:
        result = subprocess.run([analyze, "verify", str(DEPLOY / "pool-advisor.service")], capture_output=True,
                                text=True, timeout=60, check=False)
        assert "Unknown key" not in result.stderr and "Unknown section" not in result.stderr, result.stderr


def test_rules_render_with_your_job_and_matchers(tmp_path):
    """The one place to set selectors: every selector gets the matchers, the job follows, promtool agrees."""
    from prom_harness import run_promtool

    rules = _render_rules()
    document = rules.render(job="pool-advisor", matchers='cluster="prod"')
    exprs = [rule["expr"] for group in document["groups"] for rule in group["rules"]]
    for expr in exprs:
        selectors = re.findall(r"\b(?:sglang_advisor_\w+|up)\{[^}]*\}", expr)
        assert selectors and all('cluster="prod"' in selector for selector in selectors), expr
        assert "sglang-pool-advisor" not in expr
    assert any('up{cluster="prod", job="pool-advisor"}' in expr for expr in exprs)
    path = tmp_path / "alerts.yml"
    path.write_text(rules.dump(document))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert rules.render() == yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())  # default: as tested
    with pytest.raises(ValueError, match="--matchers"):
        rules.render(matchers="cluster=prod")
