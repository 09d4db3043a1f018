"""An emulated SGLang server: the simulator behind SGLang's real observables (`/metrics`, `/server_info`,
`/model_info`, `/v1/loads`, `/health`, the server log), on a loopback HTTP server in a background thread.

The simulated clock runs `speed` times the wall clock; one Simulator per DP worker is advanced lazily on
every request and by a ticker thread, under one lock. Test hooks: `POST /_emulator/restart`,
`POST /_emulator/fault`, `GET /_emulator/state`. Route and auth behaviour: SGLang 0.5.23
`entrypoints/http_server.py`, `entrypoints/v1_loads.py`, `utils/auth.py`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

from advisor.model.pools import GIB, PoolSplit
from advisor.model.serving import resolve_strategy, slots_per_request, spec_enabled
from advisor.scheduler.engine import Simulator
from advisor.scheduler.types import DecodeTick, PrefillBatch, RequestFinished, Retraction, SimEvent
from advisor.sim import sglang_logs
from advisor.sim.clock import ManualClock, SystemClock
from advisor.sim.config import SchedulerServerConfig
from advisor.sim.exposition import (
    CONTENT_TYPE,
    QUEUE_TIME_BUCKETS,
    QUEUE_TIME_BUCKETS_OLD,
    Histogram,
    Layout,
    ServerConstants,
    TokenizerStats,
    WorkerView,
    check_profile,
    is_streaming_request,
    render_metrics,
    scheduler_ranks,
    worker_count,
)
from advisor.sim.workload import Workload
from advisor.sources.formats import release_key

FAULT_MODES = ("none", "http500", "hang", "garbage", "truncate")
# A hung response outlasts any sane client timeout but not a test run; `stop()` releases it at once.
HANG_SECONDS = 30.0
TICK_SECONDS = 0.05
GRAPH_DECODE_GB = 1.73
GRAPH_PREFILL_GB = 0.4
CUDA_GRAPH_BS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 128, 256, 512)
# The public SGLang endpoints that need no key even with --api-key (utils/auth.py decide_request_auth).
AUTH_EXEMPT_PREFIXES = ("/health", "/ready", "/metrics")

# (substring of the model path) -> (architecture class, model_type, conv share of a state slot), for the
# boot log and /model_info. Qwen3-Next's share is its fixture's (0.92 of 39.98 GB); the rest use the default.
_ARCHITECTURES = (
    ("qwen3-next", "Qwen3NextForCausalLM", "qwen3_next", 0.92 / 39.98),
    ("kimi-linear", "KimiLinearForCausalLM", "kimi_linear", sglang_logs.CONV_STATE_FRACTION),
    ("granite-4.0-h", "GraniteMoeHybridForCausalLM", "granitemoehybrid", sglang_logs.CONV_STATE_FRACTION),
    ("nemotron-h", "NemotronHForCausalLM", "nemotron_h", sglang_logs.CONV_STATE_FRACTION),
    ("falcon-h1", "FalconH1ForCausalLM", "falcon_h1", sglang_logs.CONV_STATE_FRACTION),
)


def architecture_of(model_name: str) -> tuple[str, str, float]:
    """(architecture class, model_type, conv share of a state slot) guessed from the model path."""
    lowered = model_name.lower()
    for needle, cls, model_type, conv in _ARCHITECTURES:
        if needle in lowered:
            return cls, model_type, conv
    return "ExampleHybridForCausalLM", "example_hybrid", sglang_logs.CONV_STATE_FRACTION


@dataclasses.dataclass
class _Worker:
    """The live state of one DP worker: its simulator plus what SGLang's metrics would hold."""

    sim: Simulator
    view: WorkerView
    pending_retracted_reqs: int = 0


