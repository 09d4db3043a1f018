"""The deploy kit, offline: the kustomize base builds with `kubectl kustomize` and passes a structural
schema check (kinds, selectors, ports, probes, a non-root read-only container, a config the advisor
accepts, the PrometheusRule equal to alerts.yml, both dashboards in a ConfigMap Grafana's sidecar picks
up); the two-replica overlay builds; Grafana's provisioning file points at the dashboards; the
Containerfile and the systemd unit are linted.
Run as a script with --write to regenerate prometheusrule.yaml from alerts.yml."""

from __future__ import annotations

import importlib.util
import json
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


def kustomize(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run([_kubectl(), "kustomize", str(directory)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def is_dashboards(doc: dict[str, Any]) -> bool:
    return "grafana_dashboard" in doc["metadata"].get("labels", {})


@pytest.fixture(scope="module")
def documents() -> list[dict[str, Any]]:
    return kustomize(KUSTOMIZE)


@pytest.fixture(scope="module")
def built(documents) -> dict[str, dict[str, Any]]:
    """The base's resources by kind, the dashboards' ConfigMap left out (it has its own test)."""
    return {doc["kind"]: doc for doc in documents if not is_dashboards(doc)}


def test_the_base_has_every_kind_once(documents, built):
    assert sorted(doc["kind"] for doc in documents) == sorted(
        ["Deployment", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap", "ConfigMap", "Secret"])
    assert set(built) == {"Deployment", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap", "Secret"}
    for doc in documents:
        assert doc["apiVersion"] and doc["metadata"]["name"] and doc["metadata"]["namespace"] == "sglang-pool-advisor"


def test_dashboards_configmap_is_for_grafanas_sidecar(documents):
    (configmap,) = [doc for doc in documents if is_dashboards(doc)]
    assert configmap["kind"] == "ConfigMap" and configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["name"] == "pool-advisor-dashboards"  # fixed: no old copy beside a new one
    dashboards = sorted((REPO / "dashboards").glob("*.json"))
    assert [path.name for path in dashboards] == sorted(configmap["data"])
    for path in dashboards:
        assert configmap["data"][path.name] == path.read_text(), "stale: run python3 dashboards/generate.py"
        assert json.loads(configmap["data"][path.name])["uid"] == path.stem


def test_replicas_are_a_knob_the_two_replica_overlay_sets(built):
    spec = built["Deployment"]["spec"]
    assert spec["replicas"] == 1
    # never two pods of one replica at once, and at 2 replicas one keeps exporting during a rollout
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    overlay = kustomize(DEPLOY / "overlays" / "two-replicas")
    (deployment,) = [doc for doc in overlay if doc["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 2
    assert sorted(doc["kind"] for doc in overlay) == sorted(doc["kind"] for doc in kustomize(KUSTOMIZE))
    terms = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert terms[0]["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod_labels.items()


def test_grafana_provisioning_is_a_file_provider():
    document = yaml.safe_load((DEPLOY / "grafana" / "dashboards.yaml").read_text())
    assert document["apiVersion"] == 1
    (provider,) = document["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert provider["allowUiUpdates"] is False  # the dashboards are generated: UI edits would be lost


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
