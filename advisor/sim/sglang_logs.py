"""Format SGLang server log lines (boot block, batch statistics, retraction warnings, request logs)
exactly as the SGLang release being emulated prints them, so the emulated server's log reads like a real one.
The boot block's era-dependent lines (server_args repr or dict, KV line with or without `dtype:`, the clamp
warning) come from the one format table the readers use too, `advisor.sources.formats`.

Pure: every function takes the wall time to stamp and plain values, and returns strings. Templates:
reference §3 and SGLang 0.5.23 `model_executor/model_runner.py`, `mem_cache/memory_pool.py`,
`mem_cache/kv_cache_configurator.py`, `managers/scheduler.py`, `managers/scheduler_components/
metrics_reporter.py` + `pool_stats_observer.py`, `utils/log_utils.py`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from advisor.model.pools import GIB
from advisor.scheduler.types import DecodeTick, PrefillBatch, RequestFinished, Retraction
from advisor.sim.exposition import SchedulerRank
from advisor.sources.formats import line_format, log_era, server_args_dict, server_args_repr

# Default share of a state slot's bytes that is conv state (the rest is the SSM/temporal state): 0.46 GB
# of 13.50 GB in the seed's TP8 boot log (fixtures/logs/boot-tp8-default.log); Qwen3-Next has 0.92 of 39.98.
CONV_STATE_FRACTION = 0.034
READY_LINE = "The server is fired up and ready to roll!"

_TORCH_KV_DTYPES = {
    "fp8_e4m3": "torch.float8_e4m3fn",
    "fp8_e5m2": "torch.float8_e5m2",
    "mxfp8": "torch.float8_e4m3fn",
    "nvfp4": "torch.uint8",
    "fp4_mx_block16": "torch.uint8",
}


def timestamp(wall_time: float) -> str:
    """`%Y-%m-%d %H:%M:%S` in local time, as `configure_logger` prints (no milliseconds, no level)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall_time))


def rank_prefix(rank: SchedulerRank, *, tp_size: int, pp_size: int = 1) -> str:
    """` DP{d} PP{p} TP{t}`: each piece only when its dimension is > 1; DP only with a DP rank
    (managers/scheduler.py:6279-6298). A single-GPU server has no prefix."""
    parts = ""
    if rank.dp_rank is not None:
        parts += f" DP{rank.dp_rank}"
    if pp_size > 1:
        parts += f" PP{rank.pp_rank}"
    if tp_size > 1:
        parts += f" TP{rank.tp_rank}"
    return parts


def line(wall_time: float, message: str, prefix: str = "") -> str:
    return f"[{timestamp(wall_time)}{prefix}] {message}"


def torch_kv_dtype(kv_cache_dtype: str) -> str:
    return _TORCH_KV_DTYPES.get(kv_cache_dtype, "torch.bfloat16")


def single_kv_buffer(kv_cache_dtype: str) -> bool:
    """fp8-family caches print one `KV size`, bf16 prints `K size` and `V size` (memory_pool.py:2073-2097)."""
    return kv_cache_dtype in _TORCH_KV_DTYPES


