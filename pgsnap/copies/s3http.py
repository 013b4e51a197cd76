"""Moved: :mod:`pgsnap.stores.s3http` (the lean S3 client serves every object store)."""

from __future__ import annotations

from pgsnap._moved import warn_moved
from pgsnap.stores.s3http import S3Http, S3HttpError, load_botocore

__all__ = ["S3Http", "S3HttpError", "load_botocore"]

warn_moved("pgsnap.copies.s3http", "pgsnap.stores.s3http")
