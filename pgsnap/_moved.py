"""Old module paths kept for one release: the warning their aliases give."""

from __future__ import annotations

import warnings

__all__ = ["warn_moved"]


def warn_moved(old: str, new: str, note: str = "") -> None:
    """Warn (``DeprecationWarning``) that module ``old`` moved to ``new``."""
    warnings.warn(
        f"{old} moved to {new}{note}; the old name is removed after the next release",
        DeprecationWarning,
        stacklevel=3,
    )