class EmulatedServer:
    """An SGLang 0.5.23 (or 0.5.10) server emulated over the simulator; use as a context manager."""

    def __init__(
        self,
        server: SchedulerServerConfig,
        workload: Workload,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        speed: float = 1.0,
        seed: int = 0,
        log_path: str | None = None,
        request_log_path: str | None = None,
        log_requests_level: int = 0,
        version_profile: str = "0.5.23",
        api_key: str | None = None,
        tick_seconds: float = TICK_SECONDS,
        collect_tokens_histogram: bool = False,
        priority_scheduling: bool = False,
        clock: SystemClock | ManualClock | None = None,
        log_release: str | None = None,
    ) -> None:
        check_profile(version_profile)
        if log_release is not None and not release_key(log_release)[:3] > (0, 0, 0):
            raise ValueError(f"log_release must be an SGLang release like 0.5.14, got {log_release!r}")
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        if log_requests_level not in (0, 1, 2, 3):
            raise ValueError(f"log_requests_level must be 0-3 (SGLang's --log-requests-level), got {log_requests_level!r}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be 0..65535, got {port}")
        self._config = server
        self._workload = workload
        self._host = host
        self._requested_port = port
        self._speed = float(speed)
        self._seed = seed
        self._profile = version_profile
        # whose boot-log formats to write (sources/formats.py eras); the metrics follow version_profile
        self._log_release = log_release or version_profile
        self._api_key = api_key or None
        self._tick_seconds = tick_seconds
        self._log_path = log_path
        self._request_log_path = request_log_path
        self._log_requests_level = log_requests_level
        self._lock = threading.RLock()
        self._clock = clock or SystemClock()  # a ManualClock makes the simulation move only when a test says so
        self._stopping = threading.Event()
        self._fault = "none"
        self._httpd: _TrackingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._log_file: IO[str] | None = None
        self._request_log_file: IO[str] | None = None
        self._boot_count = 0
        self._pid_base = os.getpid() * 10 % 900000 + 1000
        self._workers: list[_Worker] = []
        # 0.5.10 only: the token histograms needed --collect-tokens-histogram (always on in 0.5.23)
        self._collect_tokens_histogram = collect_tokens_histogram
        self._priority_scheduling = priority_scheduling  # adds priority="" to every label set
        self._tokenizer = TokenizerStats(version_profile, collect_tokens_histogram)
        self._layout: Layout | None = None
        self._split: PoolSplit | None = None
        self._consts: ServerConstants | None = None
        self._wall_anchor = 0.0  # time.monotonic() at (re)boot
        self._epoch_anchor = 0.0  # time.time() at (re)boot
        self._started = False

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the emulated server is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def config(self) -> SchedulerServerConfig:
        return self._config

    @property
    def version_profile(self) -> str:
        return self._profile

    def start(self) -> EmulatedServer:
        if self._started:
            return self
        self._stopping.clear()
        handler = _make_handler(self)
        self._httpd = _TrackingHTTPServer((self._host, self._requested_port), handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # type: ignore[attr-defined]
        if self._log_path:
            self._log_file = open(self._log_path, "a", encoding="utf-8")  # noqa: SIM115
        if self._request_log_path:
            if self._request_log_path == self._log_path:
                self._request_log_file = self._log_file
            else:
                self._request_log_file = open(self._request_log_path, "a", encoding="utf-8")  # noqa: SIM115
        with self._lock:
            self._boot(self._config)
        self._started = True
        serve = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="emulated-sglang-http", daemon=True
        )
        ticker = threading.Thread(target=self._tick_loop, name="emulated-sglang-ticker", daemon=True)
        self._threads = [serve, ticker]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        if not self._started:
            return
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.close_connections()  # keep-alive clients (a Prometheus) must see the server gone
            self._httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        with self._lock:
            for handle in {id(f): f for f in (self._log_file, self._request_log_file) if f is not None}.values():
                handle.close()
            self._log_file = self._request_log_file = None
        self._started = False

    def __enter__(self) -> EmulatedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def restart(self, ratio: float | None = None, max_mamba_cache_size: int | None = None) -> None:
        """An SGLang restart with new pool flags: new pools, counters from zero, a new boot block."""
        config = self._config
        if ratio is not None:
            if not ratio > 0:
                raise ValueError(f"ratio must be > 0, got {ratio}")
            config = config.with_ratio(float(ratio))
        if max_mamba_cache_size is not None:
            if max_mamba_cache_size < 1:
                raise ValueError(f"max_mamba_cache_size must be >= 1, got {max_mamba_cache_size}")
            config = dataclasses.replace(
                config, serving=dataclasses.replace(config.serving, max_mamba_cache_size=int(max_mamba_cache_size))
            )
        split = config.split()
        if split.max_running_requests < 1 or split.kv_capacity_tokens < 1:
            raise ValueError(
                f"these flags size an unusable server (max_running_requests={split.max_running_requests}, "
                f"kv_capacity_tokens={split.kv_capacity_tokens})"
            )
        with self._lock:
            self._advance()
            self._config = config
            self._boot(config)

    def sync(self) -> None:
        """Fold in everything the simulation did up to the clock's now (writes the logs it produced)."""
        with self._lock:
            self._advance()

    def set_fault(self, mode: str) -> None:
        if mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {mode!r}; expected one of {', '.join(FAULT_MODES)}")
        self._fault = mode

    @property
    def fault(self) -> str:
        return self._fault

    # ------------------------------------------------------------------ simulation

    def _sim_now(self) -> float:
        return (self._clock.monotonic() - self._wall_anchor) * self._speed

    def _wall_time_of(self, sim_time: float) -> float:
        return self._epoch_anchor + sim_time / self._speed

    def _boot(self, config: SchedulerServerConfig) -> None:
        """(Re)start every worker; the caller holds the lock."""
        serving = config.serving
        self._boot_count += 1
        self._split = split = config.split()
        ranks = scheduler_ranks(serving, base_pid=self._pid_base + 100 * self._boot_count)
        self._layout = Layout(
            config.model_name, ranks, priority_scheduling=self._priority_scheduling, profile=self._profile
        )
        workers = worker_count(serving)
        kv_gb = (split.kv_capacity_tokens + serving.page_size) * config.constants.kv_bytes_per_token / GIB
        weight_gb, startup_gb = self._memory_figures(config)
        accept_length, accept_rate = spec_acceptance(config)
        self._consts = ServerConstants(
            context_len=config.model_context_len,
            kv_cache_memory_gb=kv_gb,
            weight_memory_gb=weight_gb,
            startup_available_gb=startup_gb,
            graph_decode_gb=GRAPH_DECODE_GB,
            graph_prefill_gb=GRAPH_PREFILL_GB,
            draft_tokens=serving.draft_tokens if spec_enabled(serving) else 0,
            spec_accept_length=accept_length,
            spec_accept_rate=accept_rate,
        )
        queue_buckets = QUEUE_TIME_BUCKETS if self._profile == "0.5.23" else QUEUE_TIME_BUCKETS_OLD
        self._workers = []
        for dp_rank in range(workers):
            sim = Simulator(config, self._workload, seed=self._seed, dp_rank=dp_rank, dp_size=workers)
            snap = sim.snapshot()
            self._workers.append(_Worker(sim, WorkerView(snap, snap, queue_time=Histogram(queue_buckets))))
        self._tokenizer = TokenizerStats(self._profile, self._collect_tokens_histogram)
        self._wall_anchor = self._clock.monotonic()
        self._epoch_anchor = self._clock.time()
        figures = self._boot_figures(config, split, weight_gb, startup_gb)
        self._write_log(
            sglang_logs.boot_block(
                figures, ranks, tp_size=serving.tp_size, pp_size=serving.pp_size, ready_at=self._epoch_anchor
            )
        )

    def _memory_figures(self, config: SchedulerServerConfig) -> tuple[float, float]:
        """Weights and startup free memory (GiB per GPU) consistent with rest and mem_fraction_static."""
        rest_gb = config.rest_bytes / GIB
        weight_gb = max(0.4 * rest_gb, 1.0)
        fraction = config.serving.mem_fraction_static or 0.85
        startup_gb = (weight_gb + rest_gb) / fraction
        return weight_gb, startup_gb

    def _boot_figures(
        self, config: SchedulerServerConfig, split: PoolSplit, weight_gb: float, startup_gb: float
    ) -> sglang_logs.BootFigures:
        serving = config.serving
        model_class, _, conv_fraction = architecture_of(config.model_name)
        requested = serving.max_running_requests
        fp8 = "fp8" in config.model_name.lower() or serving.kv_cache_dtype.startswith("fp8")
        return sglang_logs.BootFigures(
            model_path=config.model_name,
            model_class=model_class,
            server_args=self._logged_server_args(config),
            startup_available_gb=startup_gb,
            weight_gb=weight_gb,
            load_elapsed_s=41.27,
            max_mamba_cache_size=split.max_mamba_cache_size,
            state_bytes_per_slot=config.constants.state_bytes_per_slot,
            intermediate_bytes=split.intermediate_bytes,
            kv_tokens=split.kv_capacity_tokens,
            kv_bytes_per_token=config.constants.kv_bytes_per_token,
            kv_cache_dtype=serving.kv_cache_dtype,
            page_size=serving.page_size,
            max_running_requests=split.max_running_requests,
            clamped_by_state_pool=split.clamped_by_state_pool,
            slots_per_request=slots_per_request(serving),
            requested_max_running_requests=None if requested is None else max(1, requested // serving.attn_dp_size),
            chunked_prefill_size=config.chunked_prefill_size,
            max_prefill_tokens=config.max_prefill_tokens,
            context_len=config.model_context_len,
            graph_decode_gb=GRAPH_DECODE_GB,
            cuda_graph_bs=tuple(b for b in CUDA_GRAPH_BS if b <= max(split.max_running_requests, 1)),
            host=self._host,
            port=self.port if self._httpd is not None else self._requested_port,
            quant="fp8" if fp8 else None,
            server_pid=self._pid_base + 100 * self._boot_count - 1,
            conv_state_fraction=conv_fraction,
            spec_max_running_reset=spec_enabled(serving) and serving.draft_tokens > 0 and requested is None,
            release=self._log_release,
        )

    def _logged_server_args(self, config: SchedulerServerConfig) -> dict[str, Any]:
        """The fields the boot log's `server_args=` line shows (its form follows the version profile)."""
        args = server_args_fields(config, self._profile, self._host, self._bound_port(), self._api_key)
        keys = (
            "model_path", "tp_size", "dp_size", "pp_size", "page_size", "mamba_full_memory_ratio",
            "max_mamba_cache_size", "mamba_radix_cache_strategy", "mamba_scheduler_strategy", "kv_cache_dtype",
            "mamba_ssm_dtype", "mem_fraction_static", "max_running_requests", "disable_radix_cache",
            "speculative_algorithm", "speculative_num_draft_tokens", "enable_metrics",
        )  # fmt: skip
        return {k: args[k] for k in keys if k in args}

    def _bound_port(self) -> int:
        return self.port if self._httpd is not None else self._requested_port

    def _tick_loop(self) -> None:
        while not self._stopping.wait(self._tick_seconds):
            try:
                with self._lock:
                    self._advance()
            except Exception as exc:  # a simulator bug must not kill the server silently
                self._write_log([sglang_logs.line(time.time(), f"emulator: simulator error: {exc!r}")])
                self._stopping.wait(1.0)

    def _max_request_tokens(self, worker: _Worker) -> int:
        """SGLang's max_req_len on a worker: min(context length, KV capacity) - 1 (managers/scheduler.py)."""
        return min(self._config.model_context_len, worker.view.live.kv_capacity_tokens) - 1

    def _advance(self) -> None:
        """Advance every worker to the current simulated time and fold the events in (lock held)."""
        target = self._sim_now()
        batch: list[tuple[float, int, SimEvent]] = []
        for index, worker in enumerate(self._workers):
            if worker.sim.now >= target:
                continue
            batch.extend((event.time, index, event) for event in worker.sim.advance(target))
        batch.sort(key=lambda item: (item[0], item[1]))
        lines: list[str] = []
        request_lines: list[str] = []
        ticked: set[int] = set()
        for sim_time, index, event in batch:
            worker = self._workers[index]
            wall = self._wall_time_of(sim_time)
            if isinstance(event, RequestFinished):
                self._tokenizer.observe(event)
                if self._request_log_file is not None:
                    stream = is_streaming_request(event.rid)
                    request_lines.append(sglang_logs.request_json_line(
                        event, wall, stream=stream, level=self._log_requests_level,
                        client_max_new_tokens=sglang_logs.client_max_new_tokens(event, self._max_request_tokens(worker))))
            elif isinstance(event, Retraction):
                worker.pending_retracted_reqs = event.retracted_requests
                text = sglang_logs.retraction_line(event, profile=self._profile)
                lines.extend(sglang_logs.line(wall, text, prefix) for prefix in self._rank_prefixes(index, stats_only=False))
            elif isinstance(event, (PrefillBatch, DecodeTick)):
                if isinstance(event, PrefillBatch) and worker.view.queue_time is not None:
                    # as SGLang: each request's first wait, observed as its first forward begins
                    for wait in event.first_waits:
                        worker.view.queue_time.observe(wait)
                worker.view.last_retracted_reqs = worker.pending_retracted_reqs
                worker.pending_retracted_reqs = 0
                worker.view.last_tick_was_decode = isinstance(event, DecodeTick)
                ticked.add(index)
                if isinstance(event, DecodeTick):
                    consts = self._consts_or_fail()
                    accept = (consts.spec_accept_length, consts.spec_accept_rate) if consts.draft_tokens else None
                    text = sglang_logs.decode_line(event, accept=accept)
                else:
                    text = sglang_logs.prefill_line(event, pending_tokens=event.pending_tokens)
                lines.extend(sglang_logs.line(wall, text, prefix) for prefix in self._rank_prefixes(index, stats_only=True))
        for index, worker in enumerate(self._workers):
            snap = worker.sim.snapshot()
            worker.view.live = snap
            if index in ticked:
                worker.view.gauges = snap
        if lines:
            self._write_log(lines)
        if request_lines and self._request_log_file is not None:
            self._request_log_file.write("\n".join(request_lines) + "\n")
            self._request_log_file.flush()

    def _rank_prefixes(self, worker: int, *, stats_only: bool) -> list[str]:
        assert self._layout is not None
        serving = self._config.serving
        return [
            sglang_logs.rank_prefix(rank, tp_size=serving.tp_size, pp_size=serving.pp_size)
            for rank in self._layout.ranks
            if rank.worker == worker and (rank.is_stats_rank or not stats_only)
        ]

    def _write_log(self, lines: list[str]) -> None:
        if self._log_file is None or not lines:
            return
        self._log_file.write("\n".join(lines) + "\n")
        self._log_file.flush()

    def log_lines(self, lines: list[str]) -> None:
        with self._lock:
            self._write_log(lines)

    # ------------------------------------------------------------------ observables

    def metrics_text(self) -> str:
        with self._lock:
            self._advance()
            assert self._layout is not None and self._consts is not None
            return render_metrics(self._layout, [w.view for w in self._workers], self._tokenizer, self._consts)

    def server_info(self) -> dict[str, Any]:
        with self._lock:
            self._advance()
            return server_info_body(
                self._config,
                self._profile,
                self._host,
                self._bound_port(),
                self._api_key,
                [w.view for w in self._workers],
                self._consts_or_fail(),
            )

    def model_info(self) -> dict[str, Any]:
        model_class, model_type, _ = architecture_of(self._config.model_name)
        return {
            "model_path": self._config.model_name,
            "served_model_name": self._config.model_name,
            "tokenizer_path": self._config.model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": model_type,
            "architectures": [model_class],
        }

    def loads(self, dp_rank: int | None = None, include: set[str] | None = None) -> list[dict[str, Any]]:
        with self._lock:
            self._advance()
            if dp_rank is not None and not 0 <= dp_rank < len(self._workers):
                raise ValueError(f"dp_rank {dp_rank} out of range [0, {len(self._workers)})")
            consts = self._consts_or_fail()
            return [
                load_entry(i, w.view, consts, w.pending_retracted_reqs, include)
                for i, w in enumerate(self._workers)
                if dp_rank is None or dp_rank == i
            ]

    def _consts_or_fail(self) -> ServerConstants:
        assert self._consts is not None
        return self._consts

    def state(self, *, advance: bool = True) -> dict[str, Any]:
        """The live simulated state, for tests and the demo. `advance=False` reports the state as of the
        last advance (after `stop()`: exactly what the log and the last scrape were written from)."""
        with self._lock:
            if advance:
                self._advance()
            split = self._split
            assert split is not None
            return {
                "sim_time": self._sim_now(),
                "speed": self._speed,
                "version_profile": self._profile,
                "boot_count": self._boot_count,
                "fault": self._fault,
                "ratio": self._config.serving.mamba_full_memory_ratio
                if self._config.serving.max_mamba_cache_size is None
                else None,
                "max_mamba_cache_size_flag": self._config.serving.max_mamba_cache_size,
                "split": dataclasses.asdict(split),
                "requests_finished": self._tokenizer.requests,
                "workers": [
                    {
                        **dataclasses.asdict(w.view.live),
                        "last_retracted_reqs_gauge": w.view.last_retracted_reqs,
                    }
                    for w in self._workers
                ],
            }


# ---------------------------------------------------------------------- bodies


def spec_acceptance(config: SchedulerServerConfig) -> tuple[float, float]:
    """(accept length, accept rate) the cost model assumes; (0, 0) without speculative decoding.

    rate = accepted drafts / proposed drafts = (length - 1) / (draft_tokens - 1) (metrics_reporter.py:974-982).
    """
    serving = config.serving
    if not (spec_enabled(serving) and serving.draft_tokens > 0):
        return 0.0, 0.0
    length = float(config.cost.spec_accept_length)
    return length, min((length - 1) / max(serving.draft_tokens - 1, 1), 1.0)


def server_args_fields(
    config: SchedulerServerConfig, profile: str, host: str, port: int, api_key: str | None
) -> dict[str, Any]:
    """The ServerArgs fields `/server_info` shows (flattened, resolved), in the fixtures' order."""
    serving = config.serving
    spec = spec_enabled(serving)
    resolved = resolve_strategy(serving)
    strategy = serving.strategy if resolved == "none" else resolved
    max_running = serving.max_running_requests
    if max_running is None and spec and serving.draft_tokens > 0:
        max_running = 48  # arg_groups/speculative_hook.py sets it when unset
    fields: dict[str, Any] = {
        "model_path": config.model_name,
        "served_model_name": config.model_name,
        "tp_size": serving.tp_size,
        "dp_size": serving.dp_size,
        "attn_dp_size": serving.attn_dp_size,
        "pp_size": serving.pp_size,
        "dcp_size": serving.dcp_size,
        "attn_cp_size": 1,
        "page_size": serving.page_size,
        "mem_fraction_static": serving.mem_fraction_static if serving.mem_fraction_static is not None else 0.85,
        "kv_cache_dtype": serving.kv_cache_dtype,
        "max_running_requests": max_running,
        "max_total_tokens": None,
        "chunked_prefill_size": config.chunked_prefill_size,
        # the admission knobs the advisor's replay takes from a live server (ServerArgs shows every field)
        "max_prefill_tokens": config.max_prefill_tokens,
        "schedule_policy": "fcfs",
        "schedule_conservativeness": config.schedule_conservativeness,
        "context_length": None,
        "disable_radix_cache": serving.disable_radix_cache,
        "disable_overlap_schedule": serving.disable_overlap_schedule or resolved == "no_buffer",
        "max_mamba_cache_size": serving.max_mamba_cache_size,
        "mamba_full_memory_ratio": serving.mamba_full_memory_ratio,
        "mamba_radix_cache_strategy": strategy,
        "uses_mamba_radix_cache": not serving.disable_radix_cache,
        "mamba_ssm_dtype": serving.mamba_ssm_dtype,
        "mamba_track_interval": 256,
        "enable_int8_mamba_checkpoint": False,
        "speculative_algorithm": serving.speculative_algorithm or ("EAGLE" if serving.draft_tokens > 0 else None),
        "speculative_num_draft_tokens": serving.draft_tokens if spec else None,
        "speculative_num_steps": max(serving.draft_tokens - 1, 1) if spec else None,
        "speculative_eagle_topk": 1 if spec else None,
        "enable_metrics": True,
        "decode_log_interval": config.decode_log_interval,
        "host": host,
        "port": port,
        "api_key": api_key,
        "enable_dp_attention": serving.attn_dp_size > 1,
        "launch_command": None,
    }
    if profile == "0.5.10":
        # Up to 0.5.10 the strategy field was `mamba_scheduler_strategy` (reference §2.3).
        fields = {("mamba_scheduler_strategy" if k == "mamba_radix_cache_strategy" else k): v for k, v in fields.items()}
    return fields


def server_info_body(
    config: SchedulerServerConfig,
    profile: str,
    host: str,
    port: int,
    api_key: str | None,
    views: list[WorkerView],
    consts: ServerConstants,
) -> dict[str, Any]:
    """`/server_info`: resolved server args + scheduler handshake + one `internal_states` entry per DP rank."""
    serving = config.serving
    args = server_args_fields(config, profile, host, port, api_key)
    body: dict[str, Any] = dict(args)
    if worker_count(serving) == 1:
        body["status"] = "ready"  # the DP controller's handshake has no status (data_parallel_controller.py)
    # Under DCP SGLang reports logical tokens (physical rows x dcp): tp_worker.py `get_worker_info` returns
    # `logical_max_total_num_tokens`, which internal_state.py puts in memory_usage.token_capacity.
    logical = max(1, serving.dcp_size)
    body["max_total_num_tokens"] = views[0].live.kv_capacity_tokens * logical
    body["max_req_input_len"] = config.model_context_len - 6
    body["startup_time"] = {"load_weight": 41.27, "kv_cache_allocation": 1.2, "scheduler_e2e": 75.0}
    body["kv_events"] = None
    world_size = serving.tp_size * serving.pp_size
    if serving.attn_dp_size > 1:
        world_size = serving.tp_size * serving.pp_size
    states = []
    for view in views:
        live = view.live
        state: dict[str, Any] = dict(args)
        state["max_mamba_cache_size"] = live.max_mamba_cache_size  # the per-DP-shard override
        state["world_size"] = world_size
        state["effective_max_running_requests_per_dp"] = live.max_running_requests
        state["last_gen_throughput"] = round(view.gauges.gen_throughput, 2)
        state["memory_usage"] = {
            "weight": round(consts.weight_memory_gb, 3),
            "kvcache": round(consts.kv_cache_memory_gb, 3),
            "startup_available": round(consts.startup_available_gb, 3),
            "token_capacity": live.kv_capacity_tokens * logical,
            "token_capacity_swa": None,
            "graph": {
                "prefill": 0.0,
                "decode": round(consts.graph_decode_gb, 3),
                "target_verify": 0.0,
                "draft_prefill": 0.0,
                "draft_decode": 0.0,
                "draft_extend": 0.0,
            },
        }
        state["disaggregation_mode"] = "null"
        state["decode_cuda_graph_bs"] = [b for b in CUDA_GRAPH_BS if b <= max(live.max_running_requests, 1)]
        state["decode_cuda_graph_memory_gb"] = round(consts.graph_decode_gb, 3)
        if consts.draft_tokens:
            state["avg_spec_accept_length"] = consts.spec_accept_length
        states.append(state)
    body["internal_states"] = states
    body["version"] = profile
    body["frontend"] = "python"
    return body


LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def load_entry(
    dp_rank: int, view: WorkerView, consts: ServerConstants, retracted_gauge: int, include: set[str] | None
) -> dict[str, Any]:
    """One `loads[]` entry of `/v1/loads` (managers/load_snapshot.py `LoadSnapshot.to_dict`)."""
    live, stats = view.live, view.gauges
    entry: dict[str, Any] = {
        "timestamp": time.time(),
        "dp_rank": dp_rank,
        "num_running_reqs": live.running_requests,
        "num_waiting_reqs": live.queued_requests,
        "num_waiting_uncached_tokens": 0,
        "num_used_tokens": live.kv_used_tokens,
        "num_total_tokens": live.kv_used_tokens,
        "num_active_tokens": live.kv_used_tokens,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": live.kv_capacity_tokens,
        "max_running_requests": live.max_running_requests,
        "token_usage": round(live.kv_used_tokens / live.kv_capacity_tokens, 4) if live.kv_capacity_tokens else 0.0,
        "gen_throughput": round(stats.gen_throughput, 2),
        "cache_hit_rate": round(stats.cache_hit_rate, 4),
        "utilization": 0.0,
        "total_prefill_uncached_tokens": live.prefill_compute_tokens_total,
        "total_prefill_busy_us": 0,
        "decode_moments": None,
    }
    if include is not None and include == {"core"}:
        return entry
    everything = include is None or "all" in include
    sections: list[tuple[str, str, dict[str, Any]]] = [
        (
            "memory",
            "memory",
            {
                "weight_gb": round(consts.weight_memory_gb, 3),
                "kv_cache_gb": round(consts.kv_cache_memory_gb, 3),
                "graph_gb": round(consts.graph_decode_gb + consts.graph_prefill_gb, 3),
                "token_capacity": live.kv_capacity_tokens,
            },
        ),
        (
            "speculative",
            "spec",
            {"accept_length": consts.spec_accept_length, "accept_rate": consts.spec_accept_rate}
            if consts.draft_tokens
            else {},
        ),
        (
            "disaggregation",
            "disagg",
            {
                "mode": "null",
                "prefill_bootstrap_queue_reqs": 0,
                "prefill_inflight_queue_reqs": 0,
                "decode_prealloc_queue_reqs": 0,
                "decode_transfer_queue_reqs": 0,
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0,
                "kv_transfer_latency_ms": 0.0,
            },
        ),
        (
            "queues",
            "queues",
            {"waiting": live.queued_requests, "grammar": 0, "paused": 0, "retracted": retracted_gauge, "prealloc_ready": 0},
        ),
    ]
    for key, name, section in sections:
        if section and (everything or (include is not None and name in include)):
            entry[key] = section
    return entry


def loads_prometheus(entries: list[dict[str, Any]]) -> str:
    """`/v1/loads?format=prometheus`: plain `sglang_<field>{dp_rank="i"}` gauges (v1_loads.py)."""
    prefixes = {"disaggregation": "disagg", "speculative": "spec"}
    samples: dict[str, list[tuple[int, Any]]] = {}
    for entry in entries:
        entry = dict(entry)
        dp_rank = entry.pop("dp_rank")
        for key, value in entry.items():
            if isinstance(value, dict):
                prefix = prefixes.get(key, key)
                for sub, sub_value in value.items():
                    if isinstance(sub_value, (int, float)) and not isinstance(sub_value, bool):
                        samples.setdefault(f"sglang_{prefix}_{sub}", []).append((dp_rank, sub_value))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                samples.setdefault(f"sglang_{key}", []).append((dp_rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines.extend(f'{name}{{dp_rank="{rank}"}} {value}' for rank, value in values)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- HTTP


class _TrackingHTTPServer(ThreadingHTTPServer):
    """Remembers open connections so that stop() can close keep-alive ones (shutdown() only stops accepting)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._open_lock:
            open_now = list(self._open)
        for conn in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _make_handler(emulator: EmulatedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        server_ref = emulator

    return Handler


class _Handler(BaseHTTPRequestHandler):
    server_ref: EmulatedServer
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        return  # access lines go to the SGLang log in uvicorn's format instead

    # -------------------------------------------------------------- plumbing

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode())

    def _dispatch(self, method: str) -> None:
        emulator = self.server_ref
        parts = urlsplit(self.path)
        path = parts.path
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        status = 500
        try:
            length = int(self.headers.get("content-length") or 0)
            if length > 0:
                self.rfile.read(min(length, 1 << 20))
            status = self._route(emulator, method, path, query)
        except Exception as exc:  # never let a bug kill the connection silently
            status = 500
            try:
                self._json(500, {"error": f"emulator error: {exc}"})
            except OSError:
                pass
        finally:
            if emulator._started and not path.startswith("/_emulator/"):
                emulator.log_lines(
                    [sglang_logs.access_line(time.time(), f"{self.client_address[0]}:{self.client_address[1]}", method, self.path, status)]
                )

    def _authorized(self, path: str) -> bool:
        key = self.server_ref._api_key
        if key is None or path.startswith(AUTH_EXEMPT_PREFIXES):
            return True
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and token == key

    def _route(self, emulator: EmulatedServer, method: str, path: str, query: dict[str, str]) -> int:
        if not self._authorized(path):
            self._json(401, {"error": "Unauthorized"})
            return 401
        if path.startswith("/_emulator/"):
            return self._control(emulator, method, path, query)
        routes: dict[str, Callable[[dict[str, str]], tuple[int, bytes, str]]] = {
            "/health": self._empty_ok,
            "/health_generate": self._empty_ok,
            "/ready": self._empty_ok,
            "/model_info": lambda q: self._json_body(emulator.model_info()),
            "/get_model_info": lambda q: self._deprecated("/get_model_info", "/model_info", emulator.model_info),
            "/server_info": lambda q: self._json_body(emulator.server_info()),
            "/get_server_info": lambda q: self._deprecated("/get_server_info", "/server_info", emulator.server_info),
            "/v1/loads": lambda q: self._loads(emulator, q),
        }
        if emulator.version_profile == "0.5.10":
            routes["/get_load"] = lambda q: self._get_load(emulator)
        handler: Callable[[dict[str, str]], tuple[int, bytes, str]] | None
        if path == "/metrics" or path.startswith("/metrics/"):
            handler = lambda q: (200, emulator.metrics_text().encode(), CONTENT_TYPE)  # noqa: E731
        else:
            handler = routes.get(path)
        if handler is None:
            self._json(404, {"detail": "Not Found"})
            return 404
        if method != "GET":
            self._json(405, {"detail": "Method Not Allowed"})
            return 405
        fault = emulator.fault
        if fault == "http500":
            self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            return 500
        if fault == "hang":
            emulator._stopping.wait(HANG_SECONDS)
        status, body, content_type = handler(query)
        if fault == "garbage" and status == 200:
            body = b"\x00\xff<html>not what you asked for</html>\n\x1b[31m{{garbage \xfe\n"
        elif fault == "truncate" and status == 200 and body:
            body = _truncate(body)
        self._send(status, body, content_type)
        return status

    def _empty_ok(self, _query: dict[str, str]) -> tuple[int, bytes, str]:
        return 200, b"", "text/plain; charset=utf-8"

    def _json_body(self, payload: Any) -> tuple[int, bytes, str]:
        return 200, json.dumps(payload).encode(), "application/json"

    def _deprecated(self, old: str, new: str, produce: Callable[[], Any]) -> tuple[int, bytes, str]:
        self.server_ref.log_lines([sglang_logs.deprecation_line(time.time(), old, new)])
        return self._json_body(produce())

    def _loads(self, emulator: EmulatedServer, query: dict[str, str]) -> tuple[int, bytes, str]:
        include = {s.strip() for s in query["include"].split(",")} if query.get("include") else None
        if include is not None and not include <= LOAD_SECTIONS:
            detail = f"Invalid include sections: {include - LOAD_SECTIONS}. Valid options: {sorted(LOAD_SECTIONS)}"
            return 400, json.dumps({"detail": detail}).encode(), "application/json"
        dp_rank: int | None = None
        if query.get("dp_rank") not in (None, ""):
            try:
                dp_rank = int(query["dp_rank"])
            except ValueError:
                return 422, json.dumps({"detail": "dp_rank must be an integer"}).encode(), "application/json"
        try:
            entries = emulator.loads(dp_rank, include)
        except ValueError as exc:
            return 400, json.dumps({"detail": str(exc)}).encode(), "application/json"
        if query.get("format") == "prometheus":
            return 200, loads_prometheus(entries).encode(), CONTENT_TYPE
        serving = emulator.config.serving
        per_rank = serving.tp_size * serving.pp_size
        if serving.attn_dp_size > 1:
            per_rank //= serving.attn_dp_size
        payload = {
            "timestamp": datetime.now(timezone.utc).isoformat(),
            "version": emulator.version_profile,
            "accelerator": None,
            "num_accelerators": per_rank,
            "loads": entries,
        }
        return self._json_body(payload)

    def _get_load(self, emulator: EmulatedServer) -> tuple[int, bytes, str]:
        entries = emulator.loads(None, {"core"})
        body = [
            {
                "dp_rank": e["dp_rank"],
                "num_reqs": e["num_running_reqs"],
                "num_waiting_reqs": e["num_waiting_reqs"],
                "num_tokens": e["num_used_tokens"],
            }
            for e in entries
        ]
        return self._json_body(body)

    def _control(self, emulator: EmulatedServer, method: str, path: str, query: dict[str, str]) -> int:
        try:
            if path == "/_emulator/state" and method == "GET":
                self._json(200, emulator.state())
                return 200
            if path == "/_emulator/fault" and method == "POST":
                emulator.set_fault(query.get("mode", ""))
                self._json(200, {"fault": emulator.fault})
                return 200
            if path == "/_emulator/restart" and method == "POST":
                ratio = float(query["ratio"]) if query.get("ratio") else None
                pinned = int(query["max_mamba_cache_size"]) if query.get("max_mamba_cache_size") else None
                emulator.restart(ratio=ratio, max_mamba_cache_size=pinned)
                self._json(200, emulator.state())
                return 200
        except ValueError as exc:
            self._json(400, {"error": str(exc)})
            return 400
        self._json(404, {"detail": "Not Found"})
        return 404


def _truncate(body: bytes) -> bytes:
    """Cut a body in the middle of a line, as a connection dropped mid-transfer would: for /metrics
    inside the label set of a sample past the middle, so the last line cannot parse as a sample."""
    start = body.rfind(b"\n", 0, len(body) // 2) + 1
    while start < len(body):
        end = body.find(b"\n", start)
        end = len(body) if end < 0 else end
        brace = body.find(b"{", start, end)
        if not body.startswith(b"#", start) and brace >= 0:
            return body[: brace + max((end - brace) // 3, 1)]
        start = end + 1
    return body[: max(len(body) // 2, 1)]
