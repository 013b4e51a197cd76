"""A small qemu VM with real lvm2; its console is a pgsnap :class:`~pgsnap.protocols.Runner`.

The kernel of the machine that runs the tests may have no device-mapper (this
project's machine kind has none), so lvm2 cannot run there. This module boots
a stock Debian cloud kernel under qemu (TCG: no KVM needed) with a busybox
initramfs holding lvm2, thin-provisioning-tools and a few util-linux and
e2fsprogs programs, and a raw disk image as ``/dev/vda``::

    from pgsnap.testing.lvmvm import LvmVm, lvmvm_unavailable

    reason = lvmvm_unavailable()          # None when this machine can do it
    with LvmVm.boot() as vm:              # about 10 s under TCG
        vm.host.run(["vgcreate", "vg0", "/dev/vda"])
        backend = LvmBackend("vg0", host=vm.host)

What it builds, and where (:data:`CACHE_DIR`, ``PGSNAP_LVMVM_CACHE`` wins):

- the kernel and its modules: ``apt-get download linux-image-<ver>-cloud-amd64``
  (the version ``linux-image-cloud-amd64`` depends on, unless
  ``PGSNAP_LVMVM_KERNEL`` names a package) unpacked with ``dpkg -x``;
- an uncompressed cpio initramfs (it boots faster than a gzipped one):
  busybox (static), ``lvm`` and its command links, ``dmsetup``, ``thin_check``
  and friends, ``fsfreeze``, ``findmnt``, ``mkfs.ext4``, each with the
  libraries ``ldd`` lists, copied from this machine at the same paths; the
  modules for virtio, device-mapper snapshots and thin pools (and the network
  card when a port is forwarded); ``/etc/lvm/lvm.conf`` for a machine without
  udev, lvmetad or lvmpolld; and ``/init``. It is rebuilt when its inputs
  change (a digest of them names the file).

The console command channel (:class:`ConsoleRunner`): ``/init`` turns off the
console's echo and ends in ``cat /dev/ttyS0 | sh`` (a non-interactive shell
reading the console), so each command is one line typed on the console,
which qemu serves on a unix socket (:attr:`LvmVm.console_path`; one
connection at a time: ``vm.runner.released()`` lends it to another process,
which connects with :meth:`ConsoleRunner.attach`). The command line is the
argument list quoted with :func:`shlex.join` (never a string built by the
caller), run under busybox ``timeout -s KILL`` with its standard input from
``/dev/null`` (or from a file the runner wrote first, in acknowledged chunks,
from ``stdin``), its standard output and error to two files that are then
printed base64-encoded between markers with a random tag, followed by the exit
status. A command line of printable ASCII is typed as it is; any other (and
one with ``stdin``) is sent base64-encoded in acknowledged chunks and run from
a file. Every process costs tens of milliseconds under TCG, so the protocol
starts as few as it can: ``timeout`` and the command, and ``base64`` only for
an output that is not empty. A marker never appears literally in what is typed
(``"__PGSNAP""_..."``). The runner serializes commands (one console). When the
VM shares a directory (:attr:`ConsoleRunner.spool`), standard output is written
to a file there and read here, and a standard input larger than 256 KiB goes
through a file there too (a copy's tar stream of a data directory: the serial
line would take many minutes to carry it, and the spool saves ``base64``).

Directories of this machine can be shared with the guest at the same paths
(``LvmVm.boot(share=[...])``, virtiofs served by qemu's ``virtiofsd``): a
WAL archive the guest's PostgreSQL writes is then read here by pgsnap.

:func:`lvmvm_unavailable` says why a VM cannot run here (no qemu, no
busybox-static, no lvm2...); the tests skip with that reason, and fail under
``PGSNAP_NO_SKIPS=1``. Everything needs root only to write the cache under
``/var/cache``; qemu runs as the calling user.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import lzma
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from pgsnap._attrs import frozen
from pgsnap.errors import CommandTimeout, ConfigurationError, HostError, HostUnreachable
from pgsnap.host import CommandResult, Host

__all__ = [
    "CACHE_DIR",
    "MODULES",
    "NET_MODULES",
    "ConsoleRunner",
    "LvmVm",
    "VmImage",
    "build_image",
    "free_port",
    "lvmvm_unavailable",
    "virtiofsd_path",
]

log = logging.getLogger(__name__)

CACHE_DIR: Final = Path(os.environ.get("PGSNAP_LVMVM_CACHE", "/var/cache/pgsnap-test/lvmvm"))
"""Where kernels and initramfs images are cached between runs."""

MODULES: Final = (
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "virtio_blk",
    "libcrc32c",
    "dm-mod",
    "dm-bufio",
    "dm-bio-prison",
    "dm-persistent-data",
    "dm-snapshot",
    "dm-thin-pool",
    "xfs",
    "fuse",
    "virtiofs",
)
"""Kernel modules loaded by ``/init``, in dependency order (a module built into the
kernel is skipped): virtio, device-mapper snapshots and thin pools, XFS, and
virtiofs for the directories :meth:`LvmVm.boot` shares."""

NET_MODULES: Final = ("failover", "net_failover", "virtio_net")
"""Modules for the virtio network card (loaded after :data:`MODULES` when a port is
forwarded)."""

_PROGRAMS: Final = (
    "/sbin/lvm",
    "/sbin/dmsetup",
    "/usr/sbin/pdata_tools",
    "/usr/sbin/fsfreeze",
    "/usr/bin/findmnt",
    "/usr/sbin/mke2fs",
    "/usr/sbin/mkfs.xfs",
    "/usr/bin/dash",
    "/usr/bin/mount",
    "/usr/bin/umount",
    "/usr/sbin/findfs",
)
"""Programs copied from this machine (with their libraries) into the initramfs."""

_PACKAGES: Final = ("coreutils", "findutils", "tar")
"""Packages whose programs are copied too: :class:`~pgsnap.host.Host` expects GNU
coreutils (``realpath -m -z``, ``stat -c``...), which busybox's applets are not, and
a copy read or restored through the Host seam GNU tar (``--format=posix``)."""

_LVM_LINKS: Final = (
    "lvs",
    "vgs",
    "pvs",
    "lvcreate",
    "lvchange",
    "lvconvert",
    "lvremove",
    "lvrename",
    "lvextend",
    "lvresize",
    "vgcreate",
    "vgchange",
    "vgremove",
    "pvcreate",
    "pvremove",
)
_PDATA_LINKS: Final = ("thin_check", "thin_dump", "thin_repair", "thin_restore")

_REQUIRED_HOST_PROGRAMS: Final = {
    "qemu-system-x86_64": "qemu-system-x86",
    "busybox": "busybox-static",
    "lvm": "lvm2",
    "pdata_tools": "thin-provisioning-tools",
    "dpkg": "dpkg",
    "ldd": "libc-bin",
    "fsfreeze": "util-linux",
    "findmnt": "util-linux",
    "mke2fs": "e2fsprogs",
    "mkfs.xfs": "xfsprogs",
}

LVM_CONF: Final = """\
# pgsnap test VM: no udev, no lvmetad, no lvmpolld, no dmeventd.
devices {
    obtain_device_list_from_udev = 0
    external_device_info_source = "none"
    use_devicesfile = 0
}
activation {
    udev_sync = 0
    udev_rules = 0
    monitoring = 0
    polling_interval = 1
}
global {
    use_lvmpolld = 0
}
"""

READY: Final = "PGSNAP_VM_READY"
"""The line ``/init`` prints when the console shell is about to read commands."""

_INIT: Final = """\
#!/bin/sh
export PATH=/sbin:/usr/sbin:/bin:/usr/bin HOME=/root LC_ALL=C TZ=UTC
export LVM_SUPPRESS_FD_WARNINGS=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec 0</dev/ttyS0 1>/dev/ttyS0 2>&1
mkdir -p /dev/shm /dev/pts /tmp /run /mnt
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /run/lvm /run/lock/lvm /var/run/postgresql /etc/lvm/backup /etc/lvm/archive
chmod 1777 /tmp /dev/shm
echo 1 > /proc/sys/kernel/printk
for m in @MODULES@; do
    insmod /lib/modules/pgsnap/$m.ko || echo "PGSNAP_VM_MODULE_FAILED $m"