@dataclass(frozen=True)
class BootFigures:
    """Everything one boot block states, per GPU (one DP shard). GiB figures follow from the bytes."""

    model_path: str
    model_class: str
    server_args: dict[str, object]  # the fields the `server_args=` line shows
    startup_available_gb: float
    weight_gb: float
    load_elapsed_s: float
    max_mamba_cache_size: int
    state_bytes_per_slot: float
    intermediate_bytes: float
    kv_tokens: int
    kv_bytes_per_token: float
    kv_cache_dtype: str
    page_size: int
    max_running_requests: int
    clamped_by_state_pool: bool
    slots_per_request: int
    requested_max_running_requests: int | None  # per worker, None when the user did not set it
    chunked_prefill_size: int
    max_prefill_tokens: int
    context_len: int
    graph_decode_gb: float
    cuda_graph_bs: tuple[int, ...]
    host: str = "127.0.0.1"
    port: int = 30000
    quant: str | None = None
    server_pid: int = 4711
    conv_state_fraction: float = CONV_STATE_FRACTION
    # speculative decoding with --max-running-requests unset: the hook resets it to 48 and says so
    spec_max_running_reset: bool = False
    release: str = "0.5.23"  # the SGLang release whose log formats to write (see formats.log_era)

    @property
    def conv_state_gb(self) -> float:
        return (self.max_mamba_cache_size + 1) * self.state_bytes_per_slot * self.conv_state_fraction / GIB

    @property
    def ssm_state_gb(self) -> float:
        return (
            (self.max_mamba_cache_size + 1) * self.state_bytes_per_slot * (1 - self.conv_state_fraction) / GIB
        )

    @property
    def kv_gb(self) -> float:
        """K+V buffers hold `#tokens + page_size` slots (one padding page)."""
        return (self.kv_tokens + self.page_size) * self.kv_bytes_per_token / GIB

    @property
    def avail_after_weights_gb(self) -> float:
        return self.startup_available_gb - self.weight_gb

    @property
    def pool_end_avail_gb(self) -> float:
        state_gb = self.conv_state_gb + self.ssm_state_gb + self.intermediate_bytes / GIB
        return self.avail_after_weights_gb - state_gb - self.kv_gb

    @property
    def ready_avail_gb(self) -> float:
        return self.pool_end_avail_gb - self.graph_decode_gb


def server_args_line(fig: BootFigures) -> str:
    """`server_args=ServerArgs(...)` up to 0.5.17, `server_args={...}` (resolved_dict) from 0.5.20."""
    if log_era(fig.release).server_args == "dict":
        return line_format("server_args_dict").template.format(body=server_args_dict(fig.server_args))
    return line_format("server_args_repr").template.format(body=server_args_repr(fig.server_args))


def mamba_line(fig: BootFigures) -> str:
    intermediate = ""
    if fig.intermediate_bytes > 0:
        inter_gb = fig.intermediate_bytes / GIB
        intermediate = (
            f"intermediate_ssm_state_cache size: {inter_gb * (1 - fig.conv_state_fraction):.2f}GB "
            f"intermediate_conv_window_cache size: {inter_gb * fig.conv_state_fraction:.2f}GB "
        )
    return line_format("mamba_pool").template.format(
        size=fig.max_mamba_cache_size, conv=fig.conv_state_gb, ssm=fig.ssm_state_gb, intermediate=intermediate
    )


def kv_line(fig: BootFigures) -> str:
    """With `dtype:` from 0.5.14, without before (memory_pool.py); one `KV size` for fp8, K and V for bf16."""
    if single_kv_buffer(fig.kv_cache_dtype):
        sizes = f"KV size: {fig.kv_gb:.2f} GB"
    else:
        sizes = f"K size: {fig.kv_gb / 2:.2f} GB, V size: {fig.kv_gb / 2:.2f} GB"
    if log_era(fig.release).kv_dtype:
        return line_format("kv_pool_dtype").template.format(
            label="", dtype=torch_kv_dtype(fig.kv_cache_dtype), tokens=fig.kv_tokens, sizes=sizes
        )
    return line_format("kv_pool_plain").template.format(label="", tokens=fig.kv_tokens, sizes=sizes)


def caps_line(fig: BootFigures) -> str:
    return line_format("caps").template.format(
        tokens=fig.kv_tokens,
        chunk=fig.chunked_prefill_size,
        prefill=fig.max_prefill_tokens,
        mrr=fig.max_running_requests,
        ctx=fig.context_len,
        avail=fig.ready_avail_gb,
    )


def capped_line(fig: BootFigures) -> str:
    return line_format("capped_by_state_pool").template.format(
        cap=fig.max_running_requests, size=fig.max_mamba_cache_size, slots=fig.slots_per_request
    )


