"""What the recommender concludes about one SGLang server: the decision enum, the pools, and the
Recommendation dataclass the daemon publishes and the exporter renders."""

from __future__ import annotations

from dataclasses import dataclass, field

DECISIONS = (
    "insufficient_data",
    "hold",
    "raise_ratio",
    "lower_ratio",
    "pin_state_pool",
    "unified_memory",
    "inputs_stale",
)
POOLS = ("state", "kv", "balanced")
CONFIGS = ("live", "recommended")
# What a note is about, for tools and tests (the text is for people). Codes are added as notes gain them.
NOTE_CODES = (
    "constants_from_pool_gauges",  # byte constants inverted from the store's pool gauges with the ratio assumed
)


@dataclass
class Recommendation:
    decision: str
    reason: str
    reason_code: str = ""  # one of policy.REASON_CODES: what tests and tools read; `reason` is for people
    ratio: float | None = None
    ratio_lower: float | None = None
    ratio_upper: float | None = None
    live_ratio: float | None = None
    ratio_drift: float | None = None  # ln(live / recommended)
    binding_pool_live: str | None = None
    binding_pool_recommended: str | None = None
    predicted_max_running_requests_live: int | None = None
    predicted_max_running_requests_recommended: int | None = None
    observed_max_running_requests: int | None = None
    kv_capacity_requests_live: float | None = None
    kv_capacity_requests_recommended: float | None = None
    predicted_gain_ratio: float | None = None  # concurrency at recommended / at live, minus nothing (1.0 = no gain)
    token_equiv: float | None = None
    slots_per_request: int | None = None
    recommended_max_mamba_cache_size: int | None = None
    recommended_mem_fraction_static: float | None = None
    confidence: float = 0.0
    bias: float = 0.0  # the spikiness bias and closed-loop nudge applied to r, as a factor minus 1
    nudge_evidence: str | None = None  # what contradicted the model: "state_saturated" | "kv_blocked" | None
    flag_line: str | None = None
    # the what-if replay, when the traffic could be replayed
    predicted_goodput_gain_ratio: float | None = None  # replayed goodput at the recommended r over the live r
    goodput_curve_width_ratio: float | None = None  # upper / lower end of the r range within noise of the best
    goodput_plateau: tuple[float, float] | None = None  # that r range (ratio_lower/upper: it less the edge margin)
    goodput_curve: list[tuple[float, float]] = field(default_factory=list)  # (r, replayed goodput tokens/s)
    # what the curve's goodput is: "goodput_score" = 3/4 SLO + 1/4 raw goodput, "raw_goodput" under sustained overload
    replay_metric: str | None = None
    replay_requests: int | None = None  # requests replayed, over replay_window_seconds, from replay_source
    replay_window_seconds: float | None = None
    replay_source: str | None = None  # "request_log" (exact) | "metrics" (per-interval arrivals and histograms)
    # Seconds the traffic had been in its current regime at the replay's end, where it changed character inside the
    # replay's window (None: one regime); the new regime's replay then decides with the window's.
    replay_regime_seconds: float | None = None
    # The arrival rate of the replay window's last minutes over the window's, where the same traffic came faster (None:
    # no trend); the window replayed that much heavier then decides with the observed one.
    replay_trend_load: float | None = None
    # How many replays' draws of a metrics-only picture the curve averages (the last one's and this one's: 2; else 1).
    replay_draws: int | None = None
    step_time_coefficients: dict[str, float] = field(default_factory=dict)  # the cost model fitted to this server
    # The running batch's mean sequence length the server showed and the replay's at the live ratio (metrics-only
    # pictures, whose outputs are paired to it): how faithfully the replay reproduces the server.
    replay_live_context_shown: float | None = None
    replay_live_context_replayed: float | None = None
    replay_live_running_shown: float | None = None  # ... and the mean running requests while busy
    replay_live_running_replayed: float | None = None
    # The share of requests that waited beyond the replay's queue bound: the server's queue-time histogram's over the
    # window and the replay's at the live ratio; where the replay queued less, how much heavier it replayed the window
    # to queue as the server did (that load then decides with the observed window, as a trend's does).
    replay_queue_shown: float | None = None
    replay_queue_replayed: float | None = None
    replay_queue_load: float | None = None
    # The server's admission rate (requests/s, its queue-time histogram's count) over the replay's measured part, the
    # replay's at the live ratio as its metrics-only picture was drawn, and where they differed, the factor the
    # picture's outputs were scaled by to match (a full pool admits at its turnover).
    replay_admission_rate_shown: float | None = None
    replay_admission_rate_replayed: float | None = None
    replay_work_scale: float | None = None
    notes: list[str] = field(default_factory=list)  # for people, in the order said
    note_codes: list[str] = field(default_factory=list)  # NOTE_CODES of the notes that carry one: what tests and tools read

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"unknown decision {self.decision!r}")

    def add_note(self, code: str, text: str) -> None:
        """Say `text` and record its code (one of NOTE_CODES), as reason_code does for the reason."""
        if code not in NOTE_CODES:
            raise ValueError(f"unknown note code {code!r}")
        self.notes.append(text)
        if code not in self.note_codes:
            self.note_codes.append(code)