done
if [ "@NET@" = 1 ]; then
    ip link set lo up
    ip link set eth0 up
    ip addr add 10.0.2.15/24 dev eth0
    ip route add default via 10.0.2.2
fi
# Hold the console open from here on: input typed while nobody has it open is lost.
exec 0</dev/ttyS0 1>/dev/ttyS0 2>&1
stty -echo
echo @READY@
exec sh -c 'cat | sh'
"""

_PASSWD: Final = (
    "root:x:0:0:root:/root:/bin/sh\n"  # noqa: S105 - the VM's /etc/passwd: no password in it
    "postgres:x:101:102:PostgreSQL:/var/lib/postgresql:/bin/sh\n"
)
_GROUP: Final = "root:x:0:\npostgres:x:102:\n"
_SHADOW: Final = "root:*:19000:0:99999:7:::\npostgres:*:19000:0:99999:7:::\n"


# --------------------------------------------------------------------------- availability


def _which(program: str) -> str | None:
    return shutil.which(program, path=os.environ.get("PATH", "") + ":/sbin:/usr/sbin")


def lvmvm_unavailable() -> str | None:
    """Why this machine cannot boot the lvm2 test VM (None: it can).

    Needs qemu-system-x86_64, a static busybox, lvm2, thin-provisioning-tools,
    util-linux, e2fsprogs and dpkg on this machine (their programs are copied
    into the VM), a writable :data:`CACHE_DIR` (or one that already holds a
    built image), and ``apt-get`` for the kernel unless it is cached.
    """
    missing = sorted({pkg for prog, pkg in _REQUIRED_HOST_PROGRAMS.items() if _which(prog) is None})
    if missing:
        return f"missing package(s) for the lvm2 VM: {', '.join(missing)} (apt-get install them)"
    busybox = _which("busybox")
    if busybox is not None and not _is_static(busybox):
        return f"{busybox} is not statically linked (apt-get install busybox-static)"
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create the VM cache {CACHE_DIR}: {exc.strerror}"
    if not os.access(CACHE_DIR, os.W_OK):
        return f"the VM cache {CACHE_DIR} is not writable (run as root or set PGSNAP_LVMVM_CACHE)"
    if not any(CACHE_DIR.glob("kernel-*/vmlinuz")) and _which("apt-get") is None:
        return "no cached kernel and no apt-get to download one"
    return None


def _is_static(path: str) -> bool:
    result = subprocess.run(
        ["ldd", path], capture_output=True, text=True, check=False, env=_c_env()
    )
    return "not a dynamic executable" in (result.stdout + result.stderr) or (
        "statically linked" in result.stdout
    )


def _c_env() -> dict[str, str]:
    return {**os.environ, "LC_ALL": "C"}


def _run(argv: Sequence[str], *, cwd: Path | None = None, timeout: float = 600.0) -> str:
    result = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=timeout,
        env=_c_env(),
    )
    if result.returncode != 0:
        raise HostError(
            f"{shlex.join(argv)} failed with exit status {result.returncode}: "
            f"{result.stderr.strip()[-800:]}",
            host="local",
        )
    return result.stdout


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for a forwarded port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --------------------------------------------------------------------------- the kernel


def _kernel_package() -> str:
    wanted = os.environ.get("PGSNAP_LVMVM_KERNEL")
    if wanted:
        return wanted
    cached = sorted(CACHE_DIR.glob("kernel-*/vmlinuz"))
    for attempt in range(2):
        out = subprocess.run(
            ["apt-cache", "depends", "linux-image-cloud-amd64"],
            capture_output=True,
            text=True,
            check=False,
            env=_c_env(),
        ).stdout
        match = re.search(r"Depends:\s*(linux-image-[0-9][^\s]*-cloud-amd64)\b", out)
        if match:
            return match.group(1)
        if attempt == 0 and not cached and _which("apt-get") is not None:
            _run(["apt-get", "update", "-qq"])  # a fresh machine has no package lists
    if cached:
        return cached[-1].parent.name.removeprefix("kernel-")
    raise ConfigurationError(
        "cannot tell which Debian cloud kernel to download",
        hint="run apt-get update, or set PGSNAP_LVMVM_KERNEL=linux-image-6.1.0-NN-cloud-amd64",
    )


def _fetch_kernel(package: str) -> Path:
    """The unpacked kernel package (``vmlinuz`` and ``lib/modules``) in the cache."""
    target = CACHE_DIR / f"kernel-{package}"
    if (target / "vmlinuz").exists():
        return target
    log.info("lvmvm: downloading %s", package)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR) as tmp:
        work = Path(tmp)
        try:
            _run(["apt-get", "download", package], cwd=work)
        except HostError:
            _run(["apt-get", "update", "-qq"])
            _run(["apt-get", "download", package], cwd=work)
        debs = list(work.glob("*.deb"))
        if len(debs) != 1:
            raise HostError(f"apt-get download {package} gave {len(debs)} files", host="local")
        root = work / "root"
        _run(["dpkg", "-x", str(debs[0]), str(root)])
        kernels = sorted((root / "boot").glob("vmlinuz-*"))
        if not kernels:
            raise HostError(f"{package} has no boot/vmlinuz-*", host="local")
        shutil.move(str(kernels[0]), root / "vmlinuz")
        # Per process: two test workers may fill the cache at once; the first wins.
        partial = CACHE_DIR / f".partial-{package}-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.move(str(root), partial)
        try:
            partial.rename(target)
        except OSError:
            if not (target / "vmlinuz").exists():
                raise
            shutil.rmtree(partial, ignore_errors=True)  # another process was faster
    return target


def _module_files(kernel_dir: Path, names: Iterable[str]) -> dict[str, bytes]:
    """``{name: module bytes}`` for the modules not built into the kernel."""
    (moddir,) = [p for p in (kernel_dir / "lib" / "modules").iterdir() if p.is_dir()]
    builtin_text = (
        (moddir / "modules.builtin").read_text() if (moddir / "modules.builtin").exists() else ""
    )
    builtin = {Path(line).name.split(".ko")[0].replace("-", "_") for line in builtin_text.split()}
    found: dict[str, Path] = {}
    for path in moddir.rglob("*.ko*"):
        found[path.name.split(".ko")[0].replace("-", "_")] = path
    out: dict[str, bytes] = {}
    for name in names:
        key = name.replace("-", "_")
        if key in builtin:
            continue
        module = found.get(key)
        if module is None:
            raise ConfigurationError(
                f"kernel module {name} is neither in {moddir.name}'s modules nor built in"
            )
        data = module.read_bytes()
        if module.name.endswith(".xz"):
            data = lzma.decompress(data)
        elif module.name.endswith(".zst"):
            raise ConfigurationError(f"cannot unpack zstd-compressed module {module.name}")
        out[name] = data
    return out


# --------------------------------------------------------------------------- the initramfs


def _libraries(program: str) -> list[str]:
    out = subprocess.run(
        ["ldd", program], capture_output=True, text=True, check=False, env=_c_env()
    ).stdout
    libs: list[str] = []
    for line in out.splitlines():
        parts = line.split()
        for part in parts:
            if part.startswith("/") and os.path.exists(part):
                libs.append(part)
    return libs


_SKIP: Final = ("bitcode", "llvmjit*")
"""Left out of copied directories (PostgreSQL's JIT: run the server with ``jit=off``)."""


def _binaries(path: str) -> list[str]:
    """``path`` if it is an executable file; in a directory, its executables and
    shared objects (whose libraries must come along too)."""
    if os.path.isfile(path):
        return [path] if os.access(path, os.X_OK) else []
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if d != "bitcode"]
        for name in filenames:
            full = os.path.join(dirpath, name)
            if name.startswith("llvmjit") or os.path.islink(full):
                continue
            if name.endswith(".so") or ".so." in name or os.access(full, os.X_OK):
                found.append(full)
    return found


