"""`python -m rhino` is the `rhino` command."""

import sys

from .cli.main import main

sys.exit(main())
