"""``copy.*`` and ``catalog.record_copy``: a backup copied off the array, recorded, and
restored from there.

:class:`SendCopy` reads the trees of a backup's snapshots in place (where
:meth:`~pgsnap.protocols.ReadableSnapshots.snapshot_access` says they are)
and writes them to a copy target as chunks and, last, a manifest
(:func:`pgsnap.copies.copy_trees`), or the mount points where the plan's
``host.mount_snapshot`` steps mounted them read-only, and never a tree at,
in or above a volume of the layout. It is idempotent: a resumed or repeated
run sends only the chunks still missing. Its undo removes the manifest, so a
copy the catalog does not record is not left looking complete.
:class:`RecordCopy` adds the copy to the backup's record.
:class:`RestoreFromCopy` puts one volume's tree of a copy back where the
layout mounts that volume, in a recovery plan (the step a snapshot restore
is when the snapshots are gone).

An encrypted copy's steps carry ``key_file``, the path of the key file
(:class:`~pgsnap.copies.keys.CopyKey`), never the key: each reads it when it
checks or runs, and a restore's precheck refuses, before anything changes, a
copy the catalog records as encrypted when no key file is given or the key
is not the copy's (another fingerprint).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import posixpath
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping

import attrs

from pgsnap._attrs import frozen
from pgsnap.copies import (
    CopyProgress,
    Manifest,
    RestoreProgress,
    copy_trees,
    default_codec,
    open_target,
    restore_trees,
)
from pgsnap.copies.copier import DEFAULT_CHUNK_SIZE, DEFAULT_PARALLEL
from pgsnap.copies.keys import CopyKey
from pgsnap.copies.manifest import WAL_TREE, EntryKind, decode_manifest
from pgsnap.copies.sources import TAR_CREATE, TarEntry, tar_entries
from pgsnap.copies.tarstream import TAR_EXTRACT, write_tree_tar
from pgsnap.errors import ArchiveError, BackupNotFound, CopyError, CopyNotFound, PgsnapError
from pgsnap.host import FileKind, Host
from pgsnap.host.runners import LocalRunner
from pgsnap.host.streams import reading, writing
from pgsnap.model import CopyRecord, Volume, VolumeRole
from pgsnap.operations.base import JSONValue, Operation, OperationContext, Outputs, PlanView, Ref
from pgsnap.operations.base import Target as _Target
from pgsnap.operations.host import (
    MountSnapshot,
    check_apart_from_layout,
    check_reading_host,
    reading_host,
)
from pgsnap.wal import COMPRESSION_SUFFIXES
from pgsnap.wal.reader import archived_segment_problem

__all__ = [
    "DeleteCopyManifest",
    "HostTree",
    "RecordCopy",
    "RestoreFromCopy",
    "RestoreWalFromCopy",
    "SendCopy",
    "copy_tree_name",
]

log = logging.getLogger(__name__)


def copy_tree_name(vol: Volume) -> str:
    """The name of volume ``vol``'s tree in a copy: ``pgdata`` for the data
    directory's volume, ``tablespace-<oid>`` for a tablespace's."""
    if vol.role is VolumeRole.DATA:
        return "pgdata"
    return f"tablespace-{vol.tablespace_oid}" if vol.tablespace_oid else f"volume-{vol.name}"


def _str_tuple(values: object) -> tuple[str, ...]:
    return tuple(str(v) for v in values) if isinstance(values, (list, tuple)) else ()


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 10 min``: a time left, for a progress line."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


@frozen
class HostTree:
    """A tree on ``host`` at ``path`` (a mounted snapshot, a snapshot read in place),
    read through the Host seam (:class:`~pgsnap.copies.sources.StreamedTree`):
    :func:`pgsnap.copies.copy_trees` takes it where it takes a directory here."""

    host: Host
    path: str

    def __str__(self) -> str:
        return f"{self.path} on {self.host.description}"

    def file_sizes(self) -> list[int]:
        """The sizes of the tree's regular files (one ``find`` on the host): what a
        copy's progress counts towards."""
        out = self.host.run(["find", self.path, "-type", "f", "-printf", "%s\\n"], timeout=600)
        return [int(line) for line in out.text.split()]

    @contextlib.contextmanager
    def entries(self) -> Iterator[Iterator[TarEntry]]:
        """The tree's entries as ``tar`` on the host streams them (the ``with`` block
        checks that it succeeded)."""
        argv = [*TAR_CREATE, "-C", self.path, "."]
        with reading(self.host.runner, argv, timeout=3600) as stream:
            yield tar_entries(stream, str(self))


