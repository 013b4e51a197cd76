"""Clone plans (pure): a writable copy of a backup at a point in time, started as a
separate PostgreSQL instance beside the cluster, and the plan that destroys it.

The backup and the WAL are chosen exactly as for a recovery
(:func:`~pgsnap.planner.recovery.resolve_recovery`), with the WAL volume counted as
lost: the clone reads its WAL from the archive only, never from the cluster's
``pg_wal``. Every step works on new volumes, below the clone's own directory, and
on the clone's own server; no step writes to a volume of the layout, to the live
data directory or to the archive (each operation checks it again at run time, see
:mod:`pgsnap.operations.clone`).
"""

from __future__ import annotations

import hashlib
import posixpath
from typing import Final, TypedDict

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import ConfigurationError, PlanningError
from pgsnap.model import (
    LSN,
    BackupRecord,
    CloneRecord,
    CloneVolume,
    LocationKind,
    RecoveryAction,
    RecoveryTarget,
    TargetKind,
    VolumeRole,
    to_dict,
)
from pgsnap.operations.base import Ref
from pgsnap.operations.catalog import VerifyWal
from pgsnap.operations.clone import (
    CLONE_NAME_RE,
    AttachClone,
    ClearCloneRecovery,
    CloneSnapshot,
    ConfigureClone,
    DeleteClone,
    DetachClone,
    ForgetClone,
    MakeCloneDirectory,
    MarkCloneReady,
    MaskClone,
    MountClone,
    PrepareClone,
    RecordClone,
    RemoveCloneDirectory,
    StartClone,
    StopClone,
    UnmountClone,
    WaitClone,
    WriteCloneLabel,
)
from pgsnap.plan import Plan, Step
from pgsnap.planner.facts import RecoveryFacts
from pgsnap.planner.recovery import RecoveryRequest, Resolved, resolve_recovery
from pgsnap.protocols import Capability

__all__ = [
    "CloneRequest",
    "clone_data_directory",
    "clone_volumes",
    "default_clone_directory",
    "plan_clone",
    "plan_clone_destroy",
    "planned_replay_lsn",
]

_ACTIONS: Final = (RecoveryAction.PROMOTE, RecoveryAction.PAUSE)


class _Server(TypedDict):
    clone: str
    at: str
    data_directory: str
    port: int
    on: str


def _check_name(_inst: object, _attr: object, value: str) -> None:
    if not isinstance(value, str) or not CLONE_NAME_RE.match(value):
        raise ConfigurationError(
            f"invalid clone name {value!r}",
            hint="1 to 20 lower-case letters, digits and dashes, starting with a letter or "
            "digit (e.g. 'reporting' or 'dev-1')",
        )


def _check_action(_inst: object, _attr: object, value: RecoveryAction) -> None:
    if value not in _ACTIONS:
        raise ConfigurationError(
            f"a clone cannot {value.value} at its target",
            hint="use promote (a writable copy) or pause (read-only, paused at the target)",
        )


