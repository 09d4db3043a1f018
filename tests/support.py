"""Test support shared by every test folder: fixture paths (all vendored in tests/fixtures, see its README)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
LOGS = FIXTURES / "logs"
METRICS = FIXTURES / "metrics"
SERVER_INFO = FIXTURES / "server_info"
REAL = FIXTURES / "real"
