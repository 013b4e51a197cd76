"""The version of pgsnap (one place: the package root and the records read it here)."""

__version__ = "0.1.0"