@frozen
class SendCopy(Operation):
    """Copy ``trees`` (name → a snapshot's directory) to the copy target
    ``target_dir`` (a directory or ``s3://bucket/prefix``, with ``target_options``)
    as copy ``copy_id`` of backup ``backup_id``, with the backup label and
    tablespace map in the manifest, and the archived WAL files ``wal`` (as the
    archive names them) in the tree ``pg_wal``, decompressed, each segment checked
    first (size, header, system identifier). With ``key_file`` (the path of a copy
    key file) the copy is encrypted with that key. ``parallel`` upload threads, at most
    ``bandwidth_limit`` bytes a second (None: no limit)."""

    name = "copy.send"
    target = _Target.COPY
    compensation = "copy.delete_manifest"

    copy_id: str
    backup_id: str
    trees: Mapping[str, str]
    target_dir: str
    labelfile: str
    spcmapfile: str = ""
    chunk_size: int = DEFAULT_CHUNK_SIZE
    codec: str = ""
    target_options: Mapping[str, str] = attrs.field(factory=dict)
    wal: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    key_file: str = ""

    @staticmethod
    def _reader(ctx: OperationContext, mount: MountSnapshot | None) -> Host:
        """The host a tree is read on: where the plan mounts it (the database host, or
        the backup host pgsnap runs on), else the database host (read in place)."""
        return reading_host(ctx, mount.host) if mount is not None else ctx.host

    parallel: int = DEFAULT_PARALLEL
    bandwidth_limit: int | None = None
    host: str = ""
    """The host the trees are read on, as the storage knows it ("" : the database
    host): the database host is read directly when pgsnap runs there, else through
    the Host seam; another (a backup host) is where pgsnap runs."""

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        _key(self.key_file)  # a missing or unsafe key file: refused before anything runs
        if WAL_TREE in self.trees:
            raise self.mismatch(
                ctx,
                f"a snapshot tree is named {WAL_TREE}, the name of the copy's WAL",
                "make a new plan (pgsnap copy)",
            )
        mounted = {op.mount_point: op for _sid, op in plan.of(MountSnapshot)}
        hosts = {op.host for op in mounted.values()} | {self.host or ctx.host.name}
        if len(hosts) > 1:
            raise self.mismatch(
                ctx,
                f"it reads the trees on {self.host or ctx.host.name}, but the plan mounts "
                f"them on {', '.join(sorted(hosts - {self.host or ctx.host.name}))}",
                "the plan was edited: make a new plan",
            )
        check_reading_host(self, ctx, self.host or ctx.host.name)
        for name, path in self.trees.items():
            check_apart_from_layout(self, ctx, path, f"it reads tree {name} from")
            if mounted and path not in mounted:
                raise self.mismatch(
                    ctx,
                    f"it reads tree {name} from {path}, where no step of this plan mounts "
                    "a snapshot of the backup",
                    "the plan was edited: make a new plan",
                )
        try:
            record = ctx.catalog.get(self.backup_id)
        except BackupNotFound:
            raise self.mismatch(
                ctx,
                f"backup {self.backup_id} is not in the catalog",
                "list the backups with `pgsnap list`, then make a new plan",
            ) from None
        if record.labelfile != self.labelfile:
            raise self.mismatch(
                ctx,
                f"the plan's backup label is not backup {self.backup_id}'s",
                "make a new plan (pgsnap copy)",
            )
        for name, path in self.trees.items():
            if path in mounted and ctx.step_id not in plan.started:
                continue  # the plan mounts it before this step (checked when it runs)
            found = self._reader(ctx, mounted.get(path)).stat(path)
            if found is None or found.kind is not FileKind.DIRECTORY:
                raise self.mismatch(
                    ctx,
                    f"the snapshot tree {name} ({path}) of backup {self.backup_id} is gone",
                    "list the backup's snapshots (pgsnap list); a backup without them "
                    "cannot be copied",
                )

    def run(self, ctx: OperationContext) -> Outputs:
        def progress(p: CopyProgress) -> None:
            left = p.seconds_left
            ctx.progress(
                f"{p.files_done}/{p.files_total} files, "
                f"{p.bytes_read / 2**20:.0f} of {p.bytes_total / 2**20:.0f} MiB read, "
                f"{p.bytes_sent / 2**20:.0f} MiB sent, {p.rate / 2**20:.1f} MiB/s"
                + ("" if left is None else f", {_duration(left)} left"),
                {
                    "files_done": p.files_done,
                    "files_total": p.files_total,
                    "bytes_read": p.bytes_read,
                    "bytes_total": p.bytes_total,
                    "bytes_sent": p.bytes_sent,
                    "rate": round(p.rate, 1),
                    "seconds_left": None if left is None else round(left, 1),
                },
            )

        files = {"backup_label": self.labelfile}
        if self.spcmapfile:
            files["tablespace_map"] = self.spcmapfile
        with tempfile.TemporaryDirectory(prefix="pgsnap-copy-wal-") as staged:
            reader = reading_host(ctx, self.host or ctx.host.name)
            trees: dict[str, str | HostTree] = {}
            for name, path in self.trees.items():
                if isinstance(reader.runner, LocalRunner):
                    # A tree is the directory at its path: a path through a symbolic
                    # link (a simulated mount point is one) is read where it leads.
                    trees[name] = os.path.realpath(path)
                else:  # tar on the database host, its stream over ssh
                    trees[name] = HostTree(reader, reader.realpath(path))
            held: list[str] = []
            if self.wal:
                held = _stage_wal(ctx, self.backup_id, self.wal, staged)
                trees[WAL_TREE] = staged
            out = self._send(ctx, trees, files, progress)
        return {**out, "wal": held}

    def _send(
        self,
        ctx: OperationContext,
        trees: Mapping[str, str | HostTree],
        files: Mapping[str, str],
        progress: Callable[[CopyProgress], None],
    ) -> dict[str, JSONValue]:
        key = _key(self.key_file)
        manifest, stats = copy_trees(
            trees,
            open_target(self.target_dir, self.target_options, connections=2 * self.parallel),
            copy_id=self.copy_id,
            backup_id=self.backup_id,
            files=files,
            chunk_size=self.chunk_size,
            codec=self.codec or default_codec(),
            clock=ctx.clock,
            on_progress=progress,
            key=key,
            parallel=self.parallel,
            bandwidth_limit=self.bandwidth_limit,
        )
        return {
            "manifest_digest": manifest.digest(),
            "key_fingerprint": manifest.key_fingerprint,
            "created_at": manifest.created_at.isoformat(),
            "files": stats.files,
            "bytes_read": stats.bytes_read,
            "bytes_sent": stats.bytes_sent,
            "chunks_new": stats.chunks_new,
            "chunks_reused": stats.chunks_reused,
            "seconds": stats.seconds,
        }


