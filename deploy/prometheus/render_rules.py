"""Renders the alert rules with your selectors: the one place to set the job the advisor is scraped
under and extra label matchers (e.g. cluster="prod") that every rule's selectors get. Prometheus rule
files have no variables, so alerts.yml (the tested default) is rewritten rather than templated.

    python3 deploy/prometheus/render_rules.py --job pool-advisor --matchers 'cluster="prod"' > my-alerts.yml
    python3 deploy/prometheus/render_rules.py --prometheus-rule > deploy/kubernetes/prometheusrule.yaml
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ALERTS = Path(__file__).resolve().parent / "alerts.yml"
DEFAULT_JOB = "sglang-pool-advisor"  # as in alerts.yml, prometheus.yml and the ServiceMonitor's job label
RULE_HEADER = ("# Generated from deploy/prometheus/alerts.yml by deploy/prometheus/render_rules.py --prometheus-rule;\n"
               "# edit alerts.yml (or pass --job/--matchers) and regenerate.\n")
_SELECTED = re.compile(r"\b(sglang_advisor_\w+|up)\b(\{[^}]*\})?")
_MATCHERS = re.compile(r'\s*\w+\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*(,\s*\w+\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*)*')


def add_matchers(expr: str, matchers: str) -> str:
    """`expr` with `matchers` added to every selector of an advisor series (and `up`)."""
    if not matchers:
        return expr

    def extend(match: re.Match[str]) -> str:
        name, braces = match.group(1), match.group(2)
        if braces is None:
            if name == "up":
                return name  # bare `up` never occurs in our rules; leave words in prose alone
            return f"{name}{{{matchers}}}"
        inner = braces[1:-1].strip()
        return f"{name}{{{matchers}{', ' + inner if inner else ''}}}"

    return _SELECTED.sub(extend, expr)


def render(job: str = DEFAULT_JOB, matchers: str = "") -> dict[str, Any]:
    if not re.fullmatch(r"[^\"\\]+", job):
        raise ValueError(f"--job must be a plain job name, got {job!r}")
    if matchers and not _MATCHERS.fullmatch(matchers):
        raise ValueError(f'--matchers must be label matchers like cluster="prod", got {matchers!r}')
    document = yaml.safe_load(ALERTS.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"].replace(f'job="{DEFAULT_JOB}"', f'job="{job}"')
            rule["expr"] = add_matchers(expr, matchers)
    return document


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, templates) as literal blocks, as alerts.yml writes them."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def dump(document: dict[str, Any]) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def prometheus_rule(document: dict[str, Any]) -> str:
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "pool-advisor"}, "spec": document}
    return RULE_HEADER + dump(rule)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default=DEFAULT_JOB, help=f"Prometheus job of the advisor (default {DEFAULT_JOB})")
    parser.add_argument("--matchers", default="", help='extra matchers for every selector, e.g. cluster="prod"')
    parser.add_argument("--prometheus-rule", action="store_true", help="wrap as a prometheus-operator PrometheusRule")
    args = parser.parse_args(argv)
    try:
        document = render(args.job, args.matchers)
    except ValueError as exc:
        print(f"render_rules: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(prometheus_rule(document) if args.prometheus_rule else dump(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