def _package_programs(packages: Iterable[str]) -> list[str]:
    """The programs (files under a ``bin`` or ``sbin`` directory) of installed packages."""
    found: list[str] = []
    for package in packages:
        result = subprocess.run(
            ["dpkg", "-L", package], capture_output=True, text=True, check=False, env=_c_env()
        )
        for line in result.stdout.splitlines():
            if re.search(r"/s?bin/[^/]+$", line) and os.path.isfile(line):
                found.append(line)
    return sorted(set(found))


@frozen
class VmImage:
    """A kernel and an initramfs ready to boot."""

    kernel: Path
    initrd: Path
    network: bool


def _copy_file(src: str, root: Path) -> None:
    """Copy ``src`` to the same absolute path under ``root`` (symlinks kept, targets too)."""
    dest = root / src.lstrip("/")
    if dest.exists() or dest.is_symlink():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if os.path.islink(src):
        target = os.readlink(src)
        os.symlink(target, dest)
        resolved = os.path.normpath(os.path.join(os.path.dirname(src), target))
        _copy_file(resolved, root)
    elif os.path.isdir(src):
        shutil.copytree(
            src, dest, symlinks=True, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*_SKIP)
        )
    else:
        shutil.copy2(src, dest)


def _tree_digest(paths: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(set(paths)):
        digest.update(path.encode())
        with contextlib.suppress(OSError):
            st = os.stat(path)
            digest.update(f"{st.st_size}:{int(st.st_mtime)}".encode())
    return digest.hexdigest()[:16]


def build_image(
    *,
    network: bool = False,
    extra_paths: Sequence[str] = (),
    extra_files: Mapping[str, bytes] | None = None,
) -> VmImage:
    """The kernel and an initramfs (built now, or found in the cache).

    ``network`` adds the virtio network modules and configures ``eth0`` for
    qemu user-mode networking. ``extra_paths`` are files or directories of
    this machine copied to the same paths (programs among them get their
    ``ldd`` libraries); ``extra_files`` maps guest paths to contents.
    """
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    kernel_dir = _fetch_kernel(_kernel_package())
    modules = MODULES + (NET_MODULES if network else ())
    init = (
        _INIT.replace("@MODULES@", " ".join(modules))
        .replace("@NET@", "1" if network else "0")
        .replace("@READY@", READY)
    )
    extra = dict(extra_files or {})
    programs = [p for p in _PROGRAMS if os.path.exists(p)] + _package_programs(_PACKAGES)
    busybox = _which("busybox")
    assert busybox is not None
    inputs = [busybox, *programs, *extra_paths, str(kernel_dir)]
    digest = hashlib.sha256()
    digest.update(init.encode())
    digest.update(LVM_CONF.encode())
    digest.update(_tree_digest(inputs).encode())
    for name in sorted(extra):
        digest.update(name.encode() + b"\0" + hashlib.sha256(extra[name]).digest())
    initrd = CACHE_DIR / f"initrd-{digest.hexdigest()[:16]}.cpio"
    if initrd.exists():
        return VmImage(kernel_dir / "vmlinuz", initrd, network)
    log.info("lvmvm: building %s", initrd.name)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR) as tmp:
        root = Path(tmp) / "root"
        for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc/lvm", "proc", "sys", "dev", "root"):
            (root / d).mkdir(parents=True, exist_ok=True)
        shutil.copy2(busybox, root / "bin" / "busybox")
        applets = _run([busybox, "--list-full"]).split()
        for applet in applets:
            link = root / applet
            if not link.exists() and not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                os.symlink("/bin/busybox", link)
        for program in [*programs, *extra_paths]:
            if not os.path.exists(program):
                raise ConfigurationError(f"{program} does not exist on this machine")
            # Replace busybox applets of the same name (util-linux's fsfreeze...)
            # wherever they are on the PATH.
            for bindir in ("bin", "sbin", "usr/bin", "usr/sbin"):
                same = root / bindir / os.path.basename(program)
                if same.is_symlink() and os.readlink(same) == "/bin/busybox":
                    same.unlink()
            _copy_file(program, root)
            for binary in _binaries(program):
                for lib in _libraries(binary):
                    _copy_file(lib, root)
        # The shell is dash, not busybox ash: ash runs its own applets before the
        # PATH's programs, and the Host expects GNU coreutils.
        (root / "bin" / "sh").unlink()
        os.symlink("/usr/bin/dash", root / "bin" / "sh")
        for name in _LVM_LINKS:
            link = root / "sbin" / name
            if link.is_symlink() or link.exists():
                link.unlink()
            os.symlink("lvm", link)
        for name in _PDATA_LINKS:
            link = root / "usr" / "sbin" / name
            if link.is_symlink() or link.exists():
                link.unlink()
            os.symlink("pdata_tools", link)
        for name, alias in (("mkfs.ext4", "mke2fs"), ("mkfs.ext2", "mke2fs")):
            link = root / "usr" / "sbin" / name
            if link.is_symlink() or link.exists():
                link.unlink()
            os.symlink(alias, link)
        moddir = root / "lib" / "modules" / "pgsnap"
        moddir.mkdir(parents=True, exist_ok=True)
        for name, data in _module_files(kernel_dir, modules).items():
            (moddir / f"{name}.ko").write_bytes(data)
        init_path = root / "init"
        init_path.write_text(init)
        init_path.chmod(0o755)
        (root / "etc" / "lvm" / "lvm.conf").write_text(LVM_CONF)
        (root / "etc" / "passwd").write_text(_PASSWD)
        (root / "etc" / "group").write_text(_GROUP)
        (root / "etc" / "shadow").write_text(_SHADOW)
        (root / "etc" / "nsswitch.conf").write_text("passwd: files\ngroup: files\n")
        for guest_path, data in extra.items():
            target = root / guest_path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p != root)
        listing = ("\n".join(names) + "\n").encode()
        partial = initrd.with_suffix(f".partial-{os.getpid()}")  # workers may build at once
        with open(partial, "wb") as out:
            proc = subprocess.run(
                ["cpio", "-o", "-H", "newc", "--quiet"],
                input=listing,
                stdout=out,
                stderr=subprocess.PIPE,
                cwd=root,
                check=False,
            )
        if proc.returncode != 0:
            partial.unlink(missing_ok=True)
            raise HostError(f"cpio failed: {proc.stderr.decode(errors='replace')}", host="local")
        partial.rename(initrd)
    return VmImage(kernel_dir / "vmlinuz", initrd, network)