def boot_block(
    fig: BootFigures,
    ranks: Sequence[SchedulerRank],
    *,
    tp_size: int,
    pp_size: int = 1,
    ready_at: float,
) -> list[str]:
    """The boot log of one SGLang start, ending with the ready line at wall time `ready_at`.

    Every scheduler rank prints its own copy of the weight/pool/graph lines; the cap warning and the caps
    line come from TP0 of each DP replica only.
    """
    graph_s = 18.92
    start = ready_at - (fig.load_elapsed_s + graph_s + 6.0)
    t_weights = start + 4.0
    t_pools = t_weights + fig.load_elapsed_s
    t_graph = t_pools + 2.0
    t_caps = t_graph + graph_s
    prefixed = [(r, rank_prefix(r, tp_size=tp_size, pp_size=pp_size)) for r in ranks]
    first_of_replica = [
        (r, p) for r, p in prefixed if r.tp_rank == min(x.tp_rank for x in ranks if x.dp_rank == r.dp_rank)
    ]
    quant = f"quant={fig.quant}, " if fig.quant else ""
    bs = ", ".join(str(b) for b in fig.cuda_graph_bs)

    out = [line(start, server_args_line(fig))]
    if fig.spec_max_running_reset:
        out.append(
            line(
                start,
                "Max running requests is reset to 48 for speculative decoding. You can override this by "
                "explicitly setting --max-running-requests.",
            )
        )

    def every_rank(at: float, message: str) -> None:
        out.extend(line(at, message, p) for _, p in prefixed)

    every_rank(t_weights, f"Load weight begin. avail mem={fig.startup_available_gb:.2f} GB")
    every_rank(
        t_pools,
        f"Load weight end. elapsed={fig.load_elapsed_s:.2f} s, type={fig.model_class}, {quant}"
        f"avail mem={fig.avail_after_weights_gb:.2f} GB, mem usage={fig.weight_gb:.2f} GB.",
    )
    every_rank(t_pools + 1, mamba_line(fig))
    every_rank(t_pools + 1, kv_line(fig))
    every_rank(t_pools + 1, f"Memory pool end. avail mem={fig.pool_end_avail_gb:.2f} GB")
    for _, p in first_of_replica:
        if fig.clamped_by_state_pool:
            if log_era(fig.release).capped_warning:  # before 0.5.20 the clamp shows only in the caps line
                out.append(line(t_pools + 1, capped_line(fig), p))
        elif (
            fig.requested_max_running_requests is not None
            and fig.max_running_requests < fig.requested_max_running_requests
        ):
            out.append(
                line(
                    t_pools + 1,
                    f"max_running_requests was reduced from the requested {fig.requested_max_running_requests} to "
                    f"{fig.max_running_requests} (per dp worker) due to the available KV cache capacity.",
                    p,
                )
            )
    every_rank(
        t_graph,
        f"Capture cuda decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem={fig.pool_end_avail_gb - 0.14:.2f} GB",
    )
    every_rank(
        t_caps,
        f"Capture cuda decode CUDA graph end. bs=[{bs}], elapsed={graph_s:.2f} s, mem usage={fig.graph_decode_gb:.2f} GB, "
        f"avail mem={fig.ready_avail_gb:.2f} GB.",
    )
    for _, p in first_of_replica:
        out.append(line(t_caps, caps_line(fig), p))
    t_http = ready_at - 1.0
    out += [
        line(t_http, f"INFO:     Started server process [{fig.server_pid}]"),
        line(t_http, "INFO:     Waiting for application startup."),
        line(t_http, "INFO:     Application startup complete."),
        line(t_http, f"INFO:     Uvicorn running on http://{fig.host}:{fig.port} (Press CTRL+C to quit)"),
        line(ready_at, READY_LINE),
    ]
    return out


def prefill_line(event: PrefillBatch, *, pending_tokens: int = 0) -> str:
    """The hybrid-SSM `Prefill batch` line (metrics_reporter.py:753-805)."""
    return line_format("prefill_hybrid").template.format(
        new_seqs=event.new_seqs,
        new_tokens=event.new_tokens,
        cached=event.cached_tokens,
        usage=event.full_token_usage,
        mamba_usage=event.mamba_usage,
        running=event.running_requests,
        queued=event.queued_requests,
        pending=pending_tokens,
        graph=False,
        throughput=event.input_throughput,
    )


def decode_line(event: DecodeTick, *, accept: tuple[float, float] | None = None) -> str:
    """The hybrid-SSM `Decode batch` line (metrics_reporter.py:963-1071), ending at `#queue-req`;
    `accept` = (accept len, accept rate) with speculative decoding."""
    spec = f"accept len: {accept[0]:.2f}, accept rate: {accept[1]:.2f}, " if accept is not None else ""
    return line_format("decode_hybrid").template.format(
        running=event.running_requests,
        used=event.kv_used_tokens,
        usage=event.full_token_usage,
        mamba=event.mamba_used_slots,
        mamba_usage=event.mamba_usage,
        spec=spec,
        graph=True,
        throughput=event.gen_throughput,
        queued=event.queued_requests,
    )


