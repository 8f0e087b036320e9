"""`python -m rhino.cli` is the `rhino` command."""

import sys

from .main import main

sys.exit(main())
