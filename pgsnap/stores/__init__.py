"""Object stores: where pgsnap keeps objects off the database host.

A copy target (:mod:`pgsnap.copies`) and pgsnap's own WAL archive
(:mod:`pgsnap.archives`) keep their objects in an
:class:`~pgsnap.stores.base.ObjectStore`: a local directory
(:class:`~pgsnap.stores.directory.DirectoryStore`) or an S3-compatible bucket
(:class:`~pgsnap.stores.s3.S3Store`, through the lean client
:class:`~pgsnap.stores.s3http.S3Http`). The stores know keys and bytes; the
layouts, formats and error kinds are their users'.
"""

from __future__ import annotations

from pgsnap.stores.base import ObjectStore, StoredObject, StoreErrors, check_key
from pgsnap.stores.directory import DirectoryStore

__all__ = ["DirectoryStore", "ObjectStore", "StoreErrors", "StoredObject", "check_key"]
