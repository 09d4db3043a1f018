"""The one-way dependency rule: the core never imports the simulator, and the pure rooms import no I/O room."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

PACKAGE = REPO / "advisor"
SHARED_PATH = re.compile(r"""/\s*["']shared["']|\.\./shared|/work/shared""")
# Only these shell commands may use the simulator (they exist to run it).
SIM_USERS = {"advisor/commands/demo.py", "advisor/commands/simulate.py", "advisor/commands/emulate.py"}
# room -> rooms it must never import (architecture: sources -> estimate -> recommend -> export, model under all)
FORBIDDEN = {
    "model": ("sources", "estimate", "recommend", "export", "daemon", "sim", "commands", "feeder", "scheduler"),
    "scheduler": ("sources", "estimate", "recommend", "export", "daemon", "sim", "commands", "feeder"),
    "estimate": ("recommend", "export", "daemon", "sim", "commands", "sources.http", "sources.follow"),
    "recommend": ("sources", "export", "daemon", "sim", "commands"),
    "sources": ("estimate", "recommend", "export", "daemon", "sim", "commands"),
    "export": ("daemon", "sim", "commands", "sources.http", "sources.follow"),
}


def _imports(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(REPO).as_posix(), path


def test_only_the_simulator_commands_import_the_simulator():
    offenders = [
        (name, module) for name, path in _modules()
        if not name.startswith("advisor/sim/") and name not in SIM_USERS
        for module in _imports(path) if module == "advisor.sim" or module.startswith("advisor.sim.")
    ]
    assert offenders == []


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_rooms_import_only_downstream(room):
    offenders = []
    for name, path in _modules():
        if not name.startswith(f"advisor/{room}/"):
            continue
        for module in _imports(path):
            for banned in FORBIDDEN[room]:
                if module == f"advisor.{banned}" or module.startswith(f"advisor.{banned}."):
                    offenders.append((name, module))
    assert offenders == []


def test_the_daemon_command_loads_no_simulator_module():
    code = (
        "import sys\n"
        "from advisor.cli import build_parser\n"
        "for command in ('run', 'recommend', 'inspect'):\n"
        "    build_parser(command)\n"
        "import advisor.daemon.runner, advisor.export.server, advisor.feeder\n"
        "print(sorted(m for m in sys.modules if m.startswith('advisor.sim')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_nothing_reads_the_team_folder_beside_the_repo():
    """The repo stands alone: no code, test or benchmark reaches for ../shared (fixtures are vendored)."""
    offenders = []
    for folder in ("advisor", "tests", "bench"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == Path(__file__):
                continue
            if SHARED_PATH.search(path.read_text(encoding="utf-8")):
                offenders.append(path.relative_to(REPO).as_posix())
    assert offenders == []


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    command = next(line for line in readme[:12] if "pytest" in line)
    assert command in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
