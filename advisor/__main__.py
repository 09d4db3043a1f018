"""`python -m advisor` runs the CLI."""

import sys

from advisor.cli import main

sys.exit(main())
