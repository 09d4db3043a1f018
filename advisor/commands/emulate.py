"""`pool-advisor emulate`: run an emulated SGLang server (simulator + SGLang's real observables) on a
local port until SIGINT/SIGTERM. With no arguments: the shipped default config and workload on :30000.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from advisor.errors import InputError
from advisor.sim.exposition import PROFILES
from advisor.sources.formats import release_key


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "emulate",
        help="run an emulated SGLang server over the simulator",
        description="Serve /metrics, /server_info, /model_info, /v1/loads and /health like SGLang "
        "0.5.23 (or 0.5.10), backed by the pool simulator; write SGLang-format logs.",
    )
    parser.add_argument("--config", metavar="FILE|NAME", help="server config (YAML file or shipped name; default: default)")
    parser.add_argument("--workload", metavar="FILE|NAME", help="workload (YAML file or shipped name; default: shipped default)")
    parser.add_argument("--ratio", type=float, metavar="R", help="override --mamba-full-memory-ratio of the config")
    parser.add_argument("--port", type=int, default=30000, help="port to listen on (default 30000; 0 picks a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the workload (default 0)")
    parser.add_argument("--log-file", metavar="F", help="write the SGLang server log here")
    parser.add_argument("--request-log-file", metavar="F", help="write --log-requests-format json lines here")
    parser.add_argument("--log-requests-level", type=int, choices=(0, 1, 2, 3), default=0,
                        help="SGLang's --log-requests-level for those lines: 0 leaves out the sampling params "
                             "(max_new_tokens), 1-3 show them (SGLang's own default is 2); default 0")
    parser.add_argument("--version-profile", choices=PROFILES, default="0.5.23", help="SGLang version to emulate")
    parser.add_argument(
        "--log-release",
        metavar="X.Y.Z",
        help="write the boot log in this SGLang release's formats, e.g. 0.5.11 (ServerArgs(...), no KV dtype), "
        "0.5.14 (KV dtype), 0.5.20 (server_args dict); default: the version profile's",
    )
    parser.add_argument("--api-key", metavar="K", help="require 'Authorization: Bearer K' (SGLang's --api-key)")
    parser.add_argument(
        "--collect-tokens-histogram",
        action="store_true",
        help="0.5.10 profile: export the prompt/generation token histograms (always on in 0.5.23)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # Imported here so `pool-advisor --help` stays fast.
    from advisor.sim.config import load_server_config
    from advisor.sim.emulator import EmulatedServer
    from advisor.sim.workload import load_workload

    if args.speed is None or not args.speed > 0:
        raise InputError(f"--speed must be > 0, got {args.speed}")
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be 0..65535, got {args.port}")
    if args.ratio is not None and not args.ratio > 0:
        raise InputError(f"--ratio must be > 0, got {args.ratio}")
    if args.log_release is not None and not release_key(args.log_release)[:3] > (0, 0, 0):
        raise InputError(f"--log-release must be an SGLang release like 0.5.14, got {args.log_release!r}")
    server = load_server_config(args.config)
    if args.ratio is not None:
        server = server.with_ratio(args.ratio)
    workload = load_workload(args.workload)
    emulator = EmulatedServer(
        server,
        workload,
        host=args.host,
        port=args.port,
        speed=args.speed,
        seed=args.seed,
        log_path=args.log_file,
        request_log_path=args.request_log_file,
        log_requests_level=args.log_requests_level,
        version_profile=args.version_profile,
        api_key=args.api_key,
        collect_tokens_histogram=args.collect_tokens_histogram,
        log_release=args.log_release,
    )
    try:
        emulator.start()
    except OSError as exc:
        raise InputError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    done = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        done.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    split = server.split()
    print(
        f"emulated SGLang {args.version_profile} at {emulator.url} "
        f"(model {server.model_name}, max_mamba_cache_size={split.max_mamba_cache_size}, "
        f"max_total_num_tokens={split.kv_capacity_tokens}, max_running_requests={split.max_running_requests}, "
        f"speed x{args.speed:g})",
        flush=True,
    )
    try:
        while not done.wait(0.5):
            pass
    finally:
        emulator.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("emulated server stopped", file=sys.stderr)
    return 0
