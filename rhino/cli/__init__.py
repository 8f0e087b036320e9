"""The ``rhino`` command (``python -m rhino`` or ``python -m rhino.cli``).

- :mod:`rhino.cli.main`: argument parsing and dispatch;
- :mod:`rhino.cli.verify`, :mod:`rhino.cli.restore`: ``rhino verify`` and ``rhino restore``;
- :mod:`rhino.cli.progress`: the progress bars they draw on stderr.
"""

from .main import main

__all__ = ["main"]