# --------------------------------------------------------------------------- the console


class _Console:
    """A connection to qemu's serial console (a unix socket), read by a thread into a
    buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()
        self._cond = threading.Condition()
        self._eof = False
        self._thread = threading.Thread(target=self._read, name="lvmvm-console", daemon=True)
        self._thread.start()

    @classmethod
    def connect(cls, path: str | os.PathLike[str], *, timeout: float = 10.0) -> _Console:
        """Connect to the console socket at ``path`` (retrying while qemu creates it)."""
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(os.fspath(path))
                return cls(sock)
            except OSError as exc:
                sock.close()
                if time.monotonic() > deadline:
                    raise HostUnreachable(
                        f"cannot connect to the test VM's console {path}: {exc}", host="lvmvm"
                    ) from exc
                time.sleep(0.05)

    def _read(self) -> None:
        while True:
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                chunk = b""
            with self._cond:
                if not chunk:
                    self._eof = True
                    self._cond.notify_all()
                    return
                self._buf.extend(chunk)
                self._cond.notify_all()

    def write(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise HostUnreachable(
                "the test VM's console is closed (qemu exited or the console was released)",
                host="lvmvm",
            ) from exc

    def close(self) -> None:
        """Disconnect (qemu keeps running and accepts the next connection)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)

    def wait_for(
        self, pattern: re.Pattern[bytes], deadline: float, *, until: bytes = b""
    ) -> re.Match[bytes] | None:
        """Wait for ``pattern`` in the unread output; consume through the match.
        ``until``: a text the match ends with, looked for first in what is new (a
        large output is not searched again at every block that arrives)."""
        seen = 0
        with self._cond:
            while True:
                if until:
                    found = self._buf.find(until, max(0, seen - len(until)))
                    seen = len(self._buf)
                    if found < 0 and not self._eof:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return None
                        self._cond.wait(min(left, 1.0))
                        continue
                data = bytes(self._buf)  # a match on the bytearray would see it change
                match = pattern.search(data)
                if match is not None:
                    del self._buf[: match.end()]
                    return match
                if self._eof:
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))

    def tail(self, size: int = 2000) -> str:
        with self._cond:
            return bytes(self._buf[-size:]).decode("utf-8", "replace")

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._eof


