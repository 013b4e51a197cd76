"""``lvm``: a real :class:`~pgsnap.protocols.StorageBackend` on lvm2 logical volumes.

Volumes, snapshots and restores
-------------------------------

- **A volume is a logical volume**, identified as ``vg/lv``, in one of the
  volume groups the backend is given. Every LV of those groups is a volume
  except thin pools, hidden and internal LVs, snapshots (pgsnap's and classic
  ones) and LVs tagged by pgsnap. The host finds it at ``/dev/vg/lv``
  (:meth:`LvmBackend.locate`).
- **A snapshot is an LV** named ``<lv>.pgsnap.<token>.<n>`` beside its origin,
  with id ``vg/<name>``:

  - of a **thin volume**, a thin snapshot (``lvcreate -s`` without a size). It
    gets lvm's activation-skip flag (``Vwi---tz-k``): it stays inactive, and
    :meth:`LvmBackend.ex_activate` activates it with ``lvchange -ay -K`` to read it;
  - of any other volume, a classic copy-on-write snapshot whose store is sized
    by ``cow_size`` (default ``"25%ORIGIN"``; ``"100%ORIGIN"`` never
    overflows, or a size such as ``"2G"`` or a number of bytes). A classic
    snapshot whose store fills up becomes **invalid** (``swi-I-s---``):
    it is listed with ``extra["state"] == "invalid"``, refused by a restore
    (:class:`SnapshotInvalidError`), and :meth:`LvmBackend.ex_check` reports it,
    and every snapshot fuller than ``warn_percent`` (80 %), before anyone
    relies on them.
- **pgsnap's metadata lives in LV tags** (lvm's tag characters only:
  ``A-Z a-z 0-9 _ + . - / = ! : # &``): ``pgsnap`` (so ``lvs @pgsnap`` lists
  them), ``pgsnap.v=1``, ``pgsnap.group=<group id>``, ``pgsnap.origin=<lv>``,
  ``pgsnap.at=<creation time, µs, UTC>``, ``pgsnap.i=<index in the group>`` and
  ``pgsnap.name=<group name>`` (characters outside ``A-Za-z0-9_.-`` written as
  ``+XX``, hex of their UTF-8 bytes). The full backup record stays in pgsnap's
  catalog; the tags are enough to list the snapshots and groups from the
  volume group alone (a new backend on the same VG sees the same ones).
- **A restore** needs the file system unmounted
  (:meth:`LvmBackend.restore_profile` says ``UNMOUNT``) and the origin not
  open (refused with :class:`LvInUseError` otherwise):

  - thin: a thin snapshot of the backup's snapshot (tagged
    ``pgsnap.new=<volume>``) takes the volume's name and the volume (renamed,
    tagged ``pgsnap.old=``) is removed: the backup's snapshot is untouched
    (``consumes_snapshot=False``). Not a merge: lvm2 drops the origin of a
    thin volume's other snapshots when one is merged into it, after which
    they cannot be merged (a second restore would fail);
  - classic: the snapshot itself is merged (``lvconvert --merge``), and is
    consumed (``consumes_snapshot=True``: the recovery plan lists the backup
    as lost).

  Into a closed origin lvm merges at once (observed). When
  it defers the merge (``Delaying merge since origin is open``, ``Merging of
  ... will occur on next activation``), the origin is deactivated and
  activated again, which starts it; the restore returns only once ``lvs``
  shows the merged snapshot gone and the origin no longer merging: restores
  complete at once (``completes_later=False``).
  :meth:`LvmBackend.wait_for_restore` finishes a merge an interrupted restore
  left deferred, once the origin is closed.
- **Deletes** are ``lvremove -y``.
- **Clones** (``CLONES``) of thin snapshots are thin snapshots of the
  snapshot (``lvcreate -s``), active, without the activation-skip flag,
  tagged ``pgsnap.clone=<snapshot>``: volumes like the others (listed,
  located at ``/dev/vg/lv``), deleted by :meth:`LvmBackend.delete_clone`
  only. A classic snapshot cannot be snapshotted: its volume's restore
  profile says so (``clone_refusal``), and the clone planner refuses it
  with that reason before anything is made.

Consistency of a group (why ``CONSISTENCY_GROUPS`` is not declared)
--------------------------------------------------------------------

lvm2 has no multi-LV atomic snapshot: each ``lvcreate -s`` suspends its
origin, with device-mapper freezing the origin's file system around the
suspend, so every snapshot is a crash-consistent image of its own volume, but
two snapshots are two instants. The usual remedy, freezing every file system
of the group with ``fsfreeze`` and snapshotting meanwhile, **does not work
with the kernels this was tested on**: observed in the test VM (Debian's
6.1 kernel, lvm2 2.03.16), ``lvcreate -s`` of an origin whose ext4 is frozen
fails with ``device-mapper: suspend ioctl on ... failed: Device or resource
busy`` (device-mapper's own freeze finds the file system frozen), thin and
classic alike, and the failed classic attempt leaves a half-made LV behind
("Manual intervention required"). So the backend never freezes, takes the
snapshots one after the other in the order given, cleans up a half-made
snapshot after a failure, and does **not** claim ``CONSISTENCY_GROUPS``; the
backup plan then states that backup mode makes the backup consistent. That is
enough for pgsnap's backups, for the reason the btrfs backend gives: the
snapshots are taken between ``pg_backup_start`` and ``pg_backup_stop`` and
the restored cluster replays WAL from the backup's start to at least its stop
(``backup_label``), with the WAL from the archive.

Errors
------

lvm2's messages (``LC_ALL=C``; exit status 5 for most failures, 3 for a bad
command line) become typed errors: :class:`VolumeGroupNotFound`,
:class:`LvExistsError`, :class:`LvmNoSpaceError` (VG or thin pool),
:class:`SnapshotInvalidError`, :class:`LvInUseError` (file system in use,
device busy), :class:`LvmError` for the rest;
:class:`~pgsnap.errors.VolumeNotFound` and
:class:`~pgsnap.errors.SnapshotNotFound` for unknown ids; a command that times
out or a host that cannot be reached is
:class:`~pgsnap.errors.BackendUnavailable`.

Every command runs through the :class:`~pgsnap.host.Host`'s runner as an
argument list (``env LC_ALL=C LVM_SUPPRESS_FD_WARNINGS=1 lvs ...``), so the
backend works locally, over ssh, or on a test VM's console
(:mod:`pgsnap.testing.lvmvm`); lvm commands of one volume group run one at a
time. Listing reads ``lvs --reportformat json --units b --nosuffix``,
tolerant of lvm2 versions: values as strings (2.03.16) or ``json_std``
numbers, ``null`` and arrays, and the top-level ``log`` array of 2.03.26+.
lvm needs root on the host.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from pgsnap._attrs import frozen
from pgsnap.backends._common import CommandBackend, group_failure
from pgsnap.errors import (
    BackendError,
    ConfigurationError,
    SnapshotNotFound,
    UnsupportedCapability,
    VolumeNotFound,
)
from pgsnap.host.readonly import mount_read_only
from pgsnap.model import (
    Location,
    RestorePreparation,
    RestoreProfile,
    Severity,
    Snapshot,
    SnapshotGroup,
    SnapshotPolicy,
    StorageProblem,
    StorageVolume,
)
from pgsnap.protocols import Capability

if TYPE_CHECKING:
    from pgsnap.host import CommandResult, Host

__all__ = [
    "CAPABILITIES",
    "LV_FIELDS",
    "TAG_PREFIX",
    "LogicalVolume",
    "LvExistsError",
    "LvInUseError",
    "LvmBackend",
    "LvmError",
    "LvmNoSpaceError",
    "SnapshotInvalidError",
    "VolumeGroupNotFound",
    "classify_failure",
    "decode_tag_value",
    "encode_tag_value",
    "parse_lvs_json",
]

log = logging.getLogger(__name__)

_NAME: Final = "lvm"

CAPABILITIES: Final = frozenset({Capability.CLONES})
"""What the backend declares: clones (of thin snapshots; see the module docstring)."""

CLASSIC_CLONE_REFUSAL: Final = (
    "a classic LVM snapshot cannot be snapshotted (lvm2 makes snapshots of snapshots "
    "only in thin pools), so it has no writable copy to give a clone"
)
"""Why a volume with classic snapshots cannot be cloned (its restore profile's
``clone_refusal``)."""

TAG_PREFIX: Final = "pgsnap"
"""The bare tag on every LV pgsnap makes, and the prefix of its ``key=value`` tags."""

LV_FIELDS: Final = (
    "lv_name",
    "vg_name",
    "lv_attr",
    "lv_size",
    "origin",
    "pool_lv",
    "data_percent",
    "snap_percent",
    "lv_time",
    "lv_tags",
)
"""The ``lvs -o`` fields the backend reads."""

_METADATA_VERSION: Final = "1"
_STAMP: Final = "%Y%m%dT%H%M%S%fZ"
_GROUP_RE: Final = re.compile(r"^cg-\d{8}T\d{12}Z-[0-9a-f]{8}$")
_NAME_RE: Final = re.compile(r"^[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,126}$")
_COW_PERCENT_RE: Final = re.compile(r"^(\d{1,3})%ORIGIN$", re.I)
_COW_SIZE_RE: Final = re.compile(r"^\d+(\.\d+)?[bBsSkKmMgGtTpPeE]?$")
_PLAIN_TAG_CHARS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"
)
_MAX_TAG: Final = 1024
_ENV: Final = ("env", "LC_ALL=C", "LVM_SUPPRESS_FD_WARNINGS=1")
_ONE_TICK: Final = dt.timedelta(microseconds=1)
_POLL: Final = 0.5

_INSTALL_HINT: Final = "install lvm2 on the database host (apt-get install lvm2)"
_TIMEOUT_HINT: Final = (
    "lvm may be waiting for a lock held by another lvm command, or a device is "
    "suspended (dmsetup info -c shows it); check the host and retry"
)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --------------------------------------------------------------------------- errors


class LvmError(BackendError):
    """An lvm command failed (``argv``, ``stderr``: its last lines, when there was one)."""


class VolumeGroupNotFound(LvmError):
    """The volume group does not exist on the host (``volume_group``)."""


class LvExistsError(LvmError):
    """A logical volume of that name already exists in the volume group."""


class LvmNoSpaceError(LvmError):
    """Not enough free space in the volume group or the thin pool."""


class SnapshotInvalidError(LvmError):
    """A classic snapshot overflowed its copy-on-write store: its content is lost."""


class LvInUseError(LvmError):
    """The logical volume is open: a mounted file system, a process, another device."""


def classify_failure(
    result: CommandResult, *, what: str, hint: str | None = None, **details: Any
) -> LvmError:
    """The typed error for a failed lvm command (``what`` failed), from its exit
    status and its standard error (``LC_ALL=C``).

    Matches lvm2's messages case-insensitively, with or without quotes around
    names (older and newer lvm2 differ there).
    """
    err = result.error_text
    low = err.lower()
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    first = next((line for line in lines if not line.lower().startswith("warning")), None)
    tail = first or (lines[-1] if lines else f"exit status {result.returncode}")
    message = f"{what} failed: {tail}"
    info: dict[str, Any] = {
        "backend": _NAME,
        "argv": tuple(result.argv),
        "stderr": err,
        "returncode": result.returncode,
        **details,
    }
    if result.returncode == 127:
        return LvmError(f"{what} failed: lvm2 is not installed", hint=_INSTALL_HINT, **info)
    if "volume group" in low and "not found" in low:
        match = re.search(r'volume group "?([^"\s]+)"? not found', err, re.I)
        if match and "volume_group" not in info:
            info["volume_group"] = match.group(1)
        return VolumeGroupNotFound(
            message,
            hint="check the backend's volume_group setting (vgs lists the volume groups)",
            **info,
        )
    if "already exists" in low:
        return LvExistsError(
            message,
            hint="choose another name, or remove the logical volume that has it (lvs)",
            **info,
        )
    if (
        "insufficient free space" in low
        or "free space in thin pool" in low
        or "cannot create new thin volume" in low
        or "not enough free space" in low
    ):
        return LvmNoSpaceError(
            message,
            hint="free space in the volume group or thin pool (vgs, lvs: remove old "
            "snapshots, extend it), or give classic snapshots a smaller cow_size",
            **info,
        )
    if "invalidated snapshot" in low or "snapshot invalid" in low:
        return SnapshotInvalidError(
            message,
            hint="the snapshot overflowed its copy-on-write store and cannot be used: "
            "restore from another backup, and give classic snapshots more room "
            "(cow_size, e.g. '100%ORIGIN') or use thin volumes",
            **info,
        )
    if "in use" in low or "resource busy" in low or "is open" in low:
        return LvInUseError(
            message,
            hint="something has the logical volume open: unmount its file system and stop "
            "what uses it (fuser -vm /dev/VG/LV), then retry",
            **info,
        )
    if "device-mapper" in low and ("kernel" in low or "driver" in low):
        return LvmError(
            message,
            hint="the host's kernel has no device-mapper (modprobe dm-mod, dm-snapshot, "
            "dm-thin-pool)",
            **info,
        )
    if "permission denied" in low or "must be root" in low or "operation not permitted" in low:
        return LvmError(message, hint="lvm commands need root on the database host", **info)
    return LvmError(message, hint=hint or "see lvm's message; lvs -a -o+devices says more", **info)


# --------------------------------------------------------------------------- parsing


def encode_tag_value(text: str) -> str:
    """``text`` in lvm's tag characters: ``A-Za-z0-9_.-`` kept, other bytes as ``+XX``."""
    out: list[str] = []
    for ch in text:
        if ch in _PLAIN_TAG_CHARS:
            out.append(ch)
        else:
            out.extend(f"+{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def decode_tag_value(text: str) -> str:
    """The inverse of :func:`encode_tag_value` (a malformed escape is kept as is)."""
    raw = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "+" and re.fullmatch(r"[0-9A-Fa-f]{2}", text[i + 1 : i + 3]):
            raw.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(text[i].encode("utf-8"))
            i += 1
    return raw.decode("utf-8", "replace")


@frozen
class LogicalVolume:
    """One row of ``lvs``, normalized (sizes in bytes, percentages as floats)."""

    name: str
    vg: str
    attr: str
    size: int
    origin: str = ""
    pool: str = ""
    data_percent: float | None = None
    snap_percent: float | None = None
    time: str = ""
    tags: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """``vg/lv``."""
        return f"{self.vg}/{self.name}"

    @property
    def path(self) -> str:
        """``/dev/vg/lv``."""
        return f"/dev/{self.vg}/{self.name}"

    def _attr(self, index: int) -> str:
        return self.attr[index] if len(self.attr) > index else "-"

    @property
    def kind(self) -> str:
        """``attr[0]``: ``-`` plain, ``o``/``O`` origin (merging), ``s``/``S`` snapshot
        (merging), ``V`` thin volume, ``t`` thin pool..."""
        return self._attr(0)

    @property
    def hidden(self) -> bool:
        """An internal LV (``[name]``: pool data and metadata, a merging snapshot)."""
        return self.name.startswith("[")

    @property
    def bare_name(self) -> str:
        """The name without the brackets of a hidden LV."""
        return self.name.strip("[]")

    @property
    def thin(self) -> bool:
        """A thin volume (or thin snapshot)."""
        return self.kind == "V"

    @property
    def classic_snapshot(self) -> bool:
        """A classic copy-on-write snapshot (merging or not)."""
        return self.kind in ("s", "S")

    @property
    def merging(self) -> bool:
        """Merging: an origin (``O``) or a snapshot (``S``) of a merge in progress."""
        return self.kind in ("O", "S")

    @property
    def active(self) -> bool:
        """Active (``attr[4]`` is ``a``)."""
        return self._attr(4) == "a"

    @property
    def open(self) -> bool:
        """Open (``attr[5]`` is ``o``): mounted, or used by a process or device."""
        return self._attr(5) == "o"

    @property
    def invalid(self) -> bool:
        """A classic snapshot that overflowed (``attr[4]`` is ``I``) or failed to merge (``m``)."""
        return self._attr(4) in ("I", "m")

    @property
    def skip_activation(self) -> bool:
        """The activation-skip flag (``attr[9]`` is ``k``): activate with ``-K``."""
        return self._attr(9) == "k"

    def tag(self, key: str) -> str | None:
        """The value of pgsnap's ``pgsnap.<key>=value`` tag, or None."""
        prefix = f"{TAG_PREFIX}.{key}="
        for tag in self.tags:
            if tag.startswith(prefix):
                return tag[len(prefix) :]
        return None

    @property
    def pgsnap(self) -> bool:
        """Made by pgsnap (the bare ``pgsnap`` tag)."""
        return TAG_PREFIX in self.tags


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _number(value: object) -> float | None:
    if value is None or value == "" or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value).strip().rstrip("%").rstrip("bB"))
    except ValueError:
        return None


