"""What the daemon publishes about one SGLang server and the exporter renders: the contract between them.
Plain data; `to_dict()` gives the JSON of `/status` and `run --once`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from advisor.estimate.summary import WorkloadSummary
from advisor.recommend.types import Recommendation
from advisor.scrub import scrub_status_fields


@dataclass
class TargetStatus:
    """Everything the exporter shows about one target (one SGLang server)."""

    server: str
    model_name: str = ""
    up: bool = False
    stale: bool = False
    last_success_timestamp: float | None = None
    last_cycle_duration_seconds: float | None = None
    info: dict[str, str] = field(default_factory=dict)  # version, strategy, ssm_dtype, kv_dtype, tp, dp, pp, dcp
    workload: WorkloadSummary = field(default_factory=WorkloadSummary)
    recommendation: Recommendation | None = None
    scrape_errors_total: dict[str, int] = field(default_factory=dict)  # source -> count
    last_errors: list[str] = field(default_factory=list)
    # Counter lineage changes seen (a restart, or the URL flipping between servers): estimate.deltas.CounterTracker
    restarts_total: int = 0
    last_restart_timestamp: float | None = None
    last_restart_reason: str | None = None

    def __post_init__(self) -> None:
        scrub_status_fields(self)  # the one place outside text is scrubbed and capped before any output

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