@frozen
class DeleteCopyManifest(Operation):
    """Remove a copy's manifest (its chunks stay: they are reused by the next copy)."""

    name = "copy.delete_manifest"
    target = _Target.COPY

    copy_id: str
    target_dir: str
    target_options: Mapping[str, str] = attrs.field(factory=dict)

    def run(self, ctx: OperationContext) -> Outputs:
        open_target(self.target_dir, self.target_options).delete_manifest(self.copy_id)
        return {}


@frozen
class RecordCopy(Operation):
    """Add copy ``copy_id`` (what the ``sent`` step reported) to its backup's record."""

    name = "catalog.record_copy"
    target = _Target.CATALOG

    backup_id: str
    copy_id: str
    target_dir: str
    sent: Ref

    def run(self, ctx: OperationContext) -> Outputs:
        out = ctx.resolve(self.sent)
        if not isinstance(out, Mapping):
            raise PgsnapError(f"step {ctx.step_id}: the copy step reported nothing")
        record = ctx.catalog.get(self.backup_id)
        copy = CopyRecord(
            copy_id=self.copy_id,
            target=self.target_dir,
            manifest_digest=str(out["manifest_digest"]),
            created_at=dt.datetime.fromisoformat(str(out["created_at"])),
            files=int(str(out["files"])),
            bytes_read=int(str(out["bytes_read"])),
            bytes_sent=int(str(out["bytes_sent"])),
            chunks_new=int(str(out["chunks_new"])),
            chunks_reused=int(str(out["chunks_reused"])),
            seconds=float(str(out["seconds"])),
            wal=tuple(str(n) for n in _list(out.get("wal"))),
            key_fingerprint=str(out.get("key_fingerprint", "")),
        )
        kept = tuple(c for c in record.copies if c.copy_id != self.copy_id)
        ctx.catalog.put(attrs.evolve(record, copies=(*kept, copy)))
        return {}