_SPOOL_MIN: Final = 256 * 1024
"""Bytes of standard input above which it goes through the spool."""
_LINE_MAX: Final = 1024
"""Longest line typed on the console (the tty's line buffer holds 4095 bytes)."""
_MARK: Final = "__PGSNAP"
_PADDING: Final = 16
_SLACK: Final = 30.0
"""Seconds the VM gets beyond a command's timeout before it is taken for hung."""


class ConsoleRunner:
    """A :class:`~pgsnap.protocols.Runner` whose commands run on the test VM's console.

    Built by :class:`LvmVm`, or by :meth:`attach` in another process. Commands
    are argument lists, quoted with :func:`shlex.join` and run by the VM's
    shell (``user`` through busybox ``su``); standard output and error come
    back separately, byte for byte. A command that outlives ``timeout`` is
    killed in the VM and raises :class:`~pgsnap.errors.CommandTimeout`; a VM
    that stops answering raises :class:`~pgsnap.errors.HostUnreachable`.
    Thread-safe (commands take turns). The console takes one connection at a
    time: :meth:`released` lends it to another process.
    """

    def __init__(self, console: _Console, *, name: str = "lvmvm", path: str | None = None) -> None:
        self._console = console
        self._name = name
        self._path = path
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._work = f"/tmp/.pgsnap-{secrets.token_hex(6)}"  # noqa: S108 - the VM's tmpfs
        self.spool: str | None = None
        """A directory shared with the guest at the same path (set by :class:`LvmVm`):
        standard output, and a large standard input, go through files there instead
        of the console (a tar stream of a data directory: tens of MB, which base64 on
        a serial line would take many minutes to carry)."""

    @classmethod
    def attach(cls, path: str | os.PathLike[str], *, name: str = "lvmvm") -> ConsoleRunner:
        """A runner on a running VM's console socket (:attr:`LvmVm.console_path`), from
        any process, while the VM's own runner is :meth:`released`."""
        return cls(_Console.connect(path), name=name, path=os.fspath(path))

    def close(self) -> None:
        """Disconnect from the console (the VM keeps running)."""
        with self._lock:
            self._console.close()

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """Disconnect for the ``with`` block (another process may :meth:`attach`
        meanwhile, between two of its commands) and connect again after it."""
        if self._path is None:
            raise ConfigurationError("this console runner has no socket to reconnect to")
        with self._lock:
            self._console.close()
            try:
                yield
            finally:
                self._console = _Console.connect(self._path)
                self._broken = None

    def __repr__(self) -> str:
        return f"<ConsoleRunner {self._name}>"

    @property
    def description(self) -> str:
        """``"vm console <name>"``."""
        return f"vm console {self._name}"

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        """Run ``argv`` in the VM (see the class docstring)."""
        args = _check_argv(argv)
        with self._lock:
            if self._broken is not None:
                raise HostUnreachable(
                    f"the test VM stopped answering earlier: {self._broken}",
                    host=self.description,
                )
            return self._run(args, user=user, stdin=stdin, timeout=timeout)

    def _type(self, line: str) -> None:
        # Empty lines after the command: qemu's emulated 16550 hands the guest the
        # bytes below its FIFO trigger level only when more arrive (observed: the
        # last bytes of a line waited for the next command), so push them through.
        self._console.write(line.encode() + b"\n" * (1 + _PADDING))

    def _await(
        self, pattern: re.Pattern[bytes], deadline: float, what: str, *, until: bytes = b""
    ) -> re.Match[bytes]:
        match = self._console.wait_for(pattern, deadline, until=until)
        if match is None:
            self._broken = f"no answer to {what}"
            raise HostUnreachable(
                f"the test VM did not answer {what} "
                f"({'qemu exited' if self._console.closed else 'timed out'}); console tail: "
                f"{self._console.tail(600)!r}",
                host=self.description,
            )
        return match

    def _ship(
        self,
        command: str,
        stdin: bytes | None,
        work: str,
        tag: str,
        deadline: float,
        seconds: int,
        source: str = "/dev/null",
        sink: str = "",
    ) -> str:
        """Send the command (and stdin) as files; the line that runs them.

        Base64 in acknowledged chunks: no line is longer than the tty allows, and
        nothing the caller wrote is typed as is.
        """
        payloads: list[tuple[str, bytes]] = [("cmd", command.encode())]
        if stdin is not None:
            payloads.append(("in", stdin))
        n = 0
        for suffix, data in payloads:
            encoded = base64.b64encode(data).decode() or ""
            chunks = [encoded[i : i + _LINE_MAX] for i in range(0, len(encoded), _LINE_MAX)]
            if not chunks:
                chunks = [""]
            for i, chunk in enumerate(chunks):
                n += 1
                redirect = ">" if i == 0 else ">>"
                self._type(
                    f"printf %s '{chunk}' {redirect}{work}.{suffix}64; "
                    f'echo {_MARK}""_ACK_{tag}_{n}__'
                )
                self._await(re.compile(rf"{_MARK}_ACK_{tag}_{n}__".encode()), deadline, "a chunk")
        stdin_redirect = f"{work}.in" if stdin is not None else source
        return (
            f"base64 -d {work}.cmd64 > {work}.cmd; "
            + (f"base64 -d {work}.in64 > {work}.in; " if stdin is not None else "")
            + f"timeout -s KILL {seconds} sh {work}.cmd <{stdin_redirect} "
            f">{sink or work + '.out'} 2>{work}.err"
        )

    def _run(
        self,
        args: tuple[str, ...],
        *,
        user: str | None,
        stdin: bytes | None,
        timeout: float,
    ) -> CommandResult:
        tag = secrets.token_hex(6)
        work = self._work  # the VM's private tmpfs; overwritten by each command
        deadline = time.monotonic() + timeout + _SLACK
        command = shlex.join(args)
        if user is not None:
            if not user or user.startswith("-") or not re.fullmatch(r"[a-z_][a-z0-9_-]*", user):
                raise ConfigurationError(f"invalid OS user name {user!r}")
            command = f"su -s /bin/sh {user} -c {shlex.quote(command)}"
        seconds = max(1, int(timeout + 0.999))
        spooled_in = spooled_out = None
        if self.spool is not None:
            spooled_out = os.path.join(self.spool, f".console-{tag}.out")
            if stdin is not None and len(stdin) > _SPOOL_MIN:
                spooled_in = os.path.join(self.spool, f".console-{tag}.in")
                with open(spooled_in, "wb") as f:
                    f.write(stdin)
                stdin = None
        source = spooled_in or "/dev/null"
        sink = spooled_out or f"{work}.out"
        if stdin is None and _typeable(command):
            # Plain printable ASCII (shlex-quoted: the shell reading the console parses
            # it as sh would the file): typed as it is, no file, no extra processes.
            # Every process costs tens of milliseconds under TCG.
            run = f"timeout -s KILL {seconds} {command} <{source} >{sink} 2>{work}.err"
        else:
            run = self._ship(command, stdin, work, tag, deadline, seconds, source, sink)
        # With a spool, the output is in the shared directory already: nothing to print
        # (and no base64 process), read here from the file.
        out = f"[ -s {work}.out ] && base64 {work}.out; " if spooled_out is None else ""
        script = (
            f"{run}; rc=$?; "
            f'echo {_MARK}""_OUT_{tag}; {out}'
            f'echo {_MARK}""_ERR_{tag}; [ -s {work}.err ] && base64 {work}.err; '
            f'echo {_MARK}""_RC_{tag}=$rc'
        )
        started = time.monotonic()
        log.debug("%s: running %s", self.description, command)
        self._type(script)
        pattern = re.compile(
            rf"{_MARK}_OUT_{tag}\s*\n(.*?){_MARK}_ERR_{tag}\s*\n(.*?){_MARK}_RC_{tag}=(\d+)".encode(),
            re.S,
        )
        try:
            match = self._await(
                pattern, deadline, shlex.join(args)[:200], until=f"{_MARK}_RC_{tag}=".encode()
            )
            if spooled_out is not None:
                try:
                    with open(spooled_out, "rb") as f:
                        stdout = f.read()
                except FileNotFoundError:  # the shell could not even redirect
                    stdout = b""
            else:
                stdout = _unb64(match.group(1))
        finally:
            for path in (spooled_in, spooled_out):
                if path is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        stderr = _unb64(match.group(2))
        rc = int(match.group(3))
        elapsed = time.monotonic() - started
        if rc == 137 and elapsed >= timeout:
            raise CommandTimeout(
                f"{shlex.join(args)} did not finish within {timeout:g} s and was killed",
                argv=args,
                returncode=-1,
                stderr=stderr.decode("utf-8", "replace")[-2000:],
                host=self.description,
                hint="raise the timeout if the command is just slow (TCG emulation is slow)",
                timeout=timeout,
            )
        log.debug("%s: %s exited with status %d (%.2f s)", self.description, args[0], rc, elapsed)
        return CommandResult(args, rc, stdout, stderr)


