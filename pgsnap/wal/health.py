"""Archiver health from a ``pg_stat_archiver`` row (pure)."""

from __future__ import annotations

import datetime as dt
from typing import Final

from pgsnap._attrs import frozen
from pgsnap.model import ArchiverStatus
from pgsnap.wal.names import WalFileKind, parse_archive_name

__all__ = [
    "ArchiverHealth",
    "archiver_health",
]


@frozen
class ArchiverHealth:
    """Whether WAL archiving works: ``reasons`` (blocking) and ``warnings`` (not blocking).

    Each reason and warning is a sentence that says what is wrong and what to do.
    """

    healthy: bool
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


_NEG_INF: Final = dt.datetime.min.replace(tzinfo=dt.UTC)


def _history_tli(name: str | None) -> int | None:
    if name is None:
        return None
    e = parse_archive_name(name.strip())
    return e.timeline if e.kind is WalFileKind.HISTORY else None


def _wal_tli(name: str | None) -> int | None:
    if name is None:
        return None
    e = parse_archive_name(name.strip())
    return e.timeline if e.kind is not WalFileKind.UNKNOWN else None


def archiver_health(
    status: ArchiverStatus,
    *,
    max_ready_age_seconds: float = 300,
    server_version: int | None = None,
) -> ArchiverHealth:
    """Judge WAL archiving from a ``pg_stat_archiver`` row and the archiving settings.

    Rules (blocking unless noted):

    * ``wal_level`` must be ``replica`` or ``logical``;
    * ``archive_mode`` must be ``on`` or ``always``;
    * ``archive_command`` or ``archive_library`` must be set; both set is an
      error from PostgreSQL 16 (``server_version`` >= 160000, or unknown) and a
      warning on 15, where ``archive_library`` wins;
    * CloudNativePG's rule: the last success must be newer than the last failure
      (a missing time counts as minus infinity) - except Barman's case of a
      failed ``.history`` file whose timeline is not above the last archived
      file's timeline (usually the file already exists in the archive), which
      is only a warning;
    * the oldest ``.ready`` file must not be older than ``max_ready_age_seconds``.
    """
    reasons: list[str] = []
    warnings: list[str] = []
    wal_level = (status.wal_level or "").strip().lower()
    if wal_level not in ("replica", "logical"):
        reasons.append(
            f"wal_level is {status.wal_level!r}; set wal_level = replica (or logical) and "
            "restart PostgreSQL so that WAL can be archived and backups restored"
        )
    mode = (status.archive_mode or "").strip().lower()
    if mode not in ("on", "always"):
        reasons.append(
            f"archive_mode is {status.archive_mode!r}; set archive_mode = on (always for "
            "backups taken from a standby) and restart PostgreSQL"
        )
    command = (status.archive_command or "").strip()
    library = (status.archive_library or "").strip()
    if command == "(disabled)":
        command = ""
    if not command and not library:
        reasons.append(
            "neither archive_command nor archive_library is set, so WAL piles up in pg_wal "
            "and nothing reaches the archive; set archive_command (e.g. a copy into the "
            "archive directory) and reload"
        )
    elif command and library:
        msg = (
            "both archive_command and archive_library are set; PostgreSQL 16 and later "
            "refuse to archive with both - clear one of them and reload"
        )
        if server_version is not None and server_version < 160000:
            warnings.append(
                "both archive_command and archive_library are set; archive_library is used "
                "and archive_command ignored - clear archive_command to avoid confusion"
            )
        else:
            reasons.append(msg)
    failed_at = status.last_failed_time
    archived_at = status.last_archived_time
    if failed_at is not None and (archived_at or _NEG_INF) <= failed_at:
        failed_hist = _history_tli(status.last_failed_wal)
        archived_tli = _wal_tli(status.last_archived_wal)
        if failed_hist is not None and archived_tli is not None and failed_hist <= archived_tli:
            warnings.append(
                f"archiving of {status.last_failed_wal} failed at {failed_at.isoformat()}, but "
                f"it is a history file of a timeline not newer than the last archived file "
                f"{status.last_archived_wal}; it usually already exists in the archive - check "
                "that the copy there is identical"
            )
        else:
            when = (
                "never succeeded"
                if archived_at is None
                else (f"last succeeded at {archived_at.isoformat()}")
            )
            reasons.append(
                f"WAL archiving is failing: {status.last_failed_wal or 'a file'} failed at "
                f"{failed_at.isoformat()} and archiving {when} ({status.failed_count} failures "
                "since the statistics reset); check the PostgreSQL log for the archive_command "
                "error and fix the archive (space, permissions, mount)"
            )
    elif status.failed_count and failed_at is not None:
        warnings.append(
            f"{status.failed_count} archive failures since the statistics reset (last at "
            f"{failed_at.isoformat()}); archiving has recovered since"
        )
    if status.archived_count == 0 and archived_at is None and failed_at is None:
        warnings.append(
            "nothing has been archived yet; run SELECT pg_switch_wal() and check that the "
            "segment arrives in the archive"
        )
    age = status.oldest_ready_age_seconds
    if age is not None and age > max_ready_age_seconds:
        reasons.append(
            f"the oldest WAL file waiting to be archived (.ready) is {age:.0f} s old (limit "
            f"{max_ready_age_seconds:.0f} s); the archiver is failing or too slow - check the "
            "PostgreSQL log and the archive's speed and free space"
        )
    return ArchiverHealth(not reasons, tuple(reasons), tuple(warnings))