def _stage_wal(
    ctx: OperationContext, backup_id: str, names: tuple[str, ...], dest: str
) -> list[str]:
    """Write the archived WAL files ``names`` into ``dest`` decompressed, under their
    plain names; return those names. A segment that is gone or cannot be replayed
    (:func:`~pgsnap.wal.reader.archived_segment_problem`) fails the copy before
    anything is sent: a copy is not made with WAL that would stop its restore."""
    record = ctx.catalog.get(backup_id)
    held: list[str] = []
    for stored in names:
        plain = _plain_wal_name(stored)
        found = ctx.archive.stat(stored)
        if found is None:
            raise CopyError(
                f"WAL file {stored} of backup {backup_id} is gone from the archive "
                f"{ctx.archive.location}",
                hint="make a new plan (pgsnap copy): it copies the backup without its WAL "
                "when the archive no longer has it all",
                backup_id=backup_id,
                name=stored,
            )
        if not plain.endswith(".history"):
            why = archived_segment_problem(
                ctx.archive,
                found,
                segment_size=record.wal_segment_size,
                system_identifier=record.system_identifier,
                major=record.server_version // 10000,
            )
            if why is not None:
                raise CopyError(
                    f"archived WAL segment {stored} of backup {backup_id} cannot be "
                    f"replayed: {why}; nothing was sent",
                    hint="put a good copy of the segment in the archive, then copy again",
                    backup_id=backup_id,
                    name=stored,
                )
        stream = ctx.archive.open(stored)
        try:
            with open(os.path.join(dest, plain), "wb") as out:
                while block := stream.read(1 << 20):
                    out.write(block)
        except (OSError, ArchiveError) as exc:
            raise CopyError(
                f"WAL file {stored} of backup {backup_id} could not be read from the "
                f"archive: {exc}",
                hint="check the archive, then copy again",
                backup_id=backup_id,
                name=stored,
            ) from exc
        finally:
            stream.close()
        held.append(plain)
    return held


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _plain_wal_name(stored: str) -> str:
    """``000000010000000000000003`` for ``000000010000000000000003.gz``."""
    base, dot, ext = stored.rpartition(".")
    return base if dot and ext in COMPRESSION_SUFFIXES else stored


def _key(key_file: str) -> CopyKey | None:
    """The copy key in ``key_file`` ("" : None)."""
    return CopyKey.from_file(key_file) if key_file else None


