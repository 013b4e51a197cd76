"""``mock``: a stateful in-memory :class:`~pgsnap.protocols.StorageBackend`.

It follows the protocol's contract exactly (it passes
:mod:`pgsnap.testing.conformance`) and is what unit tests, executor tests, the
demo and the end-to-end tests with a real PostgreSQL server run against.

Volumes come in two kinds:

- **in memory** (:meth:`MockBackend.add_volume` without ``path``): the content
  is a dict of blobs (:meth:`~MockBackend.write_blob` / :meth:`~MockBackend.read_blob`).
  :meth:`~MockBackend.locate` gives a device ``/dev/pgsnap-mock/<id>`` that
  never exists on any host: in-memory volumes are for unit tests;
- **directory-backed** (``path=``): the volume is a host directory. A snapshot
  is a copy of the tree (owners, modes, symlinks and times kept) under
  ``root/snapshots/<id>`` (mode 0700): each file cloned copy-on-write where the
  file system has reflinks (btrfs, XFS), else hard-linked to the volume's previous
  snapshot when unchanged (same bytes, owner, mode and time), else copied
  (:meth:`~MockBackend.disk_usage` says what they take); restoring empties the
  directory (never following a symlink out of it) and copies the snapshot back,
  keeping the directory itself, its owner and mode.

Two modes decide how a host reaches a directory-backed volume and what a
restore asks of it (:meth:`~MockBackend.locate`,
:meth:`~MockBackend.restore_profile`):

- **directories** (the default): the host uses the directory itself
  (:meth:`~pgsnap.model.Location.directory`); nothing is done on the host
  before a restore, which copies the snapshot back in place and keeps it;
- **block** (``block=True``, needs ``MAPPING``): each directory-backed volume
  is a simulated block device whose content lives in its directory (the
  "LUN": the host must not use it directly; :attr:`StorageVolume.path
  <pgsnap.model.StorageVolume.path>` is then None and ``extra["lun"]`` names
  it). :meth:`~MockBackend.locate` gives the device ``root/dev/<id>``, which
  exists only while the volume is attached to at least one host
  (:meth:`~MockBackend.attach` makes it a symlink to the LUN,
  :meth:`~MockBackend.detach` of the last host removes it). A restore needs
  the volume detached first (``RestoreProfile(before=DETACH)``): restoring an
  attached volume fails. :meth:`~MockBackend.simulated_host` gives a
  :class:`~pgsnap.host.simulated.SimulatedHost` that mounts these devices (see
  :mod:`pgsnap.host.simulated`); detaching a mounted volume fails, as a
  storage array refuses to unmap a volume in use.

With ``async_restore=True`` a restore completes later
(``RestoreProfile.completes_later``): :meth:`~MockBackend.restore_volume`
leaves the volume *restoring* (its content is already copied) and
:meth:`~MockBackend.attach`, :meth:`~MockBackend.create_snapshot_group` and
another restore of it are refused until :meth:`~MockBackend.wait_for_restore`
completes it. Without it, ``wait_for_restore`` returns at once.

With ``state_file=``, the state (the mode, volumes and whether they are
restoring, snapshots and where their copies live, groups, policies, id
counters, the simulated host's mount table) is kept in a JSON file: read at
construction and before every call, written atomically (mode 0600) after
every change, under an ``fcntl`` lock, so successive ``pgsnap`` commands (and
concurrent processes) share one mock. The mode is fixed when the file is
created; a backend constructed with another mode over it is refused. The
file format is versioned (``{"format": "pgsnap-mock-state", "version": 3}``);
older files are migrated when read and written back as version 3 with the
next change: version 1 (before block mode) gets directories mode, nothing
restoring, nothing mounted; version 2 (before copies were recorded) no copy
under way. ``volumes=`` declares volumes (added once, by id), e.g. from a
TOML configuration.

A process killed in the middle of a copy (a directory volume into
``root/snapshots/<id>``, a snapshot into a clone) leaves a half copy; it
never wedges the mock. Every copy runs inside one call, holding the state
file's exclusive lock from start to end. Once its directory is created and
before anything is copied into it, the copy is recorded in the state
(``copying``: the snapshot or clone id, the directory with its device and
inode, the process id and start time) and the state is saved: the id (its
counter) is thus allocated durably and never handed out twice (a call that
fails cleanly removes its copies and takes its ids back, as no caller saw
them). The save that ends the call drops the record, with the snapshot or
clone recorded in the same write. A record that is
still there when a process next takes the exclusive lock (a backend being
constructed, or any call that changes the state) therefore belongs to a
process that died copying: the kernel released its lock, and no live process
can be copying while the lock is held. Its directory is removed (if it is
still the directory the copy created) with a warning naming it, and the
record dropped. No half copy is ever listed: a snapshot enters the state
only complete. A directory under ``root/snapshots`` or ``root/clones`` that
the state does not know (left by a copy killed before state version 3, or
by another mock sharing the root) is not the state's to remove: its id is
skipped, with a warning, and it stays.

Ids are deterministic: ``vol-0001``, ``snap-0001``, ``cg-0001``, ``pol-0001``
(clones are volumes). Capabilities can be reduced to imitate a simpler storage:
a method needing one that was not granted raises
:class:`~pgsnap.errors.UnsupportedCapability`; without ``CONSISTENCY_GROUPS``,
:meth:`~MockBackend.create_snapshot_group` snapshots the volumes one after the
other, so their ``created_at`` differ, as a storage without consistency groups does.

With ``snapshot_limit=N`` the mock imitates a storage that allows N
snapshots per volume (a PowerFlex V-Tree: 126, 1022 on 5.x; one tree per
volume here): a group that would give a volume more than N snapshots is
refused before anything is taken with
:class:`~pgsnap.errors.SnapshotLimitError` (as PowerFlex's
``PowerFlexSnapshotLimit``), and :meth:`~MockBackend.storage_problems` (the
optional :class:`~pgsnap.protocols.StorageHealth`, read by ``pgsnap check``)
warns once a volume has ``limit_warn_percent`` (80 %) of N and reports an
error at N. Like the capabilities, the limit belongs to the backend object,
not to the state file.

Test hooks: :meth:`~MockBackend.inject_fault`, :meth:`~MockBackend.add_latency`,
:meth:`~MockBackend.add_hold`, :meth:`~MockBackend.clear_faults` and the call log
:attr:`~MockBackend.calls`.
Faults fire before any state change, so a failed call changes nothing.
Vendor-only operations are named ``ex_*`` (:meth:`~MockBackend.ex_run_policy`,
:meth:`~MockBackend.ex_expire_secure`).

The package is split by concern: ``_backend`` (the class), ``_state`` (its
records and the versioned state-file codec), ``_files`` (file-tree copies),
``_faults`` (fault injection, latencies and holds) and ``_devices`` (the
block devices and mount table a :class:`~pgsnap.host.simulated.SimulatedHost`
uses). Only the names below are public.
"""

from __future__ import annotations

from pgsnap.backends.mock._backend import DEFAULT_VOLUME_SIZE, MockBackend
from pgsnap.backends.mock._devices import MEMORY_DEVICE_DIR, MockDevices
from pgsnap.backends.mock._faults import FAULT_POINTS, HOLD_TIMEOUT

__all__ = [
    "DEFAULT_VOLUME_SIZE",
    "FAULT_POINTS",
    "HOLD_TIMEOUT",
    "MEMORY_DEVICE_DIR",
    "MockBackend",
    "MockDevices",
]

# The public home of the classes (as psycopg does): reprs, pickles and registered
# targets name pgsnap.backends.mock, not the private module that defines them.
MockBackend.__module__ = __name__
MockDevices.__module__ = __name__