def _typeable(command: str) -> bool:
    """True when ``command`` can be typed on the console as it is: printable ASCII
    only (no byte the tty would take for a control character) and short enough for
    one line of the tty's canonical mode (4095 bytes with the rest of the line)."""
    return len(command) <= _LINE_MAX * 2 and all(" " <= c <= "~" for c in command)


def _unb64(text: bytes) -> bytes:
    cleaned = re.sub(rb"[^A-Za-z0-9+/=]", b"", text)
    return base64.b64decode(cleaned)


def _check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    if isinstance(argv, str | bytes):
        raise ConfigurationError("a command is an argument list, not a string")
    values = tuple(argv)
    if not values or not values[0]:
        raise ConfigurationError("cannot run an empty command")
    for value in values:
        if not isinstance(value, str):
            raise ConfigurationError(f"command arguments must be str, got {type(value).__name__}")
        if "\0" in value:
            raise ConfigurationError("a command argument contains a NUL byte")
    return values


# --------------------------------------------------------------------------- the VM


def virtiofsd_path() -> str | None:
    """qemu's ``virtiofsd`` on this machine (None: not installed)."""
    for path in ("/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd"):
        if os.access(path, os.X_OK):
            return path
    return _which("virtiofsd")


def _start_virtiofsd(directory: str, sock: Path) -> subprocess.Popen[bytes]:
    """qemu's virtiofsd serving ``directory`` on ``sock``; returns once the socket exists."""
    program = virtiofsd_path()
    assert program is not None
    argv = [
        program,
        f"--socket-path={sock}",
        "-o",
        f"source={directory}",
        "-o",
        "cache=none",
        "-o",
        "sandbox=chroot",  # namespaces may be unavailable in a container
    ]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop([proc])
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise HostError(f"virtiofsd for {directory} did not start: {out[-800:]}", host="local")
        time.sleep(0.02)
    return proc