def _tags(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(str(v) for v in value if str(v))
    return tuple(t for t in str(value).split(",") if t)


def parse_lvs_json(text: str) -> tuple[LogicalVolume, ...]:
    """The LVs of ``lvs --reportformat json --units b --nosuffix -o ...`` output.

    Tolerant of lvm2 versions: values as strings (``""`` meaning none) or as
    ``json_std`` numbers, ``null`` and arrays; several report entries; the
    top-level ``log`` array of 2.03.26+ (ignored); text before the document.
    :class:`LvmError` when the output is not such a report.
    """
    start = text.find("{")
    if start < 0:
        if not text.strip():
            return ()
        raise LvmError(
            f"lvs printed no JSON report: {text.strip()[:200]!r}",
            hint="lvm2 2.02.158 or later is needed (--reportformat json)",
            backend=_NAME,
        )
    try:
        doc, _end = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise LvmError(f"lvs printed a report that is not JSON: {exc}", backend=_NAME) from exc
    reports = doc.get("report") if isinstance(doc, dict) else None
    if not isinstance(reports, list):
        raise LvmError("lvs printed JSON without a 'report' list", backend=_NAME)
    out: list[LogicalVolume] = []
    for report in reports:
        rows = report.get("lv", []) if isinstance(report, dict) else []
        for row in rows if isinstance(rows, list) else []:
            if not isinstance(row, dict):
                continue
            size = _number(row.get("lv_size"))
            out.append(
                LogicalVolume(
                    name=_text(row.get("lv_name")),
                    vg=_text(row.get("vg_name")),
                    attr=_text(row.get("lv_attr")),
                    size=int(size) if size is not None else 0,
                    origin=_text(row.get("origin")),
                    pool=_text(row.get("pool_lv")),
                    data_percent=_number(row.get("data_percent")),
                    snap_percent=_number(row.get("snap_percent")),
                    time=_text(row.get("lv_time")),
                    tags=_tags(row.get("lv_tags")),
                )
            )
    return tuple(out)


def _parse_id(value: object) -> tuple[str, str] | None:
    """``(vg, lv)`` from ``"vg/lv"``, or None when it cannot be an LV id."""
    if not isinstance(value, str) or value.count("/") != 1:
        return None
    vg, lv = value.split("/")
    if not _NAME_RE.match(vg) or not _NAME_RE.match(lv) or lv in (".", ".."):
        return None
    return vg, lv


def _cow_args(policy: str | int, origin_size: int = 0) -> tuple[str, ...]:
    """The ``lvcreate`` size arguments of a classic snapshot of an ``origin_size``-byte
    volume for ``cow_size``.

    A percentage is turned into bytes here: lvm clamps ``-l NN%ORIGIN`` to the free
    space of the volume group without a word (observed with lvm2 2.03.16: a
    ``100%ORIGIN`` snapshot of a 2.44 GiB volume got 1.55 GiB), whereas ``-L`` is
    refused when the space is not there.
    """
    if isinstance(policy, bool):
        raise ConfigurationError(f"cow_size must be a size or a percentage, not {policy!r}")
    if isinstance(policy, int):
        if policy <= 0:
            raise ConfigurationError(f"cow_size must be positive, not {policy}")
        return ("-L", f"{policy}b")
    text = str(policy).strip()
    match = _COW_PERCENT_RE.match(text)
    if match:
        percent = int(match.group(1))
        if not 1 <= percent <= 100:
            raise ConfigurationError(f"cow_size {text!r}: the percentage must be 1-100")
        wanted = max(1, -(-origin_size * percent // 100))
        return ("-L", f"{wanted}b")
    if _COW_SIZE_RE.match(text):
        return ("-L", text)
    raise ConfigurationError(
        f"invalid cow_size {policy!r}",
        hint="a percentage of the origin ('25%ORIGIN'), a size ('2G'), or bytes (an int)",
    )


# --------------------------------------------------------------------------- the backend


@frozen
class _Snap:
    lv: LogicalVolume
    record: Snapshot
    group_name: str
    index: int


class LvmBackend(CommandBackend):
    """Volumes on lvm2 logical volumes (see the module docstring).

    - ``volume_group``: the volume group (or groups) whose LVs are the volumes;
    - ``host``: the database host (default: this machine); every command runs
      through its runner;
    - ``cow_size``: the size of a classic snapshot's copy-on-write store:
      ``"NN%ORIGIN"`` (default ``"25%ORIGIN"``), an lvm size (``"2G"``) or bytes;
    - ``warn_percent``: :meth:`ex_check` reports snapshots fuller than this;
    - ``command_timeout``: seconds an lvm command may take;
    - ``merge_timeout``: seconds a restore may wait for its merge to finish;
    - ``clock``: the aware time stamped on snapshots (default: now, UTC).

    Thread-safe: lvm commands of one volume group take turns.
    """

    _NAME: ClassVar[str] = _NAME
    _ERROR: ClassVar[type[BackendError]] = LvmError
    _TIMEOUT_HINT: ClassVar[str] = _TIMEOUT_HINT
    _UNSUPPORTED_HINT: ClassVar[str] = "see docs/reference/lvm.md"
    _COMMAND_PREFIX: ClassVar[tuple[str, ...]] = _ENV

    def __init__(
        self,
        volume_group: str | Sequence[str],
        *,
        host: Host | None = None,
        cow_size: str | int = "25%ORIGIN",
        warn_percent: float = 80.0,
        command_timeout: float = 300.0,
        merge_timeout: float = 3600.0,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        groups = (volume_group,) if isinstance(volume_group, str) else tuple(volume_group)
        if not groups or any(
            not isinstance(g, str) or not _NAME_RE.match(g) or g.startswith("-") for g in groups
        ):
            raise ConfigurationError(
                f"volume_group must name one or more volume groups, not {volume_group!r}",
                hint="e.g. volume_group = 'pgvg' (vgs lists them)",
            )
        _cow_args(cow_size)
        for label, value in (
            ("command_timeout", command_timeout),
            ("merge_timeout", merge_timeout),
            ("warn_percent", warn_percent),
        ):
            if isinstance(value, bool) or not (isinstance(value, int | float) and value > 0):
                raise ConfigurationError(f"{label} must be a positive number, not {value!r}")
        if host is None:
            from pgsnap.host import Host  # noqa: PLC0415 - built only when none is given

            host = Host()
        self._host = host
        self._vgs = tuple(dict.fromkeys(groups))
        self._cow = cow_size
        self._warn = float(warn_percent)
        self._timeout = float(command_timeout)
        self._merge_timeout = float(merge_timeout)
        self._clock = clock or _utcnow
        self._lock = threading.RLock()
        self._vg_locks = {vg: threading.Lock() for vg in self._vgs}
        self._seen = threading.local()  # this thread's listing in an observation()

    # ------------------------------------------------------------------ basics

    @property
    def name(self) -> str:
        """Always ``"lvm"``."""
        return _NAME

    @property
    def capabilities(self) -> frozenset[Capability]:
        """``CLONES`` (see :data:`CAPABILITIES`)."""
        return CAPABILITIES

    @property
    def volume_groups(self) -> tuple[str, ...]:
        """The volume groups whose LVs are the volumes."""
        return self._vgs

    @property
    def host(self) -> Host:
        """The host whose lvm this is."""
        return self._host

    def __repr__(self) -> str:
        return f"<LvmBackend vg={','.join(self._vgs)} host={self._host.description}>"

    # ------------------------------------------------------------------ protocol: read

    def list_volumes(self) -> tuple[StorageVolume, ...]:
        """Every volume of the volume groups, by id."""
        lvs = self._lvs()
        return tuple(self._volume_record(lv) for lv in sorted(_volumes(lvs), key=lambda v: v.id))

    def get_volume(self, volume_id: str) -> StorageVolume:
        """One volume; ``VolumeNotFound`` when it is not one."""
        return self._volume_record(self._volume(self._lvs(), volume_id))

    def list_snapshots(self, volume_id: str | None = None) -> tuple[Snapshot, ...]:
        """pgsnap's snapshots (of one volume, or all), oldest first."""
        lvs = self._lvs()
        snaps = self._snapshots(lvs)
        if volume_id is not None:
            vol = self._volume(lvs, volume_id)
            snaps = [s for s in snaps if s.record.volume_id == vol.id]
        return tuple(s.record for s in snaps)

    def get_snapshot_group(self, group_id: str) -> SnapshotGroup:
        """A group with the snapshots it still has; ``SnapshotNotFound`` when none is left."""
        return _group_record(self._group(self._lvs(), group_id))

    def list_policies(self) -> tuple[SnapshotPolicy, ...]:
        """Always empty: lvm has no snapshot schedules."""
        return ()

    # ------------------------------------------------------------------ protocol: snapshots

    def create_snapshot_group(
        self, volume_ids: Sequence[str], name: str, *, secure: bool = False
    ) -> SnapshotGroup:
        """Snapshot the volumes one after the other, all or nothing.

        Thin volumes get thin snapshots, others classic ones sized by
        ``cow_size``. Not at one instant (see the module docstring). If one
        fails, the snapshots already taken (and a half-made one) are removed
        and the error names the volume. ``secure`` is refused.
        """
        if secure:
            raise UnsupportedCapability(
                "lvm cannot protect snapshots against deletion (no secure snapshots)",
                hint="take the backup without secure snapshots",
                backend=_NAME,
            )
        if isinstance(volume_ids, str):
            raise ConfigurationError(
                "volume_ids is a sequence of 'vg/lv' ids, not one string",
                hint=f"pass [{volume_ids!r}]",
            )
        ids = tuple(volume_ids)
        if not ids:
            raise ConfigurationError(
                "a snapshot group needs at least one volume", hint="pass 'vg/lv' ids"
            )
        if not isinstance(name, str):
            raise ConfigurationError(f"the group name must be a string, not {name!r}")
        encoded_name = encode_tag_value(name)
        if len(encoded_name) > _MAX_TAG - 32:
            raise ConfigurationError(
                f"the group name is too long for an lvm tag ({len(encoded_name)} characters "
                "once encoded)",
                hint="use a shorter name; the catalog keeps the full record",
            )
        with self._lock:
            lvs = self._lvs()
            vols = [self._volume(lvs, v) for v in ids]
            dupes = sorted({v.id for v in vols if [w.id for w in vols].count(v.id) > 1})
            if dupes:
                raise ConfigurationError(
                    f"volume(s) listed more than once: {', '.join(dupes)}",
                    hint="list each volume once",
                    volume_ids=tuple(dupes),
                )
            now = self._clock().astimezone(dt.UTC)
            token = secrets.token_hex(4)
            gid = f"cg-{now.strftime(_STAMP)}-{token}"
            taken: list[str] = []
            current: LogicalVolume | None = None
            index = 0
            last: dt.datetime | None = None
            try:
                for index, vol in enumerate(vols, start=1):
                    current = vol
                    created = self._clock().astimezone(dt.UTC)
                    if last is not None and created <= last:
                        created = last + _ONE_TICK
                    last = created
                    snap_name = _snapshot_name(vol.name, token, index)
                    tags = (
                        TAG_PREFIX,
                        f"{TAG_PREFIX}.v={_METADATA_VERSION}",
                        f"{TAG_PREFIX}.group={gid}",
                        f"{TAG_PREFIX}.origin={vol.name}",
                        f"{TAG_PREFIX}.at={created.strftime(_STAMP)}",
                        f"{TAG_PREFIX}.i={index}",
                        f"{TAG_PREFIX}.name={encoded_name}",
                    )
                    args = ["lvcreate", "-s", "-n", snap_name]
                    if not vol.thin:
                        args += list(_cow_args(self._cow, vol.size))
                    for tag in tags:
                        args += ["--addtag", tag]
                    args.append(vol.id)
                    try:
                        self._lvm(vol.vg, args, what=f"snapshot of {vol.id}", volume_id=vol.id)
                    except BaseException:
                        self._remove_leftover(vol.vg, snap_name)
                        raise
                    taken.append(f"{vol.vg}/{snap_name}")
                current = None
            except BaseException as exc:
                self._discard(taken)
                if not isinstance(exc, Exception):
                    raise  # KeyboardInterrupt and friends pass through unchanged
                raise group_failure(
                    exc,
                    name,
                    None if current is None else current.id,
                    index,
                    len(vols),
                    error=LvmError,
                    backend=_NAME,
                ) from exc
            log.debug("lvm: group %s %r: %s", gid, name, taken)
            return _group_record(self._group(self._lvs(), gid))

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove one snapshot (``lvremove -y``); ``SnapshotNotFound`` if unknown."""
        with self._lock:
            snap = self._snapshot(self._lvs(), snapshot_id)
            self._lvm(
                snap.lv.vg,
                ["lvremove", "-y", snap.lv.id],
                what=f"removing snapshot {snap.lv.id}",
                snapshot_id=snapshot_id,
            )

    def delete_snapshot_group(self, group_id: str) -> None:
        """Remove every snapshot of a group; ``SnapshotNotFound`` if none is left."""
        with self._lock:
            snaps = self._group(self._lvs(), group_id)
            for snap in snaps:
                self._lvm(
                    snap.lv.vg,
                    ["lvremove", "-y", snap.lv.id],
                    what=f"removing snapshot {snap.lv.id}",
                    snapshot_id=snap.record.id,
                )

    def restore_volume(self, volume_id: str, snapshot_id: str) -> None:
        """Put the snapshot's content back into its volume; return once it is there.

        The volume's file system must be unmounted (the profile says
        ``UNMOUNT``): an open volume is refused with :class:`LvInUseError`
        before anything changes. Thin: a thin copy of the snapshot replaces the
        volume (:meth:`_swap`) and the snapshot stays; a swap an interrupted
        restore left half done is finished first. Classic: the snapshot is
        merged and consumed; an invalid one is refused with
        :class:`SnapshotInvalidError`.
        """
        with self._lock:
            lvs = self._lvs()
            vg, _, name = volume_id.partition("/")
            marks = (f"{TAG_PREFIX}.new={name}", f"{TAG_PREFIX}.old={name}")
            if any(lv.vg == vg and not set(marks).isdisjoint(lv.tags) for lv in lvs):
                self._finish_swap(vg, name)  # an interrupted restore of this volume
                lvs = self._lvs()
            snap = self._snapshot(lvs, snapshot_id)
            vol = self._volume(lvs, volume_id)
            if snap.record.volume_id != vol.id:
                raise BackendError(
                    f"snapshot {snapshot_id!r} is of volume {snap.record.volume_id!r}, "
                    f"not {vol.id!r}: a snapshot can only restore its own volume",
                    hint=f"restore {vol.id!r} from one of its own snapshots "
                    f"(list_snapshots({vol.id!r}))",
                    backend=_NAME,
                    volume_id=vol.id,
                    snapshot_id=snapshot_id,
                    snapshot_volume_id=snap.record.volume_id,
                )
            if snap.lv.invalid:
                raise SnapshotInvalidError(
                    f"snapshot {snapshot_id} is invalid (its copy-on-write store overflowed): "
                    "it cannot restore anything",
                    hint="restore from another backup; give classic snapshots more room "
                    "(cow_size) or use thin volumes",
                    backend=_NAME,
                    snapshot_id=snapshot_id,
                    volume_id=vol.id,
                )
            if vol.merging:
                raise LvmError(
                    f"volume {vol.id} is already merging a snapshot",
                    hint="wait for it (wait_for_restore), then restore again",
                    backend=_NAME,
                    volume_id=vol.id,
                )
            if vol.open:
                raise LvInUseError(
                    f"volume {vol.id} is open (a mounted file system or a process uses "
                    f"{vol.path}): a merge would be deferred under a live file system",
                    hint=f"unmount {vol.path} and stop what uses it, then restore",
                    backend=_NAME,
                    volume_id=vol.id,
                )
            if not vol.thin:
                self._merge(vol, snap.lv, snapshot_id)
                return
            self._swap(vol, snap.lv, snapshot_id)

    def _swap(self, vol: LogicalVolume, snap: LogicalVolume, snapshot_id: str) -> None:
        """Thin restore: a thin snapshot of the backup's snapshot takes the volume's name.

        Not a merge: after ``lvconvert --merge`` into a thin volume, lvm2 forgets
        the origin of every other thin snapshot of it (and of a copy of the
        merged one), which then cannot be merged ("is not a mergeable logical
        volume"): a second restore, from another backup or from the safety
        snapshot, would fail. A swap needs no origin link; the backup's snapshot
        is not touched. Steps (each LV tagged so an interrupted swap is finished
        by the next restore, see :meth:`_finish_swap`): snapshot the snapshot as
        ``NEW`` (activation skip cleared), rename the volume to ``OLD``, ``NEW``
        to the volume, remove ``OLD``.
        """
        token = secrets.token_hex(4)
        new_name = _swap_name(vol.name, "new", token)
        old_name = _swap_name(vol.name, "old", token)
        new_tag, old_tag = f"{TAG_PREFIX}.new={vol.name}", f"{TAG_PREFIX}.old={vol.name}"
        try:
            self._lvm(
                vol.vg,
                ["lvcreate", "-s", "-n", new_name, "--addtag", new_tag, "-ky", snap.id],
                what=f"copying snapshot {snapshot_id} to restore {vol.id}",
                volume_id=vol.id,
                snapshot_id=snapshot_id,
            )
        except BaseException:
            self._remove_leftover(vol.vg, new_name)
            raise
        self._lvm(
            vol.vg,
            ["lvchange", "-kn", "-ay", f"{vol.vg}/{new_name}"],
            what=f"activating the copy {vol.vg}/{new_name}",
            volume_id=vol.id,
        )
        self._lvm(
            vol.vg,
            ["lvchange", "--addtag", old_tag, vol.id],
            what=f"tagging {vol.id} before replacing it",
            volume_id=vol.id,
        )
        self._lvm(
            vol.vg,
            ["lvrename", vol.vg, vol.name, old_name],
            what=f"renaming {vol.id} out of the way",
            volume_id=vol.id,
        )
        self._finish_swap(vol.vg, vol.name, interrupted=False)

    def _finish_swap(self, vg: str, name: str, *, interrupted: bool = True) -> None:
        """Complete or undo a swap of ``vg/name`` that was interrupted (or just begun).

        - ``name`` is missing: the copy (``new=``) takes the name; without a copy,
          the renamed volume (``old=``) gets its name back;
        - ``name`` exists: a copy still tagged ``new=`` but not renamed is removed
          (the swap had not begun), the volume's ``new=``/``old=`` tags go;
        - an ``old=`` volume beside a complete ``name`` is removed.
        """
        new_tag, old_tag = f"{TAG_PREFIX}.new={name}", f"{TAG_PREFIX}.old={name}"
        lvs = self._lvs([vg])
        current = next((lv for lv in lvs if lv.bare_name == name), None)
        news = [lv for lv in lvs if new_tag in lv.tags and lv.bare_name != name]
        olds = [lv for lv in lvs if old_tag in lv.tags and lv.bare_name != name]
        if current is None:
            source = news[0] if news else (olds[0] if olds else None)
            if source is None:
                return
            if interrupted:
                log.warning("lvm: finishing an interrupted restore of %s/%s", vg, name)
            self._lvm(vg, ["lvrename", vg, source.bare_name, name], what=f"renaming to {vg}/{name}")
            if source in olds:
                olds.remove(source)
            else:
                news.remove(source)
            current = source
        # What is left beside the volume: a copy whose swap never began, or the
        # replaced volume.
        stale = [t for t in (new_tag, old_tag) if t in current.tags]
        if stale:
            args = ["lvchange"]
            for tag in stale:
                args += ["--deltag", tag]
            self._lvm(vg, [*args, f"{vg}/{name}"], what=f"untagging {vg}/{name}")
        for lv in [*news, *olds]:
            self._lvm(vg, ["lvremove", "-y", lv.id], what=f"removing {lv.id} (replaced)")

    def restore_profile(self, volume_id: str) -> RestoreProfile:
        """``UNMOUNT``; classic snapshots are consumed (merged), thin ones are not
        (swapped); complete at once. Classic snapshots cannot be cloned
        (``clone_refusal``)."""
        vol = self._volume(self._lvs(), volume_id)
        return RestoreProfile(
            before=RestorePreparation.UNMOUNT,
            consumes_snapshot=not vol.thin,
            clone_refusal="" if vol.thin else CLASSIC_CLONE_REFUSAL,
        )

    def wait_for_restore(self, volume_id: str, *, timeout: float) -> None:
        """Return once no merge is pending or in progress on the volume (at once after
        :meth:`restore_volume`, which waits itself).

        A merge lvm deferred (``lvconvert --merge`` while the origin was open, an
        interrupted restore) starts on the origin's next activation: once the
        origin is closed, it is deactivated and activated to start it, and the
        call returns when the merged snapshot is gone.
        """
        vol = self._volume(self._lvs(), volume_id)
        deadline = time.monotonic() + timeout
        kicked = False
        while True:
            lvs = self._lvs([vol.vg])
            if not _merging_into(lvs, vol):
                self._activate_if_needed(lvs, vol)
                return
            origin = next((lv for lv in lvs if lv.bare_name == vol.name), vol)
            if not kicked and not origin.open:
                log.info("lvm: starting the deferred merge into %s (reactivating it)", vol.id)
                self._reactivate(vol)
                kicked = True
                continue
            if time.monotonic() >= deadline:
                raise LvmError(
                    f"the merge into {vol.id} did not finish within {timeout:g} s"
                    + (
                        " (the volume is open: the merge waits for it to close)"
                        if origin.open
                        else ""
                    ),
                    hint="unmount the volume; lvs -a shows the merge; wait longer",
                    backend=_NAME,
                    volume_id=vol.id,
                )
            time.sleep(_POLL)

    # ------------------------------------------------------------------ protocol: hosts

    def locate(self, volume_id: str) -> Location:
        """The LV's device node, ``/dev/vg/lv``."""
        return Location.device(self._volume(self._lvs(), volume_id).path)

    # ------------------------------------------------------------------ protocol: clones

    def clone_snapshot(self, snapshot_id: str, name: str) -> StorageVolume:
        """A new writable thin volume ``vg/name`` with a thin snapshot's content: a thin
        snapshot of the snapshot (``lvcreate -s``), active, without the activation-skip
        flag, tagged ``pgsnap.clone=<snapshot>`` (and not ``pgsnap``: it is a volume
        like the others, and :meth:`delete_clone` knows it by that tag). The backup's
        snapshot is only read.

        A classic snapshot is refused with
        :class:`~pgsnap.errors.UnsupportedCapability` (lvm2 cannot snapshot it;
        :meth:`restore_profile` says so before anyone tries); a name that exists
        with :class:`LvExistsError`.
        """
        if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > 120:
            raise ConfigurationError(
                f"invalid clone name {name!r}",
                hint="an lvm name: letters, digits and + _ . -, at most 120 characters",
            )
        with self._lock:
            snap = self._snapshot(self._lvs(), snapshot_id)
            if not snap.lv.thin:
                raise UnsupportedCapability(
                    f"cannot clone snapshot {snapshot_id}: {CLASSIC_CLONE_REFUSAL}",
                    hint="clones need thin volumes (lvcreate -T); recover the backup to "
                    "another host instead",
                    backend=_NAME,
                    snapshot_id=snapshot_id,
                )
            vg = snap.lv.vg
            try:
                self._lvm(
                    vg,
                    [
                        "lvcreate",
                        "-s",
                        "-n",
                        name,
                        "-kn",
                        "--addtag",
                        f"{TAG_PREFIX}.clone={snap.lv.name}",
                        snap.lv.id,
                    ],
                    what=f"cloning snapshot {snapshot_id} as {vg}/{name}",
                    snapshot_id=snapshot_id,
                )
            except LvExistsError:
                raise
            except BaseException:
                self._remove_leftover(vg, name)
                raise
            clone = next((lv for lv in self._lvs([vg]) if lv.bare_name == name), None)
            if clone is None:
                raise LvmError(
                    f"lvcreate made no {vg}/{name}",
                    hint="lvs -a shows what the volume group holds",
                    backend=_NAME,
                    snapshot_id=snapshot_id,
                )
            if not clone.active:
                self._lvm(vg, ["lvchange", "-ay", clone.id], what=f"activating {clone.id}")
            log.debug("lvm: cloned %s into %s", snapshot_id, clone.id)
            return self._volume_record(clone)

    def delete_clone(self, volume_id: str) -> None:
        """Remove a volume made by :meth:`clone_snapshot` (``lvremove``); idempotent.

        Refused (:class:`LvmError`) for a volume without the ``pgsnap.clone`` tag
        (never an origin), and (:class:`LvInUseError`) for one still open."""
        with self._lock:
            try:
                vol = self._volume(self._lvs(), volume_id)
            except VolumeNotFound:
                return
            if vol.tag("clone") is None:
                raise LvmError(
                    f"volume {vol.id} is not a clone pgsnap made: it is never deleted",
                    hint="only volumes made by clone_snapshot are deleted",
                    backend=_NAME,
                    volume_id=vol.id,
                )
            if vol.open:
                raise LvInUseError(
                    f"clone {vol.id} is open (mounted, or used by a process)",
                    hint=f"unmount {vol.path} first",
                    backend=_NAME,
                    volume_id=vol.id,
                )
            self._lvm(vol.vg, ["lvremove", "-y", vol.id], what=f"removing clone {vol.id}")

    # ------------------------------------------------------------------ vendor-only (ex_)

    def storage_problems(
        self, volume_ids: Sequence[str] | None = None
    ) -> tuple[StorageProblem, ...]:
        """Problems with pgsnap's snapshots (:class:`~pgsnap.protocols.StorageHealth`),
        errors first, from one ``lvs``.

        - ``snapshot_invalid`` (error): a classic snapshot whose copy-on-write
          store overflowed: its content is lost, a restore from it is refused
          (:class:`SnapshotInvalidError`);
        - ``snapshot_filling`` (warning): a classic snapshot fuller than
          ``warn_percent``: it becomes invalid when full;
        - ``pool_filling``: a thin pool holding pgsnap's snapshots (or, with
          ``volume_ids``, those volumes) fuller than ``warn_percent`` (an error
          when full: a full pool stops every thin volume in it);
        - ``restore_leftover`` (warning): the copy or the replaced volume an
          interrupted thin restore left behind (tagged ``pgsnap.new=`` /
          ``pgsnap.old=``; the next restore of the volume finishes the swap).

        ``volume_ids``: only those volumes' snapshots, copies and pools (None:
        every volume's).
        """
        lvs = self._lvs()
        wanted = None if volume_ids is None else frozenset(volume_ids)

        def ours(volume_id: str) -> bool:
            return wanted is None or volume_id in wanted

        problems: list[StorageProblem] = []
        for snap in self._snapshots(lvs):
            lv, vid = snap.lv, snap.record.volume_id
            if not ours(vid):
                continue
            if lv.invalid:
                problems.append(
                    StorageProblem(
                        code="snapshot_invalid",
                        severity=Severity.ERROR,
                        message=f"snapshot {lv.id} of {vid} is invalid: its copy-on-write "
                        "store overflowed, it cannot restore anything",
                        hint="the backup that names it cannot be restored: delete that backup "
                        "(pgsnap delete) and take a new one; give classic snapshots more "
                        "room (cow_size) or use thin volumes",
                        volume_id=vid,
                        snapshot_id=lv.id,
                        percent_used=lv.snap_percent,
                    )
                )
            elif lv.classic_snapshot and (lv.snap_percent or 0.0) >= self._warn:
                problems.append(
                    StorageProblem(
                        code="snapshot_filling",
                        severity=Severity.WARNING,
                        message=f"snapshot {lv.id} of {vid} is {lv.snap_percent:.1f}% full: "
                        "it becomes invalid when full",
                        hint=f"grow it now (lvextend -L +1G {lv.id}), or give classic "
                        "snapshots more room (cow_size)",
                        volume_id=vid,
                        snapshot_id=lv.id,
                        percent_used=lv.snap_percent,
                    )
                )
        pools: set[tuple[str, str]] = set()
        for lv in lvs:
            if not lv.pool:
                continue
            if lv.pgsnap or lv.tag("new") or lv.tag("old"):  # whose volume?
                origin = lv.tag("origin") or lv.tag("new") or lv.tag("old") or lv.bare_name
                if ours(f"{lv.vg}/{origin}"):
                    pools.add((lv.vg, lv.pool))
            elif wanted is not None and lv.id in wanted:  # one of the volumes itself
                pools.add((lv.vg, lv.pool))
        for lv in lvs:
            used = lv.data_percent or 0.0
            if lv.kind == "t" and (lv.vg, lv.name) in pools and used >= self._warn:
                full = used >= 100.0
                problems.append(
                    StorageProblem(
                        code="pool_filling",
                        severity=Severity.ERROR if full else Severity.WARNING,
                        message=f"thin pool {lv.id} holding the snapshots is {used:.1f}% full"
                        + (": its thin volumes and snapshots stop" if full else ""),
                        hint=f"grow the pool (lvextend -L +1G {lv.id}) or delete old "
                        "backups (pgsnap expire)",
                        percent_used=used,
                    )
                )
            for kind in ("new", "old"):
                name = lv.tag(kind)
                if name is None or lv.bare_name == name:
                    continue
                vid = f"{lv.vg}/{name}"
                if ours(vid):
                    what = "copy" if kind == "new" else "replaced volume"
                    problems.append(
                        StorageProblem(
                            code="restore_leftover",
                            severity=Severity.WARNING,
                            message=f"{lv.id} is the {what} of an interrupted restore of {vid}",
                            hint=f"restore {vid} again (pgsnap finishes the swap), or remove "
                            f"{lv.id} (lvremove) once no restore is running",
                            volume_id=vid,
                            snapshot_id=lv.id,
                        )
                    )
        problems.sort(key=lambda p: p.severity is not Severity.ERROR)
        return tuple(problems)

    def ex_check(self) -> tuple[str, ...]:
        """Problems with pgsnap's snapshots, one sentence each with what to do (empty:
        none): :meth:`storage_problems` as text."""
        return tuple(f"{p.message}; {p.hint}" for p in self.storage_problems())

    def ex_activate(self, snapshot_id: str) -> str:
        """Activate a thin snapshot (``lvchange -ay -K``: thin snapshots skip
        activation) and return its device path, to read it; a classic snapshot is
        active with its origin (:class:`LvmError` when the origin is not)."""
        with self._lock:
            snap = self._snapshot(self._lvs(), snapshot_id)
            if not snap.lv.thin:
                # A classic snapshot is active with its origin; lvchange would ask
                # whether to change the origin too.
                if snap.lv.active:
                    return snap.lv.path
                raise LvmError(
                    f"snapshot {snapshot_id} is inactive because its origin "
                    f"{snap.record.volume_id} is: activate the origin first",
                    hint=f"lvchange -ay {snap.record.volume_id}",
                    backend=_NAME,
                    snapshot_id=snapshot_id,
                )
            self._lvm(
                snap.lv.vg,
                ["lvchange", "-ay", "-K", snap.lv.id],
                what=f"activating snapshot {snap.lv.id}",
                snapshot_id=snapshot_id,
            )
            return snap.lv.path

    def ex_deactivate(self, snapshot_id: str) -> None:
        """Deactivate a thin snapshot again (``lvchange -an``)."""
        with self._lock:
            snap = self._snapshot(self._lvs(), snapshot_id)
            self._lvm(
                snap.lv.vg,
                ["lvchange", "-an", snap.lv.id],
                what=f"deactivating snapshot {snap.lv.id}",
                snapshot_id=snapshot_id,
            )

    def ex_mount_snapshot(
        self, snapshot_id: str, mount_point: str, *, read_only: bool = True
    ) -> str:
        """Activate a snapshot and mount its file system on ``mount_point`` (beside
        its origin, which may be mounted); return the device.

        XFS refuses a second file system with the same UUID, so XFS is mounted
        with ``nouuid``; read-only, without replaying the log a snapshot of a
        mounted file system carries (XFS ``norecovery``, ext4 ``noload``), so
        the snapshot is not written. The file system type is read from the
        superblock. :meth:`ex_unmount_snapshot` undoes it.
        """
        device = self.ex_activate(snapshot_id)
        mount_read_only(self._host, device, mount_point, read_only=read_only)
        return device

    def ex_unmount_snapshot(self, snapshot_id: str, mount_point: str) -> None:
        """Unmount a snapshot mounted by :meth:`ex_mount_snapshot`; deactivate it
        again if it is thin (thin snapshots skip activation)."""
        self._host.unmount(mount_point)
        snap = self._snapshot(self._lvs(), snapshot_id)
        if snap.lv.thin:
            self.ex_deactivate(snapshot_id)

    # ------------------------------------------------------------------ ExposableSnapshots

    def _check_exposed_on(self, snapshot_id: str, host: str) -> None:
        if host != self._host.name:
            raise LvmError(
                f"snapshot {snapshot_id} can be activated only on {self._host.name!r}, the "
                f"host whose lvm holds it, not on {host!r}",
                hint="copy an LVM backup on the host of its volume group ([copies] host "
                "unset, or that host's name)",
                backend=_NAME,
                snapshot_id=snapshot_id,
            )

    def expose_snapshot(self, snapshot_id: str, host: str) -> Location:
        """Activate the snapshot on its own host (``lvchange -ay -K`` for a thin
        snapshot, which skips activation; a classic one is active with its origin)
        and return its device ``/dev/vg/lv``; idempotent. The origin is not touched.
        ``host`` must be this backend's host (lvm is local to it)."""
        self._check_exposed_on(snapshot_id, host)
        return Location.device(self.ex_activate(snapshot_id))

    def conceal_snapshot(self, snapshot_id: str, host: str) -> None:
        """Deactivate a thin snapshot again (a classic one stays active with its
        origin); idempotent: a snapshot already gone is fine."""
        self._check_exposed_on(snapshot_id, host)
        with self._lock:
            try:
                snap = self._snapshot(self._lvs(), snapshot_id)
            except SnapshotNotFound:
                return
            if snap.lv.thin and snap.lv.active:
                self.ex_deactivate(snapshot_id)

    def ex_logical_volumes(self) -> tuple[LogicalVolume, ...]:
        """Every LV of the volume groups as ``lvs`` reports it (for checks and tests)."""
        return self._lvs()

    # ------------------------------------------------------------------ internals: commands

    def _lvm(
        self,
        vg: str,
        args: Sequence[str],
        *,
        what: str,
        timeout: float | None = None,
        **details: Any,
    ) -> CommandResult:
        """One lvm command on ``vg``, alone among this backend's commands on that VG."""
        if args and args[0] not in _READ_ONLY:
            self._forget_observed()  # what was listed may have changed
        lock = self._vg_locks.get(vg) or threading.Lock()
        with lock:
            log.debug("lvm: %s", " ".join(args))
            result = self._run(args, timeout=timeout)
        if not result.ok:
            raise classify_failure(result, what=what, **details)
        return result

    def _lvs(self, vgs: Iterable[str] | None = None) -> tuple[LogicalVolume, ...]:
        groups = tuple(vgs) if vgs is not None else self._vgs
        out: list[LogicalVolume] = []
        listings = self._observed()  # by volume group
        for vg in groups:
            if listings is not None and vg in listings:
                out.extend(listings[vg])
                continue
            result = self._lvm(
                vg,
                [
                    "lvs",
                    "-a",
                    "--reportformat",
                    "json",
                    "--units",
                    "b",
                    "--nosuffix",
                    "-o",
                    ",".join(LV_FIELDS),
                    vg,
                ],
                what=f"listing the logical volumes of {vg}",
                volume_group=vg,
            )
            listed = parse_lvs_json(result.text)
            if listings is not None:
                listings[vg] = tuple(listed)
            out.extend(listed)
        return tuple(out)

    def _remove_leftover(self, vg: str, lv_name: str) -> None:
        """Remove ``vg/lv_name`` if a failed ``lvcreate`` left it; never raises."""
        try:
            names = {lv.bare_name for lv in self._lvs([vg])}
            if lv_name in names:
                log.warning("lvm: removing %s/%s left by a failed lvcreate", vg, lv_name)
                self._lvm(vg, ["lvremove", "-f", f"{vg}/{lv_name}"], what="cleanup")
        except Exception:
            log.warning("lvm: could not remove %s/%s after a failure", vg, lv_name, exc_info=True)

    def _discard(self, taken: Sequence[str]) -> None:
        for lv_id in reversed(taken):
            vg = lv_id.split("/")[0]
            try:
                self._lvm(vg, ["lvremove", "-y", lv_id], what=f"removing {lv_id}")
            except Exception:
                log.warning("lvm: could not remove %s of a failed group", lv_id, exc_info=True)

    def _merge(self, vol: LogicalVolume, merged: LogicalVolume, snapshot_id: str) -> None:
        """``lvconvert --merge``; deactivate and activate the origin when lvm defers it;
        return once the merge has finished."""
        result = self._lvm(
            vol.vg,
            ["lvconvert", "--merge", merged.id],
            what=f"merging {merged.id} into {vol.id}",
            timeout=self._merge_timeout,
            volume_id=vol.id,
            snapshot_id=snapshot_id,
        )
        said = (result.text + "\n" + result.error_text).lower()
        if "delaying merge" in said or "will occur on next activation" in said:
            log.info(
                "lvm: merge of %s into %s deferred: reactivating the origin", merged.id, vol.id
            )
            self._reactivate(vol)
        deadline = time.monotonic() + self._merge_timeout
        while True:
            lvs = self._lvs([vol.vg])
            if not _merging_into(lvs, vol) and merged.name not in {lv.bare_name for lv in lvs}:
                break
            if time.monotonic() >= deadline:
                raise LvmError(
                    f"the merge of {merged.id} into {vol.id} did not finish within "
                    f"{self._merge_timeout:g} s",
                    hint="lvs -a shows its progress; wait_for_restore waits for it",
                    backend=_NAME,
                    volume_id=vol.id,
                    snapshot_id=snapshot_id,
                )
            time.sleep(_POLL)
        self._activate_if_needed(lvs, vol)
        log.debug("lvm: merged %s into %s", merged.id, vol.id)

    def _reactivate(self, vol: LogicalVolume) -> None:
        """Deactivate and activate the origin: lvm starts a deferred merge then."""
        self._lvm(vol.vg, ["lvchange", "-an", vol.id], what=f"deactivating {vol.id}")
        self._lvm(vol.vg, ["lvchange", "-ay", vol.id], what=f"activating {vol.id}")

    def _activate_if_needed(self, lvs: Sequence[LogicalVolume], vol: LogicalVolume) -> None:
        origin = next((lv for lv in lvs if lv.bare_name == vol.name), None)
        if origin is not None and not origin.active:
            self._lvm(vol.vg, ["lvchange", "-ay", vol.id], what=f"activating {vol.id}")

    # ------------------------------------------------------------------ internals: lookups

    def _volume(self, lvs: Sequence[LogicalVolume], volume_id: object) -> LogicalVolume:
        parsed = _parse_id(volume_id)
        if parsed is not None and parsed[0] in self._vgs:
            for lv in _volumes(lvs):
                if (lv.vg, lv.name) == parsed:
                    return lv
        raise VolumeNotFound(
            f"no volume {volume_id!r} in volume group(s) {', '.join(self._vgs)}",
            volume_id=str(volume_id),
            backend=_NAME,
            hint="volume ids are 'vg/lv' (list_volumes() shows them)",
        )

    def _snapshots(self, lvs: Sequence[LogicalVolume]) -> list[_Snap]:
        snaps: list[_Snap] = []
        for lv in lvs:
            if not lv.pgsnap or lv.tag("group") is None or lv.hidden or lv.merging:
                continue  # not a snapshot of pgsnap's, or being merged (consumed)
            snap = _snap_record(lv)
            if snap is not None:
                snaps.append(snap)
        snaps.sort(key=lambda s: (s.record.created_at, s.record.group_id or "", s.index))
        return snaps

    def _snapshot(self, lvs: Sequence[LogicalVolume], snapshot_id: object) -> _Snap:
        parsed = _parse_id(snapshot_id)
        if parsed is not None:
            for snap in self._snapshots(lvs):
                if (snap.lv.vg, snap.lv.name) == parsed:
                    return snap
        raise SnapshotNotFound(
            f"no pgsnap snapshot {snapshot_id!r} in volume group(s) {', '.join(self._vgs)}",
            snapshot_id=str(snapshot_id),
            backend=_NAME,
            hint="list_snapshots() shows them (lvs @pgsnap on the host)",
        )

    def _group(self, lvs: Sequence[LogicalVolume], group_id: object) -> list[_Snap]:
        if isinstance(group_id, str) and _GROUP_RE.match(group_id):
            snaps = [s for s in self._snapshots(lvs) if s.record.group_id == group_id]
            if snaps:
                return sorted(snaps, key=lambda s: s.index)
        raise SnapshotNotFound(
            f"no snapshot group {group_id!r} in volume group(s) {', '.join(self._vgs)}",
            snapshot_id=str(group_id),
            backend=_NAME,
            hint="it was deleted, or its snapshots were merged (classic restores consume them)",
        )

    def _volume_record(self, lv: LogicalVolume) -> StorageVolume:
        extra = {
            "vg": lv.vg,
            "lv": lv.name,
            "attr": lv.attr,
            "kind": "thin" if lv.thin else "linear",
        }
        if lv.pool:
            extra["pool"] = lv.pool
        return StorageVolume(id=lv.id, name=lv.name, size_bytes=lv.size, path=lv.path, extra=extra)


def _volumes(lvs: Iterable[LogicalVolume]) -> list[LogicalVolume]:
    """The LVs that are volumes: not hidden, not pools, not snapshots, not pgsnap's."""
    return [lv for lv in lvs if not lv.hidden and not lv.pgsnap and lv.kind in ("-", "o", "O", "V")]


def _merging_into(lvs: Iterable[LogicalVolume], vol: LogicalVolume) -> bool:
    for lv in lvs:
        if lv.bare_name == vol.name and lv.kind == "O":
            return True
        if lv.kind == "S" and lv.origin == vol.name:
            return True
    return False


def _swap_name(origin: str, kind: str, token: str) -> str:
    suffix = f".pgsnap{kind}.{token}"
    return origin[: 120 - len(suffix)] + suffix


def _snapshot_name(origin: str, token: str, index: int, *, copy: bool = False) -> str:
    suffix = f".pgsnap{'copy' if copy else ''}.{token}.{index}"
    return origin[: 120 - len(suffix)] + suffix


def _snap_record(lv: LogicalVolume) -> _Snap | None:
    gid = lv.tag("group") or ""
    origin = lv.tag("origin")
    at = lv.tag("at")
    if not _GROUP_RE.match(gid) or not origin or not at:
        log.warning("lvm: %s has pgsnap tags but not a snapshot's: ignored", lv.id)
        return None
    try:
        created = dt.datetime.strptime(at, _STAMP).replace(tzinfo=dt.UTC)
    except ValueError:
        log.warning("lvm: %s has a malformed pgsnap.at tag %r: ignored", lv.id, at)
        return None
    index_text = lv.tag("i") or "0"
    index = int(index_text) if index_text.isdigit() else 0
    group_name = decode_tag_value(lv.tag("name") or "")
    extra: dict[str, str] = {
        "attr": lv.attr,
        "kind": "thin" if lv.thin else "classic",
        "state": "invalid" if lv.invalid else "valid",
        "path": lv.path,
    }
    if lv.classic_snapshot and lv.snap_percent is not None:
        extra["used_percent"] = f"{lv.snap_percent:g}"
    if lv.skip_activation:
        extra["activation_skip"] = "yes"
    record = Snapshot(
        id=lv.id,
        volume_id=f"{lv.vg}/{origin}",
        name=group_name,
        created_at=created,
        group_id=gid,
        extra=extra,
    )
    return _Snap(lv, record, group_name, index)


_READ_ONLY: Final = frozenset({"lvs", "vgs", "pvs"})
"""lvm commands that change nothing: they keep an observation's listing."""


def _group_record(snaps: Sequence[_Snap]) -> SnapshotGroup:
    first = snaps[0]
    return SnapshotGroup(
        id=first.record.group_id or "",
        name=first.group_name,
        created_at=min(s.record.created_at for s in snaps),
        snapshots=tuple(s.record for s in snaps),
    )
