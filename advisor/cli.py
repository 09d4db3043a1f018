"""`pool-advisor` entry point: builds the argument parser from the subcommand modules and
turns input errors into one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from advisor import __version__
from advisor.errors import InputError
from advisor.model.serving import ConfigError

SUBCOMMANDS = ("recommend", "inspect", "run", "demo", "simulate", "emulate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pool-advisor",
        description="Advice on the state/KV pool split (--mamba-full-memory-ratio) of hybrid SGLang servers.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"advisor.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"advisor.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (InputError, ConfigError, ValueError) as exc:
        print(f"pool-advisor {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
