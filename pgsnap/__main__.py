"""``python -m pgsnap``: the ``pgsnap`` command."""

from __future__ import annotations

import sys

from pgsnap._entry import script

if __name__ == "__main__":
    sys.exit(script())
