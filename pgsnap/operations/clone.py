"""Operations of clone plans: a separate PostgreSQL instance on new writable copies of
a backup's snapshots, recovered to a target beside the cluster it came from.

A clone never writes to production. Each operation checks that before the run
changes anything (:meth:`~pgsnap.operations.Operation.precheck`), whatever the plan
says: every path it writes is apart from every volume of the cluster's layout and
from the WAL archive; every storage volume it makes or deletes is a new one, never a
volume of the layout; the server it starts, stops or configures runs on the clone's
data directory, never the cluster's. The WAL archive is only read (the clone's
``restore_command``); archiving is off in the clone.

The steps of a clone are found again by their names: each volume's storage name
and path are fixed by the plan, so an interrupted run, and ``pgsnap clone destroy``,
find what was made even when no journal says so.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import posixpath
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import CatalogError, ExecutionError
from pgsnap.host.readonly import mount_read_only
from pgsnap.model import (
    LSN,
    CloneRecord,
    CloneState,
    CloneVolume,
    LocationKind,
    RecoveryAction,
    RecoverySettings,
    RecoveryTarget,
    StorageVolume,
    TargetKind,
    VolumeRole,
)
from pgsnap.operations.base import (
    Operation,
    OperationContext,
    Outputs,
    PlanView,
    Ref,
    Resume,
    Target,
)
from pgsnap.operations.host import check_apart_from_layout
from pgsnap.protocols import (
    Capability,
    CloneServer,
    DatabaseAdapter,
    DeletableClones,
    ServerInstances,
)

if TYPE_CHECKING:
    from pgsnap.host import Host

__all__ = [
    "CLONE_NAME_RE",
    "AttachClone",
    "ClearCloneRecovery",
    "CloneSnapshot",
    "ConfigureClone",
    "DeleteClone",
    "DetachClone",
    "ForgetClone",
    "MakeCloneDirectory",
    "MarkCloneReady",
    "MaskClone",
    "MountClone",
    "PrepareClone",
    "RecordClone",
    "RemoveCloneDirectory",
    "StartClone",
    "StopClone",
    "UnmountClone",
    "WaitClone",
    "WriteCloneLabel",
    "clone_parameters",
    "clone_server",
    "rewrite_tablespace_map",
]

log = logging.getLogger(__name__)

CLONE_NAME_RE: Final = re.compile(r"^[a-z0-9][a-z0-9-]{0,19}$")
"""A clone's name: 1 to 20 lower-case letters, digits and dashes (it names storage
volumes, which some arrays limit to 31 characters)."""

_REPLAN: Final = "the plan was edited: make a new plan"


# --------------------------------------------------------------------------- helpers


def clone_parameters(
    *, name: str, port: int, socket_directory: str, listen_addresses: str
) -> dict[str, str]:
    """The settings a clone's server runs with, whatever the cluster's configuration says:
    its own port, socket directory and ``cluster_name``; archiving off (nothing of its
    timeline reaches the cluster's archive); no connection to a primary, no synchronous
    standbys to wait for, no commands run at the end of recovery."""
    return {
        "port": str(port),
        "unix_socket_directories": socket_directory,
        "listen_addresses": listen_addresses,
        "cluster_name": f"pgsnap-clone-{name}",
        "archive_mode": "off",
        "synchronous_standby_names": "",
        "primary_conninfo": "",
        "primary_slot_name": "",
        "recovery_end_command": "",
        "archive_cleanup_command": "",
        "hot_standby": "on",
        "external_pid_file": "",
    }


def rewrite_tablespace_map(spcmapfile: str, moves: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """``tablespace_map`` text with each location below a key of ``moves`` (an origin
    mount point) moved below its value (the clone's path), and ``{oid: new location}``.

    A location below no key is refused (``ExecutionError``): the clone would use the
    cluster's own tablespace."""
    out: list[str] = []
    where: dict[str, str] = {}
    for line in spcmapfile.splitlines():
        if not line.strip():
            continue
        oid, _, location = line.partition(" ")
        new = None
        for source, clone in sorted(moves.items(), key=lambda kv: -len(kv[0])):
            origin = source.rstrip("/")
            if location == origin or location.startswith(origin + "/"):
                new = clone.rstrip("/") + location[len(origin) :]
                break
        if new is None:
            raise ExecutionError(
                f"tablespace {oid} ({location}) is on no volume the clone copies: the clone "
                "would write into the cluster's own tablespace",
                step_id="",
                hint="add the tablespace's volume to the layout, then make a new plan",
            )
        out.append(f"{oid} {new}")
        where[oid] = new
    return ("\n".join(out) + "\n") if out else "", where


def clone_server(
    adapter: DatabaseAdapter,
    data_directory: str,
    port: int,
    at: str,
    *,
    step_id: str = "",
    host: Host | None = None,
) -> CloneServer:
    """The adapter of the clone's server on ``data_directory`` (its socket and log in
    ``at``) on ``host`` (default: the database host), from the cluster's ``adapter``."""
    if not isinstance(adapter, ServerInstances):
        raise ExecutionError(
            "the database adapter cannot run another instance beside the cluster",
            step_id=step_id,
            hint="clones need pgsnap's PostgreSQL adapter (or one implementing ServerInstances)",
        )
    return adapter.instance(
        data_directory=data_directory,
        port=port,
        socket_directory=at,
        log_file=posixpath.join(at, "server.log"),
        host=host,
    )


def _apart(op: Operation, ctx: OperationContext, path: str, what: str) -> None:
    """``path`` is apart from the layout's volumes and from the archive directory."""
    check_apart_from_layout(op, ctx, path, what)
    archive = ctx.archive.location
    if archive.startswith("/"):
        norm = posixpath.normpath(path)
        arch = posixpath.normpath(archive)
        if norm == arch or norm.startswith(arch + "/") or arch.startswith(norm + "/"):
            raise op.mismatch(ctx, f"{what} {path}, which is at or around the WAL archive", _REPLAN)


def _inside(path: str, directory: str) -> bool:
    norm, base = posixpath.normpath(path), posixpath.normpath(directory)
    return norm.startswith(base + "/")


def _find_clone_volume(ctx: OperationContext, storage_name: str, path: str) -> StorageVolume | None:
    """The clone volume named ``storage_name`` (or at ``path``), never a layout volume."""
    layout = {v.id for v in ctx.layout.volumes}
    for vol in ctx.backend.list_volumes():
        if vol.id in layout:
            continue
        if vol.name == storage_name or (path and vol.path == path) or (path and vol.id == path):
            return vol
    return None


def _record(ctx: OperationContext, op: Operation, name: str) -> CloneRecord | None:
    try:
        return ctx.catalog.get_clone(name)
    except CatalogError:
        return None


class _CloneStep(Operation):
    """What every clone step shares: the clone's name and base directory, and the host
    it lives on (``on``: the storage's name for it; empty: the database host)."""

    clone: str
    at: str
    on: str

    def where(self, ctx: OperationContext) -> Host:
        """The host the clone lives on."""
        host = ctx.host_named(self.on)
        if host is None:
            raise self.mismatch(
                ctx,
                f"it works on host {self.on!r}, which pgsnap does not reach",
                f"configure it ([clone_hosts.{self.on}]), then make a new plan",
            )
        return host

    def _check_base(self, ctx: OperationContext) -> None:
        if not CLONE_NAME_RE.match(self.clone):
            raise self.mismatch(ctx, f"invalid clone name {self.clone!r}", _REPLAN)
        _apart(self, ctx, self.at, "it puts a clone in")
        self.where(ctx)

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        self._check_base(ctx)


class _CloneDirStep(_CloneStep):
    """A step on the clone's data directory (below ``at``)."""

    data_directory: str

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        self._check_base(ctx)
        if not _inside(self.data_directory, self.at):
            raise self.mismatch(
                ctx,
                f"the clone's data directory {self.data_directory} is not below its "
                f"directory {self.at}",
                _REPLAN,
            )
        _apart(self, ctx, self.data_directory, "it works on a clone's data directory at")


class _CloneServerStep(_CloneDirStep):
    """A step on the clone's server."""

    port: int

    def server(self, ctx: OperationContext) -> CloneServer:
        """The clone's server."""
        return clone_server(
            ctx.adapter,
            self.data_directory,
            self.port,
            self.at,
            step_id=ctx.step_id,
            host=self.where(ctx),
        )


# --------------------------------------------------------------------------- catalog


@frozen
class RecordClone(_CloneStep):
    """Record the clone in the catalog (state ``creating``) before anything is made, so
    a clone left half-made is listed and can be destroyed."""

    name = "catalog.record_clone"
    target = Target.CATALOG
    compensation = "catalog.forget_clone"

    clone: str
    at: str
    backup_id: str
    recovery_target: RecoveryTarget
    host: str
    data_directory: str
    port: int
    action: RecoveryAction
    volumes: tuple[CloneVolume, ...]
    purpose: str = "clone"
    on: str = ""
    slot: str = ""

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        self._check_base(ctx)
        self.backup_record(ctx, self.backup_id)
        if plan.undo or ctx.step_id in plan.started:
            return
        found = _record(ctx, self, self.clone)
        if found is not None:
            raise self.mismatch(
                ctx,
                f"a clone named {self.clone} exists already (of backup {found.backup_id}, "
                f"since {found.created_at:%Y-%m-%d %H:%M:%S} UTC)",
                f"choose another name, or destroy it first (pgsnap clone destroy {self.clone})",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        found = _record(ctx, self, self.clone)
        if found is not None and found.plan_id != ctx.plan_id:
            raise ExecutionError(
                f"a clone named {self.clone} was recorded meanwhile by another run",
                step_id=ctx.step_id,
                hint="choose another name",
            )
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        ctx.catalog.put_clone(
            CloneRecord(
                name=self.clone,
                backup_id=self.backup_id,
                target=self.recovery_target,
                host=self.host,
                at=self.at,
                data_directory=self.data_directory,
                port=self.port,
                socket_directory=self.at,
                action=self.action,
                state=CloneState.CREATING,
                created_at=ctx.clock(),
                created_by=user,
                plan_id=ctx.plan_id,
                volumes=self.volumes,
                purpose=self.purpose,
                slot=self.slot,
            )
        )
        return {"clone": self.clone}


@frozen
class MarkCloneReady(Operation):
    """Mark the clone ``ready`` in the catalog: recovered, checked, handed over."""

    name = "catalog.mark_clone_ready"
    target = Target.CATALOG

    clone: str

    def run(self, ctx: OperationContext) -> Outputs:
        found = ctx.catalog.get_clone(self.clone)
        made = {v.origin: v for v in found.volumes}
        for vol in found.volumes:
            if not vol.volume_id:
                hit = _find_clone_volume(ctx, _storage_name(self.clone, vol), vol.path)
                if hit is not None:
                    made[vol.origin] = attrs.evolve(vol, volume_id=hit.id)
        ctx.catalog.put_clone(
            attrs.evolve(
                found,
                state=CloneState.READY,
                ready_at=ctx.clock(),
                volumes=tuple(made[v.origin] for v in found.volumes),
            )
        )
        return {}


@frozen
class ForgetClone(Operation):
    """Remove the clone's record, once nothing of it is left on the storage (else the
    record stays, so a later ``pgsnap clone destroy`` finds what remains)."""

    name = "catalog.forget_clone"
    target = Target.CATALOG

    clone: str

    def run(self, ctx: OperationContext) -> Outputs:
        found = _record(ctx, self, self.clone)
        if found is None:
            return {"forgotten": False}
        left = [
            v.origin
            for v in found.volumes
            if _find_clone_volume(ctx, _storage_name(self.clone, v), v.path) is not None
        ]
        if left:
            raise ExecutionError(
                f"clone {self.clone}'s copies of {', '.join(left)} are still on the storage: "
                "its record is kept",
                step_id=ctx.step_id,
                hint=f"run pgsnap clone destroy {self.clone} again",
            )
        ctx.catalog.delete_clone(self.clone)
        return {"forgotten": True}


def _storage_name(clone: str, vol: CloneVolume) -> str:
    """The storage name of the clone's copy of ``vol`` (fixed by the clone's name and
    the origin, so it is found again after an interruption)."""
    digest = hashlib.sha256(vol.origin.encode()).hexdigest()[:6]
    return f"pgc-{clone}-{digest}"


# --------------------------------------------------------------------------- host


@frozen
class MakeCloneDirectory(_CloneStep):
    """Create the clone's directory ``at`` (owned by the cluster's OS user, mode 0700):
    its volumes, socket and server log go in it."""

    name = "host.make_clone_directory"
    target = Target.HOST
    compensation = "host.remove_clone_directory"

    clone: str
    at: str
    owner_of: str
    on: str = ""

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        self._check_base(ctx)
        if plan.undo or ctx.step_id in plan.started:
            return
        if self.where(ctx).exists(self.at):
            raise self.mismatch(
                ctx,
                f"{self.at} exists already",
                "choose another place for the clone (at=), or remove it",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        info = ctx.host.stat(self.owner_of)
        host = self.where(ctx)
        if info is None:
            owner = None
        elif host is ctx.host:
            owner = f"{info.uid}:{info.gid}"
        else:  # another machine: the same user by name
            owner = info.owner
        host.make_dirs(self.at, mode=0o700, owner=owner)
        return {"at": self.at}


@frozen
class RemoveCloneDirectory(_CloneStep):
    """Remove the clone's directory (what is left in it: the socket, the server log,
    empty mount points), on its own file system only; a no-op when it is gone."""

    name = "host.remove_clone_directory"
    target = Target.HOST

    clone: str
    at: str
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        host = self.where(ctx)
        if not host.exists(self.at):
            return {"removed": False}
        host.run(["rm", "-rf", "--one-file-system", "--", self.at], check=True)
        return {"removed": True}


# --------------------------------------------------------------------------- storage


@frozen
class CloneSnapshot(_CloneStep):
    """A new writable volume with backup ``backup_id``'s snapshot ``snapshot_id`` of
    volume ``volume.origin``, at ``volume.path`` on the host, named after the clone.

    Checked first: the catalog records that snapshot for that volume of that backup,
    the path is below the clone's directory and apart from the layout, and no volume
    of that name exists yet."""

    name = "storage.clone_snapshot"
    target = Target.STORAGE
    compensation = "storage.delete_clone"
    resume = Resume.CHECK

    clone: str
    at: str
    backup_id: str
    volume: CloneVolume
    on: str = ""

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        self._check_base(ctx)
        vol = self.volume
        if not _inside(vol.path, self.at):
            raise self.mismatch(ctx, f"{vol.path} is not below the clone's {self.at}", _REPLAN)
        _apart(self, ctx, vol.path, "it puts a clone volume at")
        record = self.backup_record(ctx, self.backup_id)
        if record.snapshots.get(vol.origin) != vol.snapshot_id:
            raise self.mismatch(
                ctx,
                f"{vol.snapshot_id} is not backup {self.backup_id}'s snapshot of volume "
                f"{vol.origin}",
                _REPLAN,
            )
        if vol.snapshot_id in {v.id for v in ctx.layout.volumes}:
            raise self.mismatch(ctx, f"{vol.snapshot_id} is a volume of the cluster", _REPLAN)
        if plan.undo or ctx.step_id in plan.started:
            return
        name = _storage_name(self.clone, vol)
        if _find_clone_volume(ctx, name, vol.path) is not None:
            raise self.mismatch(
                ctx,
                f"the storage has a volume {name} (or one at {vol.path}) already",
                f"destroy the clone first (pgsnap clone destroy {self.clone})",
            )

    def probe(self, ctx: OperationContext) -> Outputs | None:
        found = _find_clone_volume(ctx, _storage_name(self.clone, self.volume), self.volume.path)
        return None if found is None else {"volume_id": found.id}

    def run(self, ctx: OperationContext) -> Outputs:
        name = _storage_name(self.clone, self.volume)
        found = _find_clone_volume(ctx, name, self.volume.path)
        if found is None:
            if self.volume.kind is LocationKind.DIRECTORY:
                found = ctx.backend.clone_snapshot(  # type: ignore[call-arg]
                    self.volume.snapshot_id, name, path=self.volume.path
                )
            else:  # a new block volume wherever the storage puts it; mounted later
                found = ctx.backend.clone_snapshot(self.volume.snapshot_id, name)
        log.info(
            "clone %s: %s is a copy of snapshot %s", self.clone, found.id, self.volume.snapshot_id
        )
        return {"volume_id": found.id}

    def created(self, outputs: Mapping[str, Any]) -> tuple[str, ...]:
        return (str(outputs.get("volume_id", "")),)


@frozen
class DeleteClone(_CloneStep):
    """Delete the clone's copy of ``volume.origin`` (found by its name or path); a no-op
    when it is gone. A volume of the layout is never deleted."""

    name = "storage.delete_clone"
    target = Target.STORAGE

    clone: str
    at: str
    volume: CloneVolume
    on: str = ""

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        self._check_base(ctx)
        _apart(self, ctx, self.volume.path, "it deletes a clone volume at")
        if not isinstance(ctx.backend, DeletableClones):
            raise self.mismatch(
                ctx, f"the {ctx.backend.name} backend cannot delete clones", _REPLAN
            )

    def run(self, ctx: OperationContext) -> Outputs:
        found = _find_clone_volume(ctx, _storage_name(self.clone, self.volume), self.volume.path)
        if found is None:
            return {"deleted": None}
        backend = ctx.backend
        assert isinstance(backend, DeletableClones)
        backend.delete_clone(found.id)
        return {"deleted": found.id}


def _clone_volume(
    ctx: OperationContext, op: Operation, clone: str, vol: CloneVolume
) -> StorageVolume:
    found = _find_clone_volume(ctx, _storage_name(clone, vol), vol.path)
    if found is None:
        raise ExecutionError(
            f"the clone's copy of {vol.origin} is not on the storage",
            step_id=ctx.step_id,
            hint="the plan's earlier steps did not run; make a new plan",
        )
    return found


@frozen
class AttachClone(_CloneStep):
    """Attach the clone's copy of ``volume.origin`` (a block volume) to host ``host``;
    outputs the ``device`` the host finds it at. Idempotent; undone by detaching."""

    name = "storage.attach_clone"
    target = Target.STORAGE
    compensation = "storage.detach_clone"

    clone: str
    at: str
    volume: CloneVolume
    host: str
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        found = _clone_volume(ctx, self, self.clone, self.volume)
        if Capability.MAPPING in ctx.backend.capabilities:  # else it is visible already (LVM)
            ctx.backend.attach(found.id, self.host)
        return {"device": ctx.backend.locate(found.id).path, "volume_id": found.id}


@frozen
class DetachClone(_CloneStep):
    """Detach the clone's copy of ``volume.origin`` from ``host``; a no-op when it is
    gone or not attached. A volume of the layout is never detached."""

    name = "storage.detach_clone"
    target = Target.STORAGE

    clone: str
    at: str
    volume: CloneVolume
    host: str
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        found = _find_clone_volume(ctx, _storage_name(self.clone, self.volume), self.volume.path)
        if found is None or self.host not in found.mapped_hosts:
            return {"detached": False}
        ctx.backend.detach(found.id, self.host)
        return {"detached": True}


@frozen
class MountClone(_CloneStep):
    """Wait for the clone volume's ``device`` and mount it read-write at
    ``volume.path`` (XFS with ``nouuid``: it mounts beside its origin)."""

    name = "host.mount_clone"
    target = Target.HOST
    compensation = "host.unmount_clone"

    clone: str
    at: str
    volume: CloneVolume
    device: str | Ref
    timeout: float = 120.0
    on: str = ""

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        super().precheck(ctx, plan)
        _apart(self, ctx, self.volume.path, "it mounts a clone volume on")
        if not _inside(self.volume.path, self.at):
            raise self.mismatch(ctx, f"{self.volume.path} is not below {self.at}", _REPLAN)

    def run(self, ctx: OperationContext) -> Outputs:
        device = str(ctx.resolve(self.device))
        host = self.where(ctx)
        host.wait_for_device(device, timeout=self.timeout)
        options = mount_read_only(host, device, self.volume.path, read_only=False)
        return {"device": device, "options": list(options)}


@frozen
class UnmountClone(_CloneStep):
    """Unmount the clone volume mounted at ``volume.path``; a no-op when nothing is."""

    name = "host.unmount_clone"
    target = Target.HOST

    clone: str
    at: str
    volume: CloneVolume
    on: str = ""

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        super().precheck(ctx, plan)
        _apart(self, ctx, self.volume.path, "it unmounts a clone volume at")

    def run(self, ctx: OperationContext) -> Outputs:
        path = self.volume.path
        host = self.where(ctx)
        places = {path, host.realpath(path)} if host.exists(path) else {path}
        if not [m for m in host.mounts() if posixpath.normpath(m.target) in places]:
            return {"unmounted": False}
        host.unmount(self.volume.path)
        return {"unmounted": True}


# --------------------------------------------------------------------------- server


@frozen
class PrepareClone(_CloneServerStep):
    """Make the cloned data directory the clone's own: ``pg_wal`` a new empty directory
    (never the cluster's WAL volume), the tablespace links pointed at the clone's
    copies, ``postmaster.pid`` and temporary state removed."""

    name = "db.prepare_clone"
    target = Target.DATABASE

    clone: str
    at: str
    data_directory: str
    port: int
    volumes: tuple[CloneVolume, ...]
    spcmapfile: str = ""
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        _text, where = rewrite_tablespace_map(self.spcmapfile, _moves(ctx, self.volumes))
        changed = self.server(ctx).prepare_clone_directory(where)
        return {"changed": len(changed)}


def _moves(ctx: OperationContext, volumes: tuple[CloneVolume, ...]) -> dict[str, str]:
    points = {v.id: v.mount_point for v in ctx.layout.volumes}
    return {
        points[v.origin]: v.path
        for v in volumes
        if v.role is VolumeRole.TABLESPACE and v.origin in points
    }


@frozen
class WriteCloneLabel(_CloneServerStep):
    """Write backup ``backup_id``'s ``backup_label`` into the clone, and its
    ``tablespace_map`` with each location moved to the clone's copy. The catalog's
    label must be the one the plan was made with, and the cloned data directory must
    belong to the backup's cluster."""

    name = "db.write_clone_label"
    target = Target.DATABASE

    clone: str
    at: str
    data_directory: str
    port: int
    backup_id: str
    label_sha256: str
    volumes: tuple[CloneVolume, ...]
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        record = self.backup_record(ctx, self.backup_id)
        label = record.labelfile or ""
        if hashlib.sha256(label.encode()).hexdigest() != self.label_sha256:
            raise self.mismatch(
                ctx,
                f"the catalog's backup label of {record.id} is not the one the plan was made with",
                "the plan was edited or the catalog changed: make a new plan",
            )
        server = self.server(ctx)
        found = server.stored_system_identifier()
        if found != record.system_identifier:
            raise self.mismatch(
                ctx,
                f"the cloned data directory belongs to system {found}, not to backup "
                f"{record.id}'s cluster ({record.system_identifier})",
                "check the storage's snapshots, then make a new plan",
            )
        spcmap, _where = rewrite_tablespace_map(record.spcmapfile or "", _moves(ctx, self.volumes))
        server.write_backup_label(label, spcmap)
        return {"label_sha256": self.label_sha256}


@frozen
class ConfigureClone(_CloneServerStep):
    """Write the clone's own settings (:func:`clone_parameters`: port, socket, archiving
    off...) and its recovery settings (``restore_command`` from the archive, read
    only; the target; the action) and ``recovery.signal``."""

    name = "db.configure_clone"
    target = Target.DATABASE

    clone: str
    at: str
    data_directory: str
    port: int
    recovery_target: RecoveryTarget
    timeline: str
    action: RecoveryAction
    listen_addresses: str = ""
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        server = self.server(ctx)
        server.write_instance_settings(
            clone_parameters(
                name=self.clone,
                port=self.port,
                socket_directory=self.at,
                listen_addresses=self.listen_addresses,
            )
        )
        server.write_recovery_settings(
            RecoverySettings(
                restore_command=ctx.archive.restore_command(),
                target=self.recovery_target,
                target_timeline=self.timeline,
                action=self.action,
            )
        )
        return {}


@frozen
class StartClone(_CloneServerStep):
    """Start the clone's server: it replays WAL from the archive to the target. Its
    undo stops it (a clone can always be thrown away)."""

    name = "db.start_clone"
    target = Target.DATABASE
    compensation = "db.stop_clone"

    clone: str
    at: str
    data_directory: str
    port: int
    timeout: float = 120.0
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        server = self.server(ctx)
        if server.is_running():
            return {"already_running": True}
        server.start_server(timeout=self.timeout)
        return {"already_running": False}


@frozen
class StopClone(_CloneServerStep):
    """Stop the clone's server (fast); a no-op when it is down or its data directory
    is gone."""

    name = "db.stop_clone"
    target = Target.DATABASE

    clone: str
    at: str
    data_directory: str
    port: int
    timeout: float = 120.0
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        if not self.where(ctx).exists(posixpath.join(self.data_directory, "PG_VERSION")):
            return {"was_running": False}
        server = self.server(ctx)
        running = server.is_running()
        if running:
            server.stop_server(timeout=self.timeout)
        return {"was_running": running}


_EXPECTED: Final = {RecoveryAction.PROMOTE: "promoted", RecoveryAction.PAUSE: "paused"}


@frozen
class WaitClone(_CloneServerStep):
    """Wait until the clone's recovery ends the way the plan asked, at its target, and
    check it replayed at least to ``min_replay_lsn``: the backup's consistency point,
    or further where the plan knew where the target lies (an LSN, a restore point,
    the end of the archived WAL)."""

    name = "db.wait_clone"
    target = Target.DATABASE

    clone: str
    at: str
    data_directory: str
    port: int
    action: RecoveryAction
    target_kind: TargetKind
    min_replay_lsn: LSN
    timeout: float = 600.0
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        server = self.server(ctx)
        outcome = server.wait_recovery(timeout=self.timeout, on_progress=ctx.progress)
        if outcome.state != _EXPECTED[self.action]:
            raise ExecutionError(
                f"the clone's recovery ended {outcome.state}, but the plan asked to "
                f"{self.action.value}",
                step_id=ctx.step_id,
                hint=f"see the clone's server log {self.at}/server.log",
            )
        if self.target_kind is not TargetKind.LATEST and not outcome.reached_target:
            raise ExecutionError(
                "the clone's recovery ended without reaching the target",
                step_id=ctx.step_id,
                hint=f"see the clone's server log {self.at}/server.log",
            )
        facts = server.describe()
        replayed = facts.replay_lsn
        # None: the server was restarted since its recovery (a resumed run); the
        # drill that needs the position then says it is not known.
        if replayed is not None and replayed < self.min_replay_lsn:
            raise ExecutionError(
                f"the clone replayed to {replayed}, short of {self.min_replay_lsn}, "
                "where the plan said its recovery reaches",
                step_id=ctx.step_id,
                hint=f"see the clone's server log {self.at}/server.log (a segment its "
                "restore_command could not fetch?)",
            )
        # Kept after the end of recovery: the commit time of the last transaction replayed.
        rows = server.query("SELECT pg_last_xact_replay_timestamp()")
        last = rows[0][0].isoformat() if rows and rows[0][0] is not None else None
        return {
            "state": outcome.state,
            "timeline": facts.timeline,
            "reached_target": outcome.reached_target,
            "replay_lsn": None if replayed is None else str(replayed),
            "planned_lsn": str(self.min_replay_lsn),
            "last_transaction": None if last is None else str(last),
        }


@frozen
class ClearCloneRecovery(_CloneServerStep):
    """Remove the recovery settings from the promoted clone (a restart must not recover
    again); its own settings stay."""

    name = "db.clear_clone_recovery"
    target = Target.DATABASE

    clone: str
    at: str
    data_directory: str
    port: int
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        self.server(ctx).clear_recovery_settings()
        return {}


@frozen
class MaskClone(_CloneServerStep):
    """Run the masking hook in the clone before it is handed over: ``sql`` in database
    ``dbname``, and/or ``script`` (run on the host as the cluster's OS user with
    ``PGHOST``, ``PGPORT`` and ``PGDATA`` set to the clone's)."""

    name = "db.mask_clone"
    target = Target.DATABASE

    clone: str
    at: str
    data_directory: str
    port: int
    sql: str = ""
    dbname: str = "postgres"
    script: str = ""
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        ran: list[str] = []
        if self.sql:
            self.server(ctx).query(self.sql, dbname=self.dbname)
            ran.append("sql")
        if self.script:
            host = self.where(ctx)
            info = host.stat(self.data_directory)
            user = None if info is None else str(info.uid)
            env = [f"PGHOST={self.at}", f"PGPORT={self.port}", f"PGDATA={self.data_directory}"]
            result = host.run(["env", *env, self.script], user=user, check=False, timeout=3600)
            if not result.ok:
                raise ExecutionError(
                    f"the masking script {self.script} failed ({result.returncode}): "
                    f"{result.error_text[-500:]}",
                    step_id=ctx.step_id,
                    hint="fix the script; the clone is destroyed unless kept",
                )
            ran.append("script")
        return {"ran": list(ran)}