def _stop(daemons: Iterable[subprocess.Popen[bytes]]) -> None:
    for proc in daemons:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=5)
        if proc.stdout is not None:
            with contextlib.suppress(OSError):
                proc.stdout.close()


class LvmVm:
    """A running test VM: qemu, its disk image, its console runner and :attr:`host`.

    Build it with :meth:`boot`; :meth:`close` (also at the end of a ``with``
    block) powers it off, kills qemu if it does not exit, and removes the
    disk image. It never raises; it logs what it could not undo.
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        workdir: Path,
        console: _Console,
        *,
        port: int | None,
        disk: Path,
        daemons: Sequence[subprocess.Popen[bytes]] = (),
        shared: Sequence[str] = (),
    ) -> None:
        self._daemons = tuple(daemons)
        self._shared = tuple(shared)
        self._proc = proc
        self._workdir = workdir
        self._console_path = str(workdir / "console.sock")
        self._runner = ConsoleRunner(console, path=self._console_path)
        self._host = Host(self._runner, name="pgsnap-lvmvm")
        self._port = port
        self._extra_ports: tuple[int, ...] = ()
        self._disk = disk
        self._closed = False

    @classmethod
    def boot(
        cls,
        *,
        disk_size: int = 4 << 30,
        memory_mb: int = 1024,
        cpus: int = 1,
        forward_port: bool = False,
        extra_ports: int = 0,
        extra_paths: Sequence[str] = (),
        extra_files: Mapping[str, bytes] | None = None,
        share: Sequence[str | os.PathLike[str]] = (),
        boot_timeout: float = 180.0,
    ) -> Self:
        """Build (or reuse) the image and boot it; return once the console answers.

        ``disk_size``: the sparse raw image the VM sees as ``/dev/vda``.
        ``cpus``: the guest's vCPUs, one by default. Under TCG every vCPU is a busy
        thread of this machine: the suite's two LVM test groups, a VM each side by
        side on 2 CPUs, took 548 s with two vCPUs each and 382 s with one (the two
        groups alone, 2026-12-07).
        ``forward_port``: qemu user-mode networking, cut off from every network
        (``restrict=on``) except :attr:`port` on 127.0.0.1, forwarded to the
        guest's port 5432; and ``extra_ports`` more ports forwarded each to the same
        number in the guest (:attr:`extra_ports`: for a second server there, a clone's).
        ``share``: directories of this machine mounted in the guest at the same
        absolute paths (virtiofs, ``cache=none``: each side sees the other's
        writes at once), so a WAL archive the guest's ``archive_command``
        writes is the archive pgsnap reads here. Needs ``virtiofsd`` (qemu's,
        in qemu-system-common) and root.
        """
        reason = lvmvm_unavailable()
        if reason is not None:
            raise ConfigurationError(f"cannot boot the lvm2 test VM: {reason}")
        shared = [os.path.abspath(os.fspath(d)) for d in share]
        for directory in shared:
            if not os.path.isdir(directory):
                raise ConfigurationError(f"cannot share {directory} with the VM: not a directory")
        if shared and virtiofsd_path() is None:
            raise ConfigurationError(
                "cannot share directories with the VM: no virtiofsd "
                "(apt-get install qemu-system-common)"
            )
        image = build_image(network=forward_port, extra_paths=extra_paths, extra_files=extra_files)
        workdir = Path(tempfile.mkdtemp(prefix="pgsnap-lvmvm-"))
        disk = workdir / "disk.img"
        with open(disk, "wb") as fh:
            fh.truncate(disk_size)
        port = free_port() if forward_port else None
        extras: list[int] = []
        while port is not None and len(extras) < extra_ports:
            candidate = free_port()
            if candidate != port and candidate not in extras:
                extras.append(candidate)
        daemons: list[subprocess.Popen[bytes]] = []
        share_args: list[str] = []
        for i, directory in enumerate(shared):
            sock = workdir / f"fs{i}.sock"
            daemons.append(_start_virtiofsd(directory, sock))
            share_args += [
                "-chardev",
                f"socket,id=fs{i},path={sock}",
                "-device",
                f"vhost-user-fs-pci,queue-size=1024,chardev=fs{i},tag=pgsnap{i}",
            ]
        if shared:  # vhost-user needs the guest's memory shared with virtiofsd
            share_args += [
                "-object",
                f"memory-backend-memfd,id=mem,size={memory_mb}M,share=on",
                "-numa",
                "node,memdev=mem",
            ]
        argv = [
            "qemu-system-x86_64",
            "-accel",
            "tcg",
            "-cpu",
            "max",
            "-smp",
            str(cpus),
            "-m",
            str(memory_mb),
            "-display",
            "none",
            "-monitor",
            "none",
            "-chardev",
            f"socket,id=console,path={workdir / 'console.sock'},server=on,wait=on",
            "-serial",
            "chardev:console",
            "-no-reboot",
            "-kernel",
            str(image.kernel),
            "-initrd",
            str(image.initrd),
            "-append",
            "console=ttyS0 quiet panic=-1",
            "-drive",
            f"file={disk},if=virtio,format=raw,cache=unsafe",
        ]
        if port is not None:
            argv += [
                "-nic",
                f"user,restrict=on,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{port}-:5432"
                + "".join(f",hostfwd=tcp:127.0.0.1:{p}-:{p}" for p in extras),
            ]
        else:
            argv += ["-nic", "none"]
        argv += share_args
        log.info("lvmvm: booting %s", shlex.join(argv))
        try:
            with open(workdir / "qemu.log", "wb") as qemu_log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=qemu_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            console = _Console.connect(workdir / "console.sock", timeout=30)
        except BaseException:
            if "proc" in locals():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=10)
            _stop(daemons)
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        vm = cls(proc, workdir, console, port=port, disk=disk, daemons=daemons, shared=shared)
        vm._extra_ports = tuple(extras)
        try:
            ready = console.wait_for(
                re.compile(rb"(PGSNAP_VM_MODULE_FAILED \S+)|" + READY.encode()),
                time.monotonic() + boot_timeout,
            )
            if ready is None or ready.group(1) is not None:
                what = ready.group(1).decode() if ready is not None and ready.group(1) else None
                raise HostUnreachable(
                    f"the lvm2 test VM did not boot: {what or 'no ready line'}; console tail: "
                    f"{console.tail(1500)!r}; qemu: {vm.qemu_log()[-800:]!r}",
                    host="lvmvm",
                )
            result = vm.runner.run(["true"], timeout=30)
            if not result.ok:
                raise HostUnreachable("the test VM's console shell does not answer", host="lvmvm")
            for i, directory in enumerate(shared):
                vm.runner.run(["mkdir", "-p", directory], timeout=30).check(host="lvmvm")
                vm.runner.run(
                    ["mount", "-t", "virtiofs", f"pgsnap{i}", directory], timeout=60
                ).check(what=f"mounting the shared {directory}", host="lvmvm")
            if shared:
                vm.runner.spool = shared[0]
        except BaseException:
            vm.close()
            raise
        return vm

    @property
    def runner(self) -> ConsoleRunner:
        """The console command channel (a :class:`~pgsnap.protocols.Runner`)."""
        return self._runner

    @property
    def host(self) -> Host:
        """A :class:`~pgsnap.host.Host` on the VM (named ``"pgsnap-lvmvm"``)."""
        return self._host

    @property
    def port(self) -> int | None:
        """The host port forwarded to the guest's 5432 (None without networking)."""
        return self._port

    @property
    def extra_ports(self) -> tuple[int, ...]:
        """Ports forwarded from 127.0.0.1 here to the same port in the guest."""
        return self._extra_ports

    @property
    def disk(self) -> Path:
        """The raw disk image (the guest's ``/dev/vda``)."""
        return self._disk

    @property
    def console_path(self) -> str:
        """The console's unix socket: :meth:`ConsoleRunner.attach` connects to it from
        another process while ``vm.runner.released()``."""
        return self._console_path

    def qemu_log(self) -> str:
        """What qemu itself printed (its errors; the guest's console is the socket)."""
        try:
            return (self._workdir / "qemu.log").read_text(errors="replace")
        except OSError:
            return ""

    @property
    def shared(self) -> tuple[str, ...]:
        """The directories of this machine mounted at the same paths in the guest."""
        return self._shared

    @property
    def alive(self) -> bool:
        """True while qemu runs."""
        return self._proc.poll() is None

    def close(self) -> None:
        """Power off, kill qemu if needed, remove the disk image; never raises."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._proc.poll() is None:
                with contextlib.suppress(Exception):
                    self._runner._console.write(b"sync; poweroff -f\n")
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self._proc.pid, 9)
                    self._proc.wait(timeout=10)
        except Exception:
            log.warning("lvmvm: could not stop qemu (pid %d)", self._proc.pid, exc_info=True)
        with contextlib.suppress(Exception):
            self._runner._console.close()
        _stop(self._daemons)
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<LvmVm pid={self._proc.pid} port={self._port} alive={self.alive}>"