def _checked_manifest(
    op: RestoreFromCopy | RestoreWalFromCopy, ctx: OperationContext, tree: str
) -> Manifest:
    """The manifest of ``op``'s copy, checked to be the one the catalog records for its
    backup (``manifest_digest``) and to hold ``tree``."""
    try:
        text = open_target(op.target_dir, op.target_options).get_manifest(op.copy_id)
    except CopyNotFound:
        raise op.mismatch(
            ctx,
            f"copy {op.copy_id} is not in the copy target {op.target_dir}",
            "list the backup's copies (pgsnap list --json) and make a new plan",
        ) from None
    manifest = decode_manifest(text, op.copy_id, _key(op.key_file))
    if manifest.digest() != op.manifest_digest or manifest.backup_id != op.backup_id:
        raise op.mismatch(
            ctx,
            f"the manifest of copy {op.copy_id} in {op.target_dir} is not the one the "
            f"catalog records for backup {op.backup_id}",
            "the copy was replaced or the plan edited: verify the copy "
            "(pgsnap verify-copy) and make a new plan",
        )
    if tree not in manifest.trees:
        raise op.mismatch(
            ctx,
            f"copy {op.copy_id} has no tree {tree!r} (its trees: {', '.join(manifest.trees)})",
            "the plan was edited or made for another layout: make a new plan",
        )
    return manifest


def _check_recorded_copy(
    op: RestoreFromCopy | RestoreWalFromCopy, ctx: OperationContext
) -> CopyRecord:
    record = op.backup_record(ctx, op.backup_id)
    copy = next((c for c in record.copies if c.copy_id == op.copy_id), None)
    if copy is None or copy.manifest_digest != op.manifest_digest:
        raise op.mismatch(
            ctx,
            f"the catalog does not record copy {op.copy_id} of backup {op.backup_id}"
            + ("" if copy is None else " with the manifest the plan was made with"),
            "list the backup's copies (pgsnap list --json) and make a new plan",
        )
    if copy.key_fingerprint:
        hint = (
            f"set [copies] key_file to the key file of fingerprint {copy.key_fingerprint} "
            "(the key the copy was made with) and make a new plan"
        )
        if not op.key_file:
            raise op.mismatch(
                ctx,
                f"copy {op.copy_id} is encrypted with key {copy.key_fingerprint}: give "
                "[copies] key_file",
                hint,
            )
        key = _key(op.key_file)
        assert key is not None
        if key.fingerprint != copy.key_fingerprint:
            raise op.mismatch(
                ctx,
                f"copy {op.copy_id} is encrypted with key {copy.key_fingerprint}, not with "
                f"the key in {op.key_file} ({key.fingerprint})",
                hint,
            )
    return copy


def _clear_on(host: Host, directory: str) -> int:
    """:func:`_clear` through the Host seam."""
    names = [n for n in host.list_dir(directory) if n != "lost+found"]
    host.remove([posixpath.join(directory, n) for n in names], recursive=True)
    return len(names)


def _clear(directory: str) -> int:
    """Remove everything in ``directory`` (a fresh file system's ``lost+found`` aside),
    keeping the directory itself (a mount point); return the entries removed."""
    removed = 0
    with os.scandir(directory) as it:
        entries = list(it)
    for e in entries:
        if e.name == "lost+found":
            continue
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path)
        else:
            os.unlink(e.path)
        removed += 1
    return removed


