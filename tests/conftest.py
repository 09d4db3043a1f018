"""Root conftest: puts tests/ on sys.path so every test folder imports `support` (paths, servers, pollers)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