def retraction_line(event: Retraction, *, profile: str = "0.5.23") -> str:
    """`KV cache pool is full. Retract requests. ...` (scheduler.py:4525-4536); 0.5.10 had no mamba part."""
    details = f"#retracted_reqs: {event.retracted_requests}, #new_tokens_gained: {event.new_tokens_gained}"
    if profile != "0.5.10":
        details += f", #mamba_num_gained: {event.mamba_slots_gained}"
    details += f", #new_token_ratio: {event.new_token_ratio_before:.4f} -> {event.new_token_ratio_after:.4f}"
    return "KV cache pool is full. Retract requests. " + details


# The token a request that stopped on its own matched (FINISH_MATCHED_TOKEN's `matched`): any EOS id.
EOS_TOKEN_ID = 151645


def client_max_new_tokens(event: RequestFinished, max_request_tokens: int) -> int | None:
    """The max_new_tokens a request's client sent, from the one the scheduler kept: a client that set none has it
    capped at the context (max_req_len - input - 1, managers/scheduler.py init_req_max_new_tokens), which reads as
    unset here (None); so does a client cap at least that large, which SGLang clips alike."""
    return None if event.max_new_tokens >= max_request_tokens - event.prompt_tokens - 1 else event.max_new_tokens


def request_json_line(event: RequestFinished, wall_time: float, *, stream: bool, level: int = 0,
                      client_max_new_tokens: int | None = None) -> str:
    """One `--log-requests --log-requests-format json` record (utils/log_utils.py:60-74). Level 0 leaves out the
    sampling params; levels 1-3 (SGLang's default is 2) show them, max_new_tokens as the client sent it
    (`client_max_new_tokens`; null: unset) (utils/request_logger.py `_compute_metadata`). The finish reason is
    `length` where the output reached the request's max_new_tokens as the scheduler kept it, else `stop` on the
    EOS token (managers/schedule_batch.py FINISH_LENGTH, FINISH_MATCHED_TOKEN)."""
    finish_reason: dict[str, object]
    if event.aborted:
        finish_reason = {"type": "abort", "message": "Request aborted.", "status_code": 400}
    elif event.completion_tokens >= event.max_new_tokens:
        finish_reason = {"type": "length", "length": event.completion_tokens}
    else:
        finish_reason = {"type": "stop", "matched": EOS_TOKEN_ID}
    obj: dict[str, object] = {"rid": event.rid, "stream": stream, "log_metrics": True}
    if level >= 1:
        obj["sampling_params"] = {"max_new_tokens": client_max_new_tokens, "temperature": 0.0}
    record = {
        "timestamp": datetime.fromtimestamp(wall_time).isoformat(),
        "event": "request.finished",
        "rid": event.rid,
        "obj": obj,
        "out": {
            "meta_info": {
                "id": event.rid[-8:],
                "finish_reason": finish_reason,
                "prompt_tokens": event.prompt_tokens,
                "weight_version": "default",
                "total_retractions": event.num_retractions,
                "completion_tokens": event.completion_tokens,
                "cached_tokens": event.cached_tokens,
                "num_retractions": event.num_retractions,
                "e2e_latency": round(event.e2e_latency, 4),
            }
        },
    }
    return line(wall_time, json.dumps(record, ensure_ascii=False))


def access_line(wall_time: float, client: str, method: str, path: str, status: int) -> str:
    """A uvicorn access-log line (utils/common.py:3509-3519)."""
    reason = {
        200: "OK",
        401: "Unauthorized",
        404: "Not Found",
        500: "Internal Server Error",
        503: "Service Unavailable",
    }
    return line(
        wall_time,
        f'INFO:     {client} - "{method} {path} HTTP/1.1" {status} {reason.get(status, "")}'.rstrip(),
    )


def deprecation_line(wall_time: float, old: str, new: str) -> str:
    return line(
        wall_time,
        f"Endpoint '{old}' is deprecated and will be removed in a future version. Please use '{new}' instead.",
    )