@frozen
class RestoreFromCopy(Operation):
    """Replace volume ``volume_id``'s content (the directory the layout mounts it at)
    with tree ``tree`` of copy ``copy_id`` of backup ``backup_id``, in the copy target
    ``target_dir`` (with ``target_options``).

    What it depends on is checked before the run changes anything: that
    ``directory`` is where the layout has the volume; that the catalog records
    the copy on that backup with the manifest digest the plan was made with
    (``manifest_digest``), and the target holds that very manifest with the
    tree; that the plan writes that backup's label. When it runs, the
    volume's content is removed (the plan's safety snapshot, taken first,
    keeps it) and the tree is written, every chunk and file checked. Run
    again after an interruption, it starts over. An encrypted copy is read with
    the key in ``key_file``.
    """

    name = "copy.restore"
    target = _Target.COPY
    compensation = "storage.restore_volume"

    volume_id: str
    backup_id: str
    copy_id: str
    target_dir: str
    tree: str
    directory: str
    manifest_digest: str
    target_options: Mapping[str, str] = attrs.field(factory=dict)
    parallel: int = 4
    key_file: str = ""

    def restores(self) -> tuple[str, str | None]:
        """The volume, and the backup whose copy it gets."""
        return (self.volume_id, self.backup_id)

    def _manifest(self, ctx: OperationContext) -> Manifest:
        return _checked_manifest(self, ctx, self.tree)

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        vol = next((v for v in ctx.layout.volumes if v.id == self.volume_id), None)
        if vol is None or vol.role not in (VolumeRole.DATA, VolumeRole.TABLESPACE):
            raise self.mismatch(
                ctx,
                f"it restores volume {self.volume_id}, which is not a data or tablespace "
                "volume of the cluster's layout",
                "the plan was edited or made for another cluster: make a new plan",
            )
        if os.path.normpath(self.directory) != os.path.normpath(vol.mount_point):
            raise self.mismatch(
                ctx,
                f"it writes into {self.directory}, but the layout has volume "
                f"{self.volume_id} at {vol.mount_point}",
                "the plan was edited: make a new plan",
            )
        if self.tree != copy_tree_name(vol):
            raise self.mismatch(
                ctx,
                f"it writes the copy's tree {self.tree!r} into volume {self.volume_id}, "
                f"whose tree is {copy_tree_name(vol)!r}",
                "the plan was edited: make a new plan",
            )
        _check_recorded_copy(self, ctx)
        self.check_writes_label(ctx, plan, self.backup_id)
        if ctx.step_id not in plan.started:
            self._manifest(ctx)
            found = ctx.host.stat(self.directory)
            if found is None or found.kind is not FileKind.DIRECTORY:
                raise self.mismatch(
                    ctx,
                    f"{self.directory}, where volume {self.volume_id} is mounted, is not a "
                    "directory",
                    f"mount the (new, empty) volume at {self.directory}, then make a new plan",
                )

    def run(self, ctx: OperationContext) -> Outputs:
        manifest = self._manifest(ctx)
        started = time.monotonic()
        local = isinstance(ctx.host.runner, LocalRunner)
        removed = _clear(self.directory) if local else _clear_on(ctx.host, self.directory)
        if removed:
            log.info("removed %d entries of %s before the restore", removed, self.directory)

        def progress(p: RestoreProgress) -> None:
            left = p.seconds_left
            ctx.progress(
                f"{p.files_done}/{p.files_total} files, {p.bytes_written / 2**20:.0f} of "
                f"{p.bytes_total / 2**20:.0f} MiB, {p.rate / 2**20:.1f} MiB/s"
                + ("" if left is None else f", {_duration(left)} left"),
                {
                    "files_done": p.files_done,
                    "files_total": p.files_total,
                    "bytes_done": p.bytes_written,
                    "bytes_total": p.bytes_total,
                    "rate": round(p.rate, 1),
                    "seconds_left": None if left is None else round(left, 1),
                },
            )

        store = open_target(self.target_dir, self.target_options, connections=2 * self.parallel)
        try:
            if local:
                written = restore_trees(
                    manifest,
                    store,
                    {self.tree: self.directory},
                    parallel=self.parallel,
                    on_progress=progress,
                    key=_key(self.key_file),
                )
            else:  # through the Host seam: tar on the database host writes the stream
                with writing(ctx.host.runner, [*TAR_EXTRACT, "-C", self.directory]) as pipe:
                    written = write_tree_tar(
                        manifest,
                        store,
                        self.tree,
                        pipe,
                        key=_key(self.key_file),
                        parallel=self.parallel,
                        on_progress=progress,
                    )
        except OSError as exc:
            raise CopyError(
                f"cannot write copy {self.copy_id}'s tree {self.tree} into "
                f"{self.directory}: {exc.strerror or exc}",
                hint="check the volume's free space and permissions, then resume",
                path=str(getattr(exc, "filename", "") or self.directory),
            ) from exc
        return {
            "bytes_written": written,
            "removed": removed,
            "seconds": round(time.monotonic() - started, 3),
        }


