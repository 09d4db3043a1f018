"""Long fuzzing runs over the parsers (metrics exposition, boot log, log lines, server_info, config).

Two engines, same targets and invariant (tests/hardening/fuzz_targets.py: only InputError may come out):

    python bench/fuzz.py                          # atheris, coverage-guided, 60 s per target, seeded from fixtures
    python bench/fuzz.py --seconds 600 --target metrics
    python bench/fuzz.py --engine hypothesis --examples 20000
    python bench/fuzz.py --scaling                # time per MB at 1, 4 and 16 MB inputs (linear or not)

atheris is not a dependency (`pip install atheris`); without it the atheris engine says so and stops. A finding
is printed with its input saved under $TMPDIR/pool-advisor-fuzz/findings/ (corpora beside it).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "hardening"))
sys.path.insert(0, str(REPO))

TARGET_NAMES = ("boot_log", "config", "log_lines", "metrics", "server_info")  # fuzz_targets.TARGETS


def _targets():  # imported late: the atheris child must import the parsers under instrumentation
    import fuzz_targets  # noqa: PLC0415

    return fuzz_targets

WORK = Path(tempfile.gettempdir()) / "pool-advisor-fuzz"  # corpora and findings: never in the repository
FINDINGS = WORK / "findings"


def _atheris_child(target: str, seconds: float, corpus: str) -> None:
    import atheris  # noqa: PLC0415 (optional)

    with atheris.instrument_imports(include=["advisor"]):
        fuzz = _targets()

    def one_input(data: bytes) -> None:
        fuzz.check(target, data)

    FINDINGS.mkdir(parents=True, exist_ok=True)
    argv = [sys.argv[0], f"-max_total_time={int(seconds)}", "-max_len=65536", "-rss_limit_mb=2048",
            "-timeout=10", f"-artifact_prefix={FINDINGS}/{target}-", corpus]
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


def run_atheris(targets: list[str], seconds: float) -> int:
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("atheris is not installed (pip install atheris); use --engine hypothesis", file=sys.stderr)
        return 2
    worst = 0
    for target in targets:
        corpus = WORK / "corpus" / target
        corpus.mkdir(parents=True, exist_ok=True)
        for index, seed in enumerate(_targets().seeds(target)):
            (corpus / f"seed-{index}").write_bytes(seed[:65536])
        started = time.monotonic()
        log = WORK / f"{target}.log"
        with open(log, "w") as sink:
            code = subprocess.call([sys.executable, __file__, "--atheris-child", target, "--seconds", str(seconds),
                                    "--corpus", str(corpus)], stdout=sink, stderr=subprocess.STDOUT)
        took = time.monotonic() - started
        done = [line.split("\t", 1)[-1].strip() for line in log.read_text(errors="replace").splitlines() if "DONE" in line]
        runs = log.read_text(errors="replace").count("\n")
        verdict = "no finding" if code == 0 else f"FINDING: see {log} and {FINDINGS}"
        print(f"{target:12s} atheris {took:7.1f} s  exit {code}  {done[-1] if done else f'({runs} log lines)'}  {verdict}")
        worst = max(worst, code)
    return 0 if worst == 0 else 1


def run_hypothesis(targets: list[str], examples: int) -> int:
    env = dict(os.environ, FUZZ_EXAMPLES=str(examples))
    selected = " or ".join(
        {"metrics": "metrics", "boot_log": "boot_log", "log_lines": "log_lines", "server_info": "server_info",
         "config": "config"}[t] for t in targets)
    started = time.monotonic()
    code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(REPO / "tests" / "hardening" / "test_fuzz_parsers.py"), "-k",
                            f"({selected}) and not linear"], env=env, cwd=REPO)
    print(f"hypothesis: {examples} examples per property, {time.monotonic() - started:.0f} s, exit {code}")
    return code


def run_scaling(targets: list[str]) -> int:
    print(f"{'target':12s} {'input MB':>9s} {'seconds':>8s} {'s per MB':>9s}")
    for target in targets:
        fuzz = _targets()
        base = max(fuzz.seeds(target), key=len)
        for megabytes in (1, 4, 16):
            data = base if base.endswith(b"\n") else base + b"\n"
            data = data * max(1, (megabytes << 20) // len(data))  # whole copies: each one stays well-formed
            started = time.perf_counter()
            fuzz.check(target, data)
            took = time.perf_counter() - started
            size = len(data) / (1 << 20)
            print(f"{target:12s} {size:9.1f} {took:8.3f} {took / size:9.4f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("atheris", "hypothesis"), default="atheris")
    parser.add_argument("--target", action="append", choices=TARGET_NAMES, help="default: all")
    parser.add_argument("--seconds", type=float, default=60.0, help="atheris: time per target")
    parser.add_argument("--examples", type=int, default=5000, help="hypothesis: examples per property")
    parser.add_argument("--scaling", action="store_true", help="print parse time per MB at growing sizes")
    parser.add_argument("--atheris-child", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    args = parser.parse_args()
    targets = args.target or list(TARGET_NAMES)
    if args.atheris_child:
        _atheris_child(args.atheris_child, args.seconds, args.corpus)
        return 0
    if args.scaling:
        return run_scaling(targets)
    if args.engine == "atheris":
        return run_atheris(targets, args.seconds)
    return run_hypothesis(targets, args.examples)


if __name__ == "__main__":
    multiprocessing.freeze_support()
    sys.exit(main())
