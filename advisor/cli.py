"""`pool-advisor` entry point: builds the argument parser from the subcommand modules and
turns input errors into one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from advisor import __version__
from advisor.errors import InputError
from advisor.model.serving import ConfigError
from advisor.scrub import scrub_text

# name -> one-line summary for the listing. Only the module of the command being run is imported, so the
# daemon and the one-shot commands never load the simulator (advisor.sim), which only demo/simulate/emulate use.
SUBCOMMANDS = {
    "recommend": "one-shot: the optimal --mamba-full-memory-ratio for a boot log / config and a context length",
    "inspect": "run the sources once and print what was observed",
    "run": "the advisor daemon: scrape, estimate, recommend, export",
    "demo": "emulated SGLang server + the advisor watching it, in about a minute",
    "simulate": "run a workload through the dual-pool simulator at one ratio or a sweep",
    "emulate": "run an emulated SGLang server over the simulator",
}


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand argv names (its first non-option word), if it is one of ours."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in SUBCOMMANDS else None
    return None


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (the command and what is wrong) and exit code 2,
    not the usage block; `--help` still prints the full usage. Subcommand parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        first = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {first} (see --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser for `command` (every command's when None); other commands get their summary only."""
    parser = OneLineParser(
        prog="pool-advisor",
        description="Advice on the state/KV pool split (--mamba-full-memory-ratio) of hybrid SGLang servers.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, summary in SUBCOMMANDS.items():
        if command is not None and name != command:
            sub.add_parser(name, help=summary)
            continue
        try:
            module = importlib.import_module(f"advisor.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"advisor.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command_of(words))
    args = parser.parse_args(words)
    try:
        return int(args.handler(args) or 0)
    except (InputError, ConfigError, ValueError) as exc:
        # one line: the message may quote a file or a server; scrubbed and cut like any outside text
        print(f"pool-advisor {args.command}: error: {scrub_text(str(exc), 1000)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
