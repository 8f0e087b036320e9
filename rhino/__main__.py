"""`python -m rhino` is the `rhino` command."""

import sys

from .cli import main

sys.exit(main())
