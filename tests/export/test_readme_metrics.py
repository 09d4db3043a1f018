"""The README lists every metric the advisor exports (names without the sglang_advisor_ prefix are fine)."""

import re

from support import REPO

from advisor.export.collector import daemon_metric_names, exported_metric_names

PREFIX = "sglang_advisor_"


def test_every_exported_metric_is_in_the_readme():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`([a-z_]+)(?:\{[^}`]*\})?`", readme))
    missing = []
    for name in exported_metric_names() + daemon_metric_names():
        base = name.removesuffix("_bucket")
        short = base.removeprefix(PREFIX)
        if base not in listed and short not in listed and short.removesuffix("_info") not in listed:
            missing.append(name)
    assert missing == []
    assert "process_*" in readme