def _check_port(_inst: object, _attr: object, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1024 <= value <= 65535:
        raise ConfigurationError(
            f"invalid clone port {value!r}", hint="give a port from 1024 to 65535"
        )


def _check_at(_inst: object, _attr: object, value: str | None) -> None:
    if value is None:
        return
    if (
        not isinstance(value, str)
        or not value.startswith("/")
        or posixpath.normpath(value) != value.rstrip("/")
        or value == "/"
    ):
        raise ConfigurationError(
            f"invalid clone directory {value!r}",
            hint="give an absolute, normal path that does not exist yet",
        )


@frozen
class CloneRequest:
    """What to clone, where.

    - ``name``: the clone's name (it names its volumes and its catalog record).
    - ``target``, ``timeline``, ``backup_id``: as for a recovery; the backup is chosen
      the same way.
    - ``action``: ``promote`` (a writable copy, the default) or ``pause`` (read-only,
      paused at the target, for reporting).
    - ``host``: the host it runs on, by the storage's name for it (default ``""``:
      the database host); another host needs storage that maps volumes to hosts.
    - ``at``: the clone's directory on the host (default: beside the cluster's data
      volume, ``pgsnap-clone-<name>``); it must not exist.
    - ``port``: the clone's port; ``listen_addresses``: ``""`` (the Unix socket in
      ``at`` only, the default) or addresses to listen on.
    - ``mask_sql`` (in ``mask_dbname``) and ``mask_script``: the masking hook run in
      the promoted clone before it is handed over.
    """

    name: str = attrs.field(validator=_check_name)
    port: int = attrs.field(validator=_check_port)
    target: RecoveryTarget = attrs.field(factory=RecoveryTarget.latest)
    timeline: str = "latest"
    action: RecoveryAction = attrs.field(default=RecoveryAction.PROMOTE, validator=_check_action)
    backup_id: str | None = None
    at: str | None = attrs.field(default=None, validator=_check_at)
    host: str = ""
    listen_addresses: str = ""
    mask_sql: str = ""
    mask_dbname: str = "postgres"
    mask_script: str = ""
    recovery_timeout: float = 600.0
    server_timeout: float = 120.0
    purpose: str = "clone"

    def recovery_request(self) -> RecoveryRequest:
        """The recovery request that chooses the backup and checks the WAL."""
        return RecoveryRequest(
            target=self.target,
            timeline=self.timeline,
            action=self.action,
            lost=frozenset({VolumeRole.DATA, VolumeRole.WAL}),
            backup_id=self.backup_id,
            safety_snapshot=False,
            recovery_timeout=self.recovery_timeout,
            server_timeout=self.server_timeout,
        )


def _check_apart(facts: RecoveryFacts, path: str, what: str) -> None:
    """PlanningError unless ``path`` is neither at, inside nor around a volume of the
    layout or the archive (a clone never writes there)."""
    norm = posixpath.normpath(path)
    places = [(v.mount_point, f"volume {v.id} ({v.role.value})") for v in facts.layout.volumes]
    if facts.archive_location.startswith("/"):
        places.append((facts.archive_location, "the WAL archive"))
    for place, name in places:
        point = posixpath.normpath(place)
        if (
            norm == point
            or norm.startswith(point.rstrip("/") + "/")
            or point.startswith(norm + "/")
        ):
            raise PlanningError(
                f"{what} would be at {path}, at or around {name} ({point}): a clone never "
                "writes to the cluster's volumes or its archive",
                hint="give the clone a directory apart from them (at=, --at)",
                path=path,
            )


def default_clone_directory(facts: RecoveryFacts, name: str) -> str:
    """Beside the cluster's data volume: ``<its parent>/pgsnap-clone-<name>`` (on the
    same file system, where a btrfs clone must be)."""
    return posixpath.join(
        posixpath.dirname(facts.layout.data.mount_point.rstrip("/")), f"pgsnap-clone-{name}"
    )


def clone_data_directory(facts: RecoveryFacts, at: str) -> str:
    """The clone's data directory: where the cluster's is below its data volume's mount
    point (``/pg/data`` mounted, ``/pg/data/pgdata`` the data directory: the clone's
    is ``<at>/data/pgdata``), below the clone's copy of the data volume (``<at>/data``)."""
    root = posixpath.join(at, "data")
    mount = posixpath.normpath(facts.layout.data.mount_point)
    data = posixpath.normpath(facts.data_directory) if facts.data_directory else mount
    if data.startswith(mount.rstrip("/") + "/"):
        return posixpath.join(root, posixpath.relpath(data, mount))
    return root


def clone_volumes(
    facts: RecoveryFacts, backup_snapshots: dict[str, str], at: str
) -> tuple[CloneVolume, ...]:
    """The clone's volumes: a copy of the data volume at ``at/data``, and of each
    tablespace volume at ``at/tblspc-<digest of its id>``."""
    out = []
    for vol in facts.layout.volumes:
        if vol.role not in (VolumeRole.DATA, VolumeRole.TABLESPACE):
            continue
        if vol.role is VolumeRole.DATA:
            path = posixpath.join(at, "data")
        else:
            path = posixpath.join(at, "tblspc-" + hashlib.sha256(vol.id.encode()).hexdigest()[:8])
        kind = LocationKind.DIRECTORY
        for vf in facts.volume_facts:
            if vf.volume_id == vol.id:
                kind = vf.location.kind
        out.append(CloneVolume(vol.id, vol.role, backup_snapshots.get(vol.id, ""), path, kind=kind))
    return tuple(out)


def planned_replay_lsn(facts: RecoveryFacts, target: RecoveryTarget) -> LSN | None:
    """The LSN a recovery to ``target`` replays to at least, when the facts tell: an LSN
    target (inclusive), a restore point, and the end of the archived WAL for
    ``latest`` (the end of its last valid record, read from the WAL). None for the
    rest (a time or an xid target stops before the record it names, when not
    inclusive; the server then says whether it reached its target)."""
    ev = facts.events
    if target.kind is TargetKind.LSN and target.inclusive:
        assert isinstance(target.value, LSN)
        return target.value
    if ev is None:
        return None
    if target.kind is TargetKind.NAME:
        assert isinstance(target.value, str)
        return ev.restore_point(target.value)
    if target.kind is TargetKind.LATEST and ev.complete:
        return ev.end_of_wal
    return None


def _check_other_host(facts: RecoveryFacts, host: str, volumes: tuple[CloneVolume, ...]) -> None:
    """PlanningError unless a clone can run on ``host``, another host than the database
    host: pgsnap reaches it, and every clone volume is a block volume the storage
    attaches to it."""
    if host not in facts.clone_hosts:
        raise PlanningError(
            f"pgsnap reaches no host {host!r} to run a clone on",
            hint=f"add a [clone_hosts.{host}] section (ssh = ...) to the configuration",
        )
    local = [v.origin for v in volumes if v.kind is LocationKind.DIRECTORY]
    if Capability.MAPPING not in facts.capabilities or local:
        raise PlanningError(
            f"a clone on {host} needs storage that attaches volumes to hosts, and "
            + (
                f"the clone's copies of {', '.join(local)} would be directories of the "
                "database host's storage"
                if local
                else "this backend does not (no 'mapping' capability)"
            ),
            hint="make the clone on the database host (leave host unset), or recover the "
            "backup on that host",
        )


@frozen
class _Made:
    """What a clone plan and a standby plan share: the backup, where the clone lives,
    its volumes, and the steps that make them (verify the WAL, record, directory,
    copies of the snapshots, attach and mount, prepare, label)."""

    backup: BackupRecord
    at: str
    on: str
    data_directory: str
    volumes: tuple[CloneVolume, ...]
    server: _Server
    steps: tuple[Step, ...]


def _made(
    facts: RecoveryFacts,
    resolved: Resolved,
    *,
    name: str,
    port: int,
    at: str | None,
    host: str,
    target: RecoveryTarget,
    action: RecoveryAction,
    purpose: str,
    slot: str = "",
    verify_end: LSN | None = None,
) -> _Made:
    """The checks every clone passes and the steps that make its volumes and data
    directory (see :class:`_Made`); PlanningError when it cannot be made."""
    if Capability.CLONES not in facts.capabilities:
        raise PlanningError(
            "the storage backend cannot clone snapshots (no 'clones' capability)",
            hint="clones need writable copies of snapshots: btrfs, LVM thin, PowerFlex, "
            "or the mock with clones; restore to another host with a recovery instead",
        )
    if facts.server is not None and facts.server.settings.get("port") == str(port):
        raise PlanningError(
            f"port {port} is the cluster's own port",
            hint=f"give the {purpose} another port",
        )
    backup = resolved.backup
    if resolved.copy is not None:
        raise PlanningError(
            f"backup {backup.id}'s snapshots are gone (only its copy {resolved.copy.copy_id} "
            f"is left): a {purpose} is made from snapshots",
            hint="choose a backup whose snapshots are there (--backup), or restore the copy "
            "with pgsnap recover --from-copy",
            backup_id=backup.id,
        )
    assert backup.stop_lsn is not None and backup.labelfile is not None
    at = at or default_clone_directory(facts, name)
    volumes = clone_volumes(facts, dict(backup.snapshots), at)
    data_dir = clone_data_directory(facts, at)
    block = [v.origin for v in volumes if v.kind is not LocationKind.DIRECTORY]
    if block and not facts.host:
        raise PlanningError(
            f"volume(s) {', '.join(block)} are block devices, and the database host's name "
            "is unknown: the clone volumes cannot be attached to it",
            hint="name the host in the configuration ([host] name)",
        )
    for vf in facts.volume_facts:
        if vf.profile.clone_refusal and vf.volume_id in {v.origin for v in volumes}:
            raise PlanningError(
                f"volume {vf.volume_id}'s snapshots cannot be cloned: {vf.profile.clone_refusal}",
                hint="recover the backup to another host instead (pgsnap recover there), or "
                "keep the cluster on volumes whose snapshots the storage can clone",
                volume_id=vf.volume_id,
            )
    missing = [v.origin for v in volumes if not v.snapshot_id]
    if missing:
        raise PlanningError(
            f"backup {backup.id} has no snapshot of volume(s) {', '.join(missing)}",
            hint="choose another backup (--backup)",
            backup_id=backup.id,
        )
    for path, what in [
        (at, f"the {purpose}'s directory"),
        *((v.path, f"the {purpose}'s copy of {v.origin}") for v in volumes),
    ]:
        _check_apart(facts, path, what)
    on = host or facts.host
    if host and host != facts.host:
        _check_other_host(facts, host, volumes)
    server = _Server(clone=name, at=at, data_directory=data_dir, port=port, on=on)
    steps: list[Step] = [
        Step.of(
            "verify-wal",
            VerifyWal(
                start_timeline=backup.start_timeline,
                start_lsn=backup.start_lsn,
                timeline=resolved.tli,
                segment_size=backup.wal_segment_size,
                system_identifier=backup.system_identifier,
                major=backup.server_version // 10000,
                end_lsn=verify_end,
            ),
            description=f"verify the archived WAL segments the {purpose} may fetch",
            reason="a truncated or foreign segment found now stops the plan before anything "
            "is made",
        ),
        Step.of(
            "record-clone",
            RecordClone(
                clone=name,
                at=at,
                backup_id=backup.id,
                recovery_target=target,
                host=on,
                data_directory=data_dir,
                port=port,
                action=action,
                volumes=volumes,
                purpose=purpose,
                on=on,
                slot=slot,
            ),
            description=f"record {purpose} {name} in the catalog (state creating)",
            reason=f"a {purpose} left half-made by a failure or an interruption is listed, and "
            f"destroyed by pgsnap {'standby' if purpose == 'standby' else 'clone'} destroy",
            undo=ForgetClone(clone=name),
        ),
        Step.of(
            "make-clone-directory",
            MakeCloneDirectory(clone=name, at=at, owner_of=facts.layout.data.mount_point, on=on),
            description=f"create the {purpose}'s directory {at}",
            reason=f"the {purpose}'s volumes, socket and server log live there, apart from "
            "the cluster's",
            undo=RemoveCloneDirectory(clone=name, at=at, on=on),
        ),
    ]
    for vol in volumes:
        steps.append(
            Step.of(
                f"clone-{vol.step_key}",
                CloneSnapshot(clone=name, at=at, backup_id=backup.id, volume=vol, on=on),
                description=f"make a writable copy of snapshot {vol.snapshot_id} of volume "
                f"{vol.origin} ({vol.role.value}) at {vol.path}",
                reason="a new volume: the backup's snapshot and the cluster's volume are only read",
                undo=DeleteClone(clone=name, at=at, volume=vol, on=on),
            )
        )
        if vol.kind is not LocationKind.DIRECTORY:
            steps += [
                Step.of(
                    f"attach-clone-{vol.step_key}",
                    AttachClone(clone=name, at=at, volume=vol, host=on, on=on),
                    description=f"attach the {purpose}'s copy of {vol.origin} to {on}",
                    reason=f"its file system is mounted on {on}",
                    undo=DetachClone(clone=name, at=at, volume=vol, host=on, on=on),
                ),
                Step.of(
                    f"mount-clone-{vol.step_key}",
                    MountClone(
                        clone=name,
                        at=at,
                        volume=vol,
                        device=Ref(f"attach-clone-{vol.step_key}", "device"),
                        on=on,
                    ),
                    description=f"mount the {purpose}'s copy of {vol.origin} read-write at "
                    f"{vol.path}",
                    reason=f"the {purpose}'s server finds its data there",
                    undo=UnmountClone(clone=name, at=at, volume=vol, on=on),
                ),
            ]
    steps += [
        Step.of(
            "prepare-clone",
            PrepareClone(**server, volumes=volumes, spcmapfile=backup.spcmapfile or ""),
            description=f"make the cloned data directory the {purpose}'s own (a new empty "
            "pg_wal, tablespace links to its copies; postmaster.pid, standby.signal and "
            "temporary state removed)",
            reason="the snapshot's pg_wal and tablespace links point at the cluster's volumes: "
            f"the {purpose} must never write there",
        ),
        Step.of(
            "write-clone-label",
            WriteCloneLabel(
                **server,
                backup_id=backup.id,
                label_sha256=hashlib.sha256(backup.labelfile.encode()).hexdigest(),
                volumes=volumes,
            ),
            description=f"write backup {backup.id}'s backup_label"
            + (
                " and its tablespace_map (moved to the clone's copies)" if backup.spcmapfile else ""
            ),
            reason="replay must start at the backup's checkpoint",
        ),
    ]
    return _Made(backup, at, on, data_dir, volumes, server, tuple(steps))


def plan_clone(facts: RecoveryFacts, request: CloneRequest) -> Plan:
    """The clone plan for ``request``, or a PlanningError saying why not."""
    resolved = resolve_recovery(facts, request.recovery_request())
    backup = resolved.backup
    assert backup.stop_lsn is not None
    planned = planned_replay_lsn(facts, request.target)
    min_replay = backup.stop_lsn if planned is None else max(planned, backup.stop_lsn)
    # The segments the clone may fetch end where its replay stops, when that is known
    # (an immediate target at the consistency point): else up to the end of the archive.
    verify_end: LSN | None = None
    if request.target.kind is TargetKind.IMMEDIATE:
        verify_end = backup.stop_lsn
    elif request.target.kind is TargetKind.LSN:
        assert isinstance(request.target.value, LSN)
        verify_end = max(request.target.value, backup.stop_lsn)
    elif request.target.kind is TargetKind.NAME and planned is not None:
        verify_end = min_replay
    made = _made(
        facts,
        resolved,
        name=request.name,
        port=request.port,
        at=request.at,
        host=request.host,
        target=request.target,
        action=request.action,
        purpose=request.purpose,
        verify_end=verify_end,
    )
    at, on, data_dir, volumes, server = (
        made.at,
        made.on,
        made.data_directory,
        made.volumes,
        made.server,
    )
    name = request.name
    steps: list[Step] = list(made.steps)
    steps += [
        Step.of(
            "configure-clone",
            ConfigureClone(
                **server,
                recovery_target=request.target,
                timeline=resolved.timeline_setting,
                action=request.action,
                listen_addresses=request.listen_addresses,
            ),
            description=f"write the clone's settings (port {request.port}, socket in {at}, "
            f"cluster_name pgsnap-clone-{name}, archive_mode off) and its recovery settings "
            f"(target {request.target}, {request.action.value})",
            reason="archiving off: nothing of the clone's timeline reaches the cluster's "
            "archive, which the clone only reads",
        ),
        Step.of(
            "start-clone",
            StartClone(**server, timeout=request.server_timeout),
            description="start the clone's server: it replays WAL from the archive",
            reason="this is the clone's recovery; the cluster is not touched",
            undo=StopClone(**server),
        ),
        Step.of(
            "wait-clone",
            WaitClone(
                **server,
                action=request.action,
                target_kind=request.target.kind,
                min_replay_lsn=min_replay,
                timeout=request.recovery_timeout,
            ),
            description=f"wait for the clone to reach {request.target} and "
            f"{request.action.value}, having replayed to {min_replay} at least",
            reason="the clone is handed over only when its server says where it stopped, "
            "and that it replayed the WAL the plan counted on"
            + ("" if planned is None else f" (to {planned})"),
        ),
    ]
    if request.action is RecoveryAction.PROMOTE:
        steps.append(
            Step.of(
                "clear-clone-recovery",
                ClearCloneRecovery(**server),
                description="remove the clone's recovery settings",
                reason="a restart of the clone must not recover again",
            )
        )
        if request.mask_sql or request.mask_script:
            steps.append(
                Step.of(
                    "mask-clone",
                    MaskClone(
                        **server,
                        sql=request.mask_sql,
                        dbname=request.mask_dbname,
                        script=request.mask_script,
                    ),
                    description="run the masking hook in the clone"
                    + (f" (SQL in {request.mask_dbname})" if request.mask_sql else "")
                    + (f" (script {request.mask_script})" if request.mask_script else ""),
                    reason="dev/test copies of production data are masked before hand-over",
                )
            )
    steps.append(
        Step.of(
            "mark-clone-ready",
            MarkCloneReady(clone=name),
            description=f"mark clone {name} ready in the catalog",
            reason="listed as ready only once recovered and handed over",
        )
    )
    summary = {
        "clone": name,
        "target": str(request.target),
        "backup": f"{backup.id} (label {backup.label!r}, timeline {backup.start_timeline})",
        "where": f"{data_dir} on {on or 'the database host'}, port {request.port}, socket in {at}",
        "action at target": request.action.value,
        "volumes": ", ".join(f"{v.origin} ({v.role.value}) -> {v.path}" for v in volumes),
    }
    kept = (
        "the cluster, its volumes and its pg_wal: not touched",
        "the WAL archive: only read (archiving is off in the clone)",
        f"backup {backup.id}'s snapshots: only read",
    )
    digest = hashlib.sha256(
        repr(
            (
                backup.id,
                backup.labelfile,
                to_dict(attrs.evolve(request, backup_id=None)),
                sorted(backup.snapshots.items()),
            )
        ).encode()
    ).hexdigest()
    return Plan(
        kind="clone",
        steps=tuple(steps),
        fingerprint=digest,
        request=to_dict(request),
        summary=summary,
        kept=kept,
        lost=(),
        warnings=resolved.warnings,
    )


def plan_clone_destroy(record: CloneRecord) -> Plan:
    """The plan that destroys clone ``record`` (stop, delete its volumes, remove its
    directory, forget it), whatever state it was left in; every step is a no-op for
    what is already gone."""
    name, at, on = record.name, record.at, record.host
    server = _Server(
        clone=name, at=at, data_directory=record.data_directory, port=record.port, on=on
    )
    steps = [
        Step.of(
            "stop-clone",
            StopClone(**server),
            description=f"stop clone {name}'s server",
            reason="its volumes cannot be deleted under a running server (no-op if it is down)",
        )
    ]
    for vol in record.volumes:
        if vol.kind is not LocationKind.DIRECTORY:
            steps += [
                Step.of(
                    f"unmount-{vol.step_key}",
                    UnmountClone(clone=name, at=at, volume=vol, on=on),
                    description=f"unmount the clone's copy of {vol.origin} ({vol.path})",
                    reason="a mounted volume cannot be detached",
                ),
                Step.of(
                    f"detach-{vol.step_key}",
                    DetachClone(clone=name, at=at, volume=vol, host=record.host, on=on),
                    description=f"detach the clone's copy of {vol.origin} from {record.host}",
                    reason="an attached volume cannot be deleted",
                ),
            ]
        steps.append(
            Step.of(
                f"delete-{vol.step_key}",
                DeleteClone(clone=name, at=at, volume=vol, on=on),
                description=f"delete the clone's copy of {vol.origin} ({vol.path})",
                reason="a destroyed clone leaves nothing on the storage",
            )
        )
    steps += [
        Step.of(
            "remove-clone-directory",
            RemoveCloneDirectory(clone=name, at=at, on=on),
            description=f"remove the clone's directory {at}",
            reason="its socket, server log and empty mount points go with it",
        ),
        Step.of(
            "forget-clone",
            ForgetClone(clone=name),
            description=f"remove clone {name}'s record from the catalog",
            reason="once nothing of it is left",
        ),
    ]
    return Plan(
        kind="clone-destroy",
        steps=tuple(steps),
        fingerprint=hashlib.sha256(repr(to_dict(record)).encode()).hexdigest(),
        request={"clone": name},
        summary={"clone": name, "backup": record.backup_id, "where": record.data_directory},
        kept=("the cluster, the archive and the backup's snapshots: not touched",),
        lost=(f"clone {name} and everything written to it",),
        warnings=(),
    )
