"""Parse time per MB of the log readers on pathological lines of 20 KB, 500 KB and 5 MB, side by side: a
reader that is linear in its input shows the same seconds per MB in every column. Prints figures, asserts
nothing (tests never time anything).

    python bench/parse_linear.py
    python bench/parse_linear.py --sizes 20000,500000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from advisor.errors import InputError
from advisor.sources.bootlog import parse_boot_log
from advisor.sources.formats import parse_server_args
from advisor.sources.loglines import LogLineParser

STAMP = "[2026-11-29 10:00:46 TP0] "
POOLS = (
    STAMP + "Mamba Cache is allocated. max_mamba_cache_size: 257, conv_state size: 0.46GB, ssm_state size: 13.04GB \n"
    + STAMP + "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, KV size: 1.00 GB\n"
)  # fmt: skip


def _label_run(size: int) -> str:
    """One space-free run before `KV Cache`: `(?P<label>\\S+) KV Cache` with search() was quadratic on it."""
    return POOLS + STAMP + "x" * size + " KV Cache is allocated. #tokens: 5\n"


def _lazy_dots(size: int) -> str:
    """`Load weight end.` then `type=` over and over with no `avail mem=`: the `.*?type=.*?avail mem=` case."""
    return POOLS + STAMP + "Load weight end. " + "type=a, " * (size // 8) + "\n"


def _server_args_dict(size: int) -> str:
    fields = {f"field_{i}": [i, None, True, {"k": "v, w"}] for i in range(size // 48)}
    return STAMP + "server_args=" + repr(fields) + "\n" + POOLS


def _server_args_cut(size: int) -> str:
    """A repr cut short and full of quotes and brackets: read item by item (no literal_eval of the whole)."""
    return STAMP + "server_args=ServerArgs(" + "a='x, (y', b=[1, {2: '3'}], " * (size // 30) + "\n" + POOLS


def _json_request(size: int) -> str:
    meta = {"prompt_tokens": 10, "completion_tokens": 5, "pad": "p" * size}
    record = {"timestamp": "2026-11-29T10:00:00", "event": "request.finished", "rid": "r", "out": {"meta_info": meta}}
    return STAMP + json.dumps(record) + "\n"


def _stats_fields(size: int) -> str:
    return STAMP + "Decode batch, #running-req: 1, " + "#x: 1, " * (size // 7) + "#queue-req: 0\n"


def _boot(text: str) -> None:
    try:
        parse_boot_log(text)
    except InputError:
        pass


def _lines(text: str) -> None:
    parser = LogLineParser()
    parser.feed(text.splitlines())
    parser.flush()


def _args_only(text: str) -> None:
    parse_server_args(text.splitlines()[0])


CASES: list[tuple[str, Callable[[int], str], Callable[[str], None]]] = [
    ("bootlog: space-free label run", _label_run, _boot),
    ("bootlog: Load weight end + type= x N", _lazy_dots, _boot),
    ("bootlog: server_args dict", _server_args_dict, _boot),
    ("formats: server_args repr cut short", _server_args_cut, _args_only),
    ("loglines: space-free label run", _label_run, _lines),
    ("loglines: JSON request line", _json_request, _lines),
    ("loglines: stats line, many fields", _stats_fields, _lines),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000,500000,5000000", help="line sizes in bytes, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs per cell")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    header = f"{'case':40}" + "".join(f"{f'{s / 1e3:g} KB s/MB':>18}" for s in sizes)
    print(header)
    print("-" * len(header))
    for name, make, run in CASES:
        cells = []
        for size in sizes:
            text = make(size)
            best = float("inf")
            for _ in range(args.repeat):
                start = time.perf_counter()
                run(text)
                best = min(best, time.perf_counter() - start)
            cells.append(best / (len(text) / 1e6))
        print(f"{name:40}" + "".join(f"{c:18.4f}" for c in cells))


if __name__ == "__main__":
    main()