def _own_like(path: str, directory: os.stat_result) -> None:
    """Give a WAL file written into ``pg_wal`` the owner of that directory (the
    cluster's owner: PostgreSQL opens its WAL read-write) and PostgreSQL's mode:
    0600, or 0640 where the cluster allows group access (``initdb -g``)."""
    if os.geteuid() == 0:
        os.chown(path, directory.st_uid, directory.st_gid)
    os.chmod(path, 0o640 if directory.st_mode & 0o050 else 0o600)


def _data_directory_in(manifest: Manifest, tree: str) -> str | None:
    """Where the data directory is in ``tree`` of ``manifest`` (relative; "" at its
    top): the directory holding both ``PG_VERSION`` and ``global/pg_control``."""
    paths = {e.path for e in manifest.entries_of(tree) if e.kind is EntryKind.FILE}
    for p in sorted(paths, key=len):
        if p == "PG_VERSION" or p.endswith("/PG_VERSION"):
            top = p[: -len("PG_VERSION")]
            if f"{top}global/pg_control" in paths:
                return top.rstrip("/")
    return None


@frozen
class RestoreWalFromCopy(Operation):
    """Write the WAL files a copy carries (its ``pg_wal`` tree: the backup's segments
    from its start to its stop) into the restored data directory's ``pg_wal``, in a
    recovery from copy ``copy_id``: with them the server reaches the backup's
    consistency point even when the WAL archive is lost too (PostgreSQL reads
    ``pg_wal`` when ``restore_command`` does not find a segment).

    ``directory`` is where the layout mounts the data volume; the data directory
    is found in the copy's ``data_tree`` (the directory with ``PG_VERSION`` and
    ``global/pg_control``). A file already in ``pg_wal`` is kept, never replaced.
    Checked before anything runs: the catalog records the copy with that
    manifest, the plan restores the data volume from that backup and cleans the
    data directory before this step, and the step writes where the layout has
    the data volume, on this machine.
    """

    name = "copy.restore_wal"
    target = _Target.DATABASE

    backup_id: str
    copy_id: str
    target_dir: str
    directory: str
    manifest_digest: str
    names: tuple[str, ...] = attrs.field(converter=_str_tuple)
    data_tree: str = "pgdata"
    target_options: Mapping[str, str] = attrs.field(factory=dict)
    key_file: str = ""

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        data = ctx.layout.data
        if os.path.normpath(self.directory) != os.path.normpath(data.mount_point):
            raise self.mismatch(
                ctx,
                f"it writes WAL into {self.directory}, but the layout has the data volume "
                f"{data.id} at {data.mount_point}",
                "the plan was edited: make a new plan",
            )
        if self.data_tree != copy_tree_name(data):
            raise self.mismatch(
                ctx,
                f"it looks for the data directory in the copy's tree {self.data_tree!r}, "
                f"not in the data volume's {copy_tree_name(data)!r}",
                "the plan was edited: make a new plan",
            )
        copy = _check_recorded_copy(self, ctx)
        extra = sorted(set(self.names) - set(copy.wal))
        if extra:
            raise self.mismatch(
                ctx,
                f"it writes WAL files {', '.join(extra[:3])} that copy {self.copy_id} does "
                "not carry",
                "the plan was edited: make a new plan",
            )
        here = plan.index(ctx.step_id) if ctx.step_id else len(plan.steps)
        before = plan.steps[:here]
        restored = [r for _s, op, _u in before if (r := op.restores()) is not None]
        if (data.id, self.backup_id) not in restored:
            raise self.mismatch(
                ctx,
                f"it writes WAL of backup {self.backup_id} into the data directory, but the "
                f"plan does not first restore the data volume {data.id} from that backup",
                "the plan was edited: make a new plan",
            )
        if not any(op.name == "db.prepare_data_directory" for _s, op, _u in before):
            raise self.mismatch(
                ctx,
                "it writes WAL into pg_wal before the data directory is cleaned, which "
                "would remove it again",
                "the plan was edited: make a new plan",
            )
        if ctx.step_id not in plan.started:
            _checked_manifest(self, ctx, WAL_TREE)

    def run(self, ctx: OperationContext) -> Outputs:
        manifest = _checked_manifest(self, ctx, WAL_TREE)
        top = _data_directory_in(manifest, self.data_tree)
        if top is None:
            raise CopyError(
                f"copy {self.copy_id} has no data directory in its tree {self.data_tree}",
                hint="verify the copy (pgsnap verify-copy); restore from another copy",
                copy_id=self.copy_id,
            )
        if not isinstance(ctx.host.runner, LocalRunner):
            return self._run_on_host(ctx, manifest, top)
        pg_wal = os.path.realpath(os.path.join(self.directory, top, "pg_wal"))
        if not os.path.isdir(pg_wal):
            raise CopyError(
                f"the restored data directory has no pg_wal directory ({pg_wal})",
                hint="check the restored data directory and the WAL volume's mount, then resume",
                path=pg_wal,
            )
        owner = os.stat(pg_wal)
        staging = os.path.join(pg_wal, f".pgsnap-restore-{self.copy_id}")
        if os.path.lexists(staging):  # an interrupted run: start this step over
            shutil.rmtree(staging)
        written: list[str] = []
        kept: list[str] = []
        try:
            restore_trees(
                manifest,
                open_target(self.target_dir, self.target_options),
                {WAL_TREE: staging},
                key=_key(self.key_file),
            )
            for name in sorted(os.listdir(staging)):
                dest = os.path.join(pg_wal, name)
                if os.path.lexists(dest):
                    kept.append(name)
                    continue
                os.rename(os.path.join(staging, name), dest)
                _own_like(dest, owner)
                written.append(name)
        except OSError as exc:
            raise CopyError(
                f"cannot write copy {self.copy_id}'s WAL into {pg_wal}: {exc.strerror or exc}",
                hint="check the volume's free space and permissions, then resume",
                path=str(getattr(exc, "filename", "") or pg_wal),
            ) from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if kept:
            log.info("kept %d WAL files already in %s: %s", len(kept), pg_wal, ", ".join(kept))
        return {"written": written, "kept": kept, "pg_wal": pg_wal}

    def _run_on_host(self, ctx: OperationContext, manifest: Manifest, top: str) -> Outputs:
        """:meth:`run` on a database host reached through the Host seam: ``tar`` there
        writes the WAL tree into ``pg_wal``, keeping files already there; the new
        ones get ``pg_wal``'s owner and PostgreSQL's mode."""
        host = ctx.host
        pg_wal = host.realpath(posixpath.join(self.directory, top, "pg_wal"))
        info = host.stat(pg_wal)
        if info is None or info.kind is not FileKind.DIRECTORY:
            raise CopyError(
                f"the restored data directory has no pg_wal directory ({pg_wal} on "
                f"{host.description})",
                hint="check the restored data directory and the WAL volume's mount, then resume",
                path=pg_wal,
            )
        before = set(host.list_dir(pg_wal))
        extract = [*TAR_EXTRACT, "--skip-old-files", "-C", pg_wal]
        with writing(host.runner, extract) as pipe:
            write_tree_tar(
                manifest,
                open_target(self.target_dir, self.target_options),
                WAL_TREE,
                pipe,
                key=_key(self.key_file),
                top=False,
            )
        carried = {e.path for e in manifest.entries_of(WAL_TREE) if e.kind is EntryKind.FILE}
        written = sorted(carried - before)
        kept = sorted(carried & before)
        if written:
            paths = [posixpath.join(pg_wal, n) for n in written]
            host.run(["chown", f"{info.uid}:{info.gid}", "--", *paths])
            host.run(["chmod", "0640" if info.mode & 0o050 else "0600", "--", *paths])
        if kept:
            log.info("kept %d WAL files already in %s: %s", len(kept), pg_wal, ", ".join(kept))
        return {"written": written, "kept": kept, "pg_wal": pg_wal}
