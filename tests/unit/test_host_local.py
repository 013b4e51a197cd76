"""The Host seam on this machine: LocalRunner and every Host method on real files.

Nothing is faked: commands run with subprocess, files live in fresh temp
directories under /tmp. The Host checks are classes (``TestHostFiles``,
``TestHostProcesses``) whose ``host`` fixture tests/integration/test_ssh.py
overrides, so the very same checks also run through an SshRunner.

Several checks need root (running as ``postgres``, chown); this machine kind
runs the tests as root. Without root they skip, or fail when
``PGSNAP_REQUIRE_POSTGRES=1`` (CI: everything must run).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgsnap.errors import (
    CommandError,
    CommandTimeout,
    ConfigurationError,
    HostError,
    HostFileNotFound,
    InputError,
)
from pgsnap.host import CommandResult, FileKind, Host, LocalRunner

from ..conftest import postgres_required

NAMES = ["plain", "with space", "new\nline", "-dash", "ünïcode", "tab\there", "*glob?[x]"]
"""File names that break naive shell strings and line-based parsing."""


def require_root() -> None:
    if os.geteuid() != 0:
        if postgres_required():
            pytest.fail("this test needs root (PGSNAP_REQUIRE_POSTGRES=1)", pytrace=False)
        pytest.skip("needs root")


def postgres_ids() -> tuple[int, int]:
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


@contextlib.contextmanager
def public_directory() -> Iterator[Path]:
    """A fresh directory under /tmp that every user may enter (unlike tmp_path)."""
    path = Path(tempfile.mkdtemp(prefix="pgsnap-host-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A fresh directory under /tmp that every user may enter, removed afterwards."""
    with public_directory() as path:
        yield path


def spawn(argv: list[str], **kwargs) -> subprocess.Popen[bytes]:
    """A background process, with a moment to exec (its /proc entry settles)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kwargs)
    time.sleep(0.2)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


# --------------------------------------------------------------------------- LocalRunner


def test_exit_status_and_output_as_bytes():
    result = LocalRunner().run(["sh", "-c", "printf 'out\\377'; echo err >&2; exit 3"])
    assert result.argv == ("sh", "-c", "printf 'out\\377'; echo err >&2; exit 3")
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out\xff", b"err\n")
    assert not result.ok
    assert result.text == "out\udcff"
    assert result.error_text == "err"
    assert CommandResult(["true"], 0).argv == ("true",) and CommandResult(["true"], 0).ok


def test_stdin_is_fed_verbatim_and_closed_otherwise():
    data = bytes(range(256)) * 1000
    assert LocalRunner().run(["cat"], stdin=data).stdout == data
    # No stdin: it is closed, so cat ends at once instead of waiting on a terminal.
    assert LocalRunner().run(["cat"], timeout=10).stdout == b""


def test_runs_in_root_directory_with_c_locale():
    assert LocalRunner().run(["pwd"]).stdout == b"/\n"
    env = LocalRunner().run(["sh", "-c", 'printf %s "$LC_ALL"'])
    assert env.stdout == b"C"


def test_missing_program_exits_127_like_a_shell():
    for argv in (["pgsnap-no-such-program"], ["/nonexistent/dir/program", "x"]):
        result = LocalRunner().run(argv)
        assert result.returncode == 127
        assert argv[0] in result.error_text


def test_program_that_cannot_execute_exits_126(public_dir):
    script = public_dir / "not-executable"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    assert LocalRunner().run([str(script)]).returncode == 126


def test_timeout_kills_the_whole_process_group(public_dir):
    pidfile = public_dir / "child.pid"
    argv = ["sh", "-c", 'sleep 60 & echo $! > "$1"; wait', "sh", str(pidfile)]
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        LocalRunner().run(argv, timeout=0.5)
    assert time.monotonic() - started < 5
    err = info.value
    assert (err.argv, err.returncode, err.host, err.details["timeout"]) == (
        tuple(argv),
        -1,
        "local",
        0.5,
    )
    assert isinstance(err, CommandError)
    # The grandchild (sleep) died with its group: gone, or a zombie nobody reaped yet.
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while (info_ := Host().process(child)) is not None and not info_.zombie:
        assert time.monotonic() < deadline, f"{info_} survived the timeout"
        time.sleep(0.05)


def test_runs_as_another_user_through_runuser():
    require_root()
    runner = LocalRunner()
    assert runner.run(["id", "-un"], user="postgres").stdout == b"postgres\n"
    assert runner.run(["id", "-un"], user="root").stdout == b"root\n"  # ourselves: directly
    assert runner.run(["cat"], user="postgres", stdin=b"x\n").stdout == b"x\n"
    assert runner.run(["pgsnap-no-such-program"], user="postgres").returncode == 127


def test_runs_as_another_user_through_setpriv_without_runuser(monkeypatch):
    require_root()
    real_which = shutil.which

    def which_without_runuser(name, *args, **kwargs):
        return None if name == "runuser" else real_which(name, *args, **kwargs)

    monkeypatch.setattr("pgsnap.host.runners.shutil.which", which_without_runuser)
    result = LocalRunner().run(["id", "-un"], user="postgres")
    assert result.stdout == b"postgres\n"
    groups = LocalRunner().run(["id", "-g"], user="postgres").stdout
    assert int(groups) == postgres_ids()[1]


def test_unknown_user_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="does not exist"):
        LocalRunner().run(["true"], user="pgsnap-no-such-user")


def test_command_must_be_a_list():
    with pytest.raises(ConfigurationError, match="argument list"):
        LocalRunner().run("rm -rf /tmp/x")  # a Sequence[str] to mypy: refused at run time
    with pytest.raises(ConfigurationError):
        LocalRunner().run([])


def test_check_raises_command_error_with_the_end_of_stderr():
    ok = LocalRunner().run(["true"])
    assert ok.check() is ok
    failed = LocalRunner().run(["sh", "-c", "echo first >&2; echo last words >&2; exit 4"])
    with pytest.raises(CommandError) as info:
        failed.check(host="local")
    err = info.value
    assert str(err).startswith("sh -c 'echo first >&2; echo last words >&2; exit 4' failed with")
    assert "exit status 4: first\nlast words" in err.message
    assert (err.returncode, err.host, err.stderr) == (4, "local", "first\nlast words")
    with pytest.raises(CommandError, match=r"^copying the label failed with exit status 4"):
        failed.check(what="copying the label")
    with pytest.raises(CommandError) as missing:
        LocalRunner().run(["pgsnap-no-such-program"]).check()
    assert "installed" in str(missing.value.hint)


def test_host_run_checks_by_default():
    host = Host()
    assert host.run(["sh", "-c", "exit 3"], check=False).returncode == 3
    with pytest.raises(CommandError) as info:
        host.run(["sh", "-c", "exit 3"])
    assert info.value.host == "local"
    assert host.description == "local"
    assert "via local" in repr(host)


# --------------------------------------------------------------------------- Host: files


class TestHostFiles:
    """Files through a Host; tests/integration/test_ssh.py runs them over ssh too."""

    @pytest.fixture
    def host(self) -> Host:
        return Host(LocalRunner())

    def test_read_bytes_offsets_and_limits(self, host, public_dir):
        data = bytes(range(256)) * 400  # 102400 bytes: more than one dd block
        path = public_dir / "data file"
        path.write_bytes(data)
        assert host.read_bytes(str(path)) == data
        assert host.read_bytes(str(path), offset=1000, limit=300) == data[1000:1300]
        assert host.read_bytes(str(path), offset=70000) == data[70000:]
        assert host.read_bytes(str(path), limit=70001) == data[:70001]
        assert host.read_bytes(str(path), offset=len(data) - 1, limit=10) == data[-1:]
        assert host.read_bytes(str(path), offset=len(data) + 5) == b""
        assert host.read_bytes(str(path), limit=0) == b""
        with pytest.raises(InputError):
            host.read_bytes(str(path), offset=-1)

    def test_read_bytes_of_awkward_names_and_text(self, host, public_dir):
        for name in NAMES:
            path = public_dir / name
            path.write_bytes(name.encode() + b"\xff\x00end")
            assert host.read_bytes(str(path)) == name.encode() + b"\xff\x00end"
            assert host.read_text(str(path)) == name + "\udcff\x00end"

    def test_read_bytes_of_a_missing_file(self, host, public_dir):
        missing = str(public_dir / "missing")
        with pytest.raises(HostFileNotFound) as info:
            host.read_bytes(missing)
        assert (info.value.path, info.value.host) == (missing, host.description)
        with pytest.raises(HostFileNotFound):
            host.read_bytes(str(public_dir / "missing" / "below"))

    def test_read_bytes_without_permission_says_so(self, host, public_dir):
        require_root()
        secret = public_dir / "root-only"
        secret.write_bytes(b"x")
        secret.chmod(0o600)
        with pytest.raises(CommandError) as info:
            host.read_bytes(str(secret), user="postgres")
        assert not isinstance(info.value, HostFileNotFound)
        assert "Permission denied" in info.value.stderr
        assert "user=" in str(info.value.hint)
        os.chown(secret, *postgres_ids())
        assert host.read_bytes(str(secret), user="postgres") == b"x"

    def test_stat_files_directories_links(self, host, public_dir):
        require_root()
        path = public_dir / "new\nline file"
        path.write_bytes(b"12345")
        path.chmod(0o640)
        os.chown(path, *postgres_ids())
        info = host.stat(str(path))
        assert info is not None
        assert (info.path, info.kind, info.size, info.mode) == (
            str(path),
            FileKind.FILE,
            5,
            0o640,
        )
        assert (info.uid, info.gid, info.owner) == (*postgres_ids(), "postgres")

        directory = host.stat(str(public_dir))
        assert directory is not None
        assert (directory.kind, directory.mode, directory.owner) == (
            FileKind.DIRECTORY,
            0o755,
            "root",
        )

        link = public_dir / "link"
        link.symlink_to(path)
        followed = host.stat(str(link))
        assert followed is not None and followed.kind is FileKind.FILE and followed.size == 5
        itself = host.stat(str(link), follow=False)
        assert itself is not None and itself.kind is FileKind.SYMLINK

        dangling = public_dir / "dangling"
        dangling.symlink_to(public_dir / "nowhere")
        assert host.stat(str(dangling)) is None
        dangling_itself = host.stat(str(dangling), follow=False)
        assert dangling_itself is not None and dangling_itself.kind is FileKind.SYMLINK
        assert host.stat(str(public_dir / "missing")) is None
        null = host.stat("/dev/null")
        assert null is not None and null.kind is FileKind.OTHER

    def test_stat_owner_without_a_name_is_the_uid(self, host, public_dir):
        require_root()
        path = public_dir / "orphan"
        path.write_bytes(b"")
        os.chown(path, 54321, 54321)
        info = host.stat(str(path))
        assert info is not None and (info.uid, info.owner) == (54321, "54321")

    def test_exists(self, host, public_dir):
        for name in NAMES:
            (public_dir / name).write_bytes(b"")
            assert host.exists(str(public_dir / name))
        assert not host.exists(str(public_dir / "missing"))
        (public_dir / "dangling").symlink_to(public_dir / "nowhere")
        assert not host.exists(str(public_dir / "dangling"))
        assert host.exists(str(public_dir))

    def test_realpath(self, host, public_dir):
        target = public_dir / "real dir\nx"
        target.mkdir()
        (public_dir / "link").symlink_to(target)
        assert host.realpath(str(public_dir / "link")) == str(target)
        assert host.realpath(str(public_dir / "link" / "not" / "yet")) == f"{target}/not/yet"
        assert host.realpath(f"{public_dir}/./link/../link/") == str(target)

    def test_realpaths_resolves_several_in_one_command(self, host, public_dir):
        target = public_dir / "real dir\nx"
        target.mkdir()
        (public_dir / "link").symlink_to(target)
        paths = [str(public_dir / "link"), f"{public_dir}/link/not/yet", str(public_dir), "/"]
        assert host.realpaths(paths) == tuple(host.realpath(p) for p in paths)
        assert host.realpaths([]) == ()

    def test_list_dir_names_with_any_character(self, host, public_dir):
        for name in NAMES:
            (public_dir / name).write_bytes(b"")
        (public_dir / "sub dir").mkdir()
        os.close(os.open(os.fsencode(public_dir) + b"/bad\xffname", os.O_CREAT | os.O_WRONLY))
        expected = sorted(os.listdir(public_dir))
        assert "bad\udcffname" in expected
        assert host.list_dir(str(public_dir)) == tuple(expected)
        (public_dir / "sub dir" / "inner").write_bytes(b"")
        assert host.list_dir(str(public_dir / "sub dir")) == ("inner",)
        (public_dir / "link to sub").symlink_to(public_dir / "sub dir")
        assert host.list_dir(str(public_dir / "link to sub")) == ("inner",)
        (public_dir / "empty").mkdir()
        assert host.list_dir(str(public_dir / "empty")) == ()

    def test_list_dir_of_missing_or_not_a_directory(self, host, public_dir):
        with pytest.raises(HostFileNotFound) as info:
            host.list_dir(str(public_dir / "missing"))
        assert info.value.host == host.description
        (public_dir / "file").write_bytes(b"")
        with pytest.raises(HostError, match="not a directory") as not_dir:
            host.list_dir(str(public_dir / "file"))
        assert not isinstance(not_dir.value, HostFileNotFound)

    def test_list_dirs_lists_several_at_once(self, host, public_dir):
        (public_dir / "a").mkdir()
        (public_dir / "a" / "x\ny z").write_bytes(b"")
        (public_dir / "a" / "sub").mkdir()
        (public_dir / "b").mkdir()
        (public_dir / "link").symlink_to(public_dir / "a")
        a, b, link = (str(public_dir / n) for n in ("a", "b", "link"))
        missing = str(public_dir / "missing")
        assert host.list_dirs([a, b, link, missing, a]) == {
            a: ("sub", "x\ny z"),
            b: (),
            link: ("sub", "x\ny z"),
            missing: None,
        }
        assert host.list_dirs([a, b]) == {a: host.list_dir(a), b: ()}
        assert host.list_dirs([]) == {}
        (public_dir / "file").write_bytes(b"")
        with pytest.raises(HostError, match="not a directory"):
            host.list_dirs([a, str(public_dir / "file")])

    def test_write_atomic_creates_with_mode_and_owner(self, host, public_dir):
        require_root()
        for name in NAMES:
            path = public_dir / name
            host.write_atomic(
                str(path), b"label\x00\xff" + name.encode(), mode=0o640, owner="postgres"
            )
            assert path.read_bytes() == b"label\x00\xff" + name.encode()
            st = path.stat()
            assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o640, *postgres_ids())
        path = public_dir / "numeric"
        host.write_atomic(str(path), b"", owner="54321:54322")
        st = path.stat()
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid, st.st_size) == (0o600, 54321, 54322, 0)
        assert sorted(os.listdir(public_dir)) == sorted([*NAMES, "numeric"])  # no temp files

    def test_write_atomic_replaces_by_rename(self, host, public_dir):
        path = public_dir / "label"
        path.write_bytes(b"old")
        before = path.stat().st_ino
        host.write_atomic(str(path), b"new")
        assert path.read_bytes() == b"new"
        assert path.stat().st_ino != before  # a new file renamed over the old one

    def test_write_atomic_readers_see_old_or_new_never_partial(self, host, public_dir):
        path = public_dir / "big"
        versions = [bytes([65 + i]) * (1 << 20) for i in range(4)]
        path.write_bytes(versions[0])
        seen: list[bytes] = []
        done = threading.Event()

        def reader() -> None:
            while not done.is_set():
                seen.append(path.read_bytes())

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            for i in range(12):
                host.write_atomic(str(path), versions[i % 4])
        finally:
            done.set()
            thread.join()
        assert seen
        assert all(content in versions for content in seen)

    def test_write_atomic_replaces_a_symlink_not_its_target(self, host, public_dir):
        target = public_dir / "target"
        target.write_bytes(b"keep")
        link = public_dir / "link"
        link.symlink_to(target)
        host.write_atomic(str(link), b"new")
        assert not link.is_symlink() and link.read_bytes() == b"new"
        assert target.read_bytes() == b"keep"

    def test_write_atomic_failures_leave_no_temporary_file(self, host, public_dir):
        with pytest.raises(HostFileNotFound):
            host.write_atomic(str(public_dir / "missing dir" / "f"), b"x")
        (public_dir / "a dir").mkdir()
        with pytest.raises(CommandError):
            host.write_atomic(str(public_dir / "a dir"), b"x")
        assert os.listdir(public_dir) == ["a dir"]
        assert os.listdir(public_dir / "a dir") == []

    def test_remove_files_and_missing_ones(self, host, public_dir):
        paths = [public_dir / name for name in NAMES]
        for path in paths:
            path.write_bytes(b"")
        host.remove([str(p) for p in paths] + [str(public_dir / "missing")])
        assert os.listdir(public_dir) == []
        host.remove([])

    def test_remove_never_follows_a_symlink(self, host, public_dir):
        target = public_dir / "target dir"
        target.mkdir()
        (target / "precious").write_bytes(b"data")
        for i, spelling in enumerate(["{}", "{}/", "{}//"]):
            link = public_dir / f"link{i}"
            link.symlink_to(target)
            host.remove([spelling.format(link)], recursive=True)
            assert not link.is_symlink()
            assert (target / "precious").read_bytes() == b"data"
        file_link = public_dir / "file link"
        file_link.symlink_to(target / "precious")
        host.remove([str(file_link)])
        assert not file_link.is_symlink() and (target / "precious").exists()

    def test_remove_directories_only_when_recursive(self, host, public_dir):
        tree = public_dir / "tree"
        (tree / "a" / "b").mkdir(parents=True)
        (tree / "a" / "b" / "f").write_bytes(b"")
        with pytest.raises(CommandError):
            host.remove([str(tree)])
        assert tree.exists()
        host.remove([str(tree)], recursive=True)
        assert not tree.exists()

    def test_remove_refuses_root_and_strings(self, host):
        with pytest.raises(InputError):
            host.remove(["/"], recursive=True)
        with pytest.raises(InputError):
            host.remove("/tmp/x")  # a Sequence[str] to mypy: refused at run time

    def test_make_dirs(self, host, public_dir):
        require_root()
        path = public_dir / "a b" / "c\nd" / "data"
        host.make_dirs(str(path), mode=0o750, owner="postgres")
        st = path.stat()
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o750, *postgres_ids())
        assert (public_dir / "a b").stat().st_uid == 0  # parents: the usual mkdir -p
        path.chmod(0o711)
        host.make_dirs(str(path), mode=0o700)  # exists: fine, left as it is
        assert path.stat().st_mode & 0o7777 == 0o711
        (public_dir / "file").write_bytes(b"")
        with pytest.raises(CommandError):
            host.make_dirs(str(public_dir / "file"))
        with pytest.raises(CommandError):
            host.make_dirs(str(public_dir / "file" / "below"))


# --------------------------------------------------------------------------- Host: processes


class TestHostProcesses:
    """Processes through a Host; tests/integration/test_ssh.py runs them over ssh too."""

    @pytest.fixture
    def host(self) -> Host:
        return Host(LocalRunner())

    def test_process(self, host, public_dir):
        workdir = public_dir / "work dir\nwith newline"
        workdir.mkdir()
        proc = spawn(["sleep", "30"], cwd=workdir)
        try:
            info = host.process(proc.pid)
            assert info is not None
            assert (info.pid, info.command, info.user, info.cwd, info.zombie) == (
                proc.pid,
                "sleep",
                pwd.getpwuid(os.geteuid()).pw_name,
                str(workdir),
                False,
            )
            assert str(info) == f"pid {proc.pid} sleep (user {info.user})"
        finally:
            stop(proc)
        assert host.process(proc.pid) is None  # reaped: gone

    def test_process_of_another_user(self, host, public_dir):
        require_root()
        proc = spawn(["sleep", "30"], cwd=public_dir, user="postgres")
        try:
            info = host.process(proc.pid)
            assert info is not None and info.user == "postgres"
        finally:
            stop(proc)

    def test_zombie(self, host):
        proc = subprocess.Popen(["sh", "-c", "exit 0"])
        deadline = time.monotonic() + 5
        while (info := host.process(proc.pid)) is not None and not info.zombie:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert info is not None and info.zombie  # dead, not reaped yet
        proc.wait()
        assert host.process(proc.pid) is None

    def test_invalid_pid(self, host):
        for pid in (0, -1):
            with pytest.raises(InputError):
                host.process(pid)

    def test_processes_using(self, host, public_dir):
        used = public_dir / "we[ir]d *dir"
        sibling = public_dir / "weid xdir"  # what the unescaped glob would also match
        for d in (used, sibling):
            (d / "sub").mkdir(parents=True)
        (used / "sub" / "open file").write_bytes(b"x" * 8192)
        (used / "deleted").write_bytes(b"x")
        (used / "mapped").write_bytes(b"x" * 8192)
        mapper = (
            "import mmap, sys, time\n"
            "f = open(sys.argv[1], 'rb')\n"
            "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
            "f.close()\n"  # only the mapping holds the file now
            "time.sleep(30)\n"
        )
        procs = {
            "cwd": spawn(["sleep", "30"], cwd=used / "sub"),
            "fd": spawn(
                ["sh", "-c", 'exec 3<"$1"; exec sleep 30', "sh", str(used / "sub" / "open file")]
            ),
            "deleted": spawn(
                ["sh", "-c", 'exec 4<"$1"; rm -- "$1"; exec sleep 30', "sh", str(used / "deleted")]
            ),
            "mapped": spawn([sys.executable, "-c", mapper, str(used / "mapped")]),
            "sibling": spawn(["sleep", "30"], cwd=sibling),
            "elsewhere": spawn(["sleep", "30"], cwd="/"),
        }
        try:
            time.sleep(0.3)  # python has mapped its file
            found = host.processes_using(str(used))
            pids = [p.pid for p in found]
            assert pids == sorted(pids)
            expected = {procs[k].pid for k in ("cwd", "fd", "deleted", "mapped")}
            assert set(pids) == expected, [str(p) for p in found]
            assert {p.command for p in found} >= {"sleep"}
            assert [p.pid for p in host.processes_using(str(sibling))] == [procs["sibling"].pid]
            nothing = public_dir / "nothing here"
            nothing.mkdir()
            assert host.processes_using(str(nothing)) == ()
        finally:
            for proc in procs.values():
                stop(proc)

    def test_processes_using_through_a_symlink(self, host, public_dir):
        real = public_dir / "real"
        real.mkdir()
        (public_dir / "alias").symlink_to(real)
        proc = spawn(["sleep", "30"], cwd=real)
        try:
            assert [p.pid for p in host.processes_using(str(public_dir / "alias"))] == [proc.pid]
        finally:
            stop(proc)


def test_processes_using_the_root_includes_this_process():
    # Every process's root directory is "/": this test process is among them.
    found = Host().processes_using("/")
    assert os.getpid() in {p.pid for p in found}


class Elsewhere:
    """A runner that is not the local one, so a Host takes the commands' path (as over
    ssh); it runs them here and keeps their argv in ``calls``."""

    description = "remote"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def run(self, argv, **kw):
        self.calls.append(list(argv))
        return LocalRunner().run(argv, **kw)


def test_read_heads_reads_the_start_of_every_file_in_one_round_trip(tmp_path):
    (tmp_path / "seg").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "short").write_bytes(b"ab")
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "odd\nname \\x").write_bytes(b"\x00\xff\n\x00")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "seg")
    expected = {
        "seg": bytes(range(16)),
        "short": b"ab",
        "empty": b"",
        "odd\nname \\x": b"\x00\xff\n\x00",
    }

    remote = Elsewhere()
    assert Host(remote).read_heads(str(tmp_path), 16) == expected
    assert len(remote.calls) == 1  # one round trip for the whole directory
    assert Host().read_heads(str(tmp_path), 16) == expected  # on this machine, in-process
    for host in (Host(), Host(Elsewhere())):
        with pytest.raises(HostFileNotFound):
            host.read_heads(str(tmp_path / "missing"), 16)


def _heads_output(listing: list[tuple[bytes, int]], *runs: bytes) -> bytes:
    """What the heads script prints: the listing, an empty field, then the hex of what
    each ``head -v`` run wrote (find may split the files over several runs)."""
    head = b"".join(runs)
    out = b"".join(name + b"\0" + str(size).encode() + b"\0" for name, size in listing)
    return out + b"\0" + " ".join(f"{b:02x}" for b in head).encode() + b"\n"


def test_list_dirs_is_one_command_elsewhere(tmp_path):
    for name in ("pg_replslot", "pg_stat_tmp", "pg_subtrans"):
        (tmp_path / name).mkdir()
    (tmp_path / "pg_stat_tmp" / "global.stat").write_bytes(b"")
    remote = Elsewhere()
    paths = [str(tmp_path / n) for n in ("pg_replslot", "pg_stat_tmp", "pg_subtrans")]
    listed = Host(remote).list_dirs(paths)
    assert listed == dict(zip(paths, [(), ("global.stat",), ()], strict=True))
    assert len(remote.calls) == 1
    # One missing: the command fails, and each is asked alone (which says which).
    remote.calls.clear()
    gone = str(tmp_path / "pg_notify")
    assert Host(remote).list_dirs([*paths, gone]) == {**listed, gone: None}
    assert len(remote.calls) == 1 + 4


def test_read_heads_takes_heads_output_apart_by_the_files_sizes():
    from pgsnap.host.host import _parse_heads

    listing = [(b"a", 3), (b"b <==\nx", 40), (b"e", 0)]
    first = b"==> ./a <==\nabc\n==> ./b <==\nx <==\n" + bytes(range(16))
    out = _heads_output(listing, first, b"\n==> ./e <==\n")
    assert _parse_heads(out, 16) == {"a": b"abc", "b <==\nx": bytes(range(16)), "e": b""}
    assert _parse_heads(_heads_output([]), 16) == {}
    # find split the files over two head runs: the second's first header has no
    # newline before it, as after a file that shrank by a byte; read one by one.
    assert _parse_heads(_heads_output(listing, first, b"==> ./e <==\n"), 16) is None


@pytest.mark.parametrize(
    "case",
    [
        "grown",
        "shrunk",
        "shrunk by one",
        "removed",
        "added",
        "no headers",
        "not hex",
        "no listing end",
    ],
)
def test_read_heads_output_that_does_not_add_up_is_refused(case):
    """A file changed between the listing and head, or a head that writes otherwise:
    None, and the files are read again one by one."""
    from pgsnap.host.host import _parse_heads

    listing = [(b"a", 3), (b"b", 2)]
    runs = [b"==> ./a <==\nabc\n==> ./b <==\nxy"]
    if case == "grown":
        runs = [b"==> ./a <==\nabcdef\n==> ./b <==\nxy"]
    elif case == "shrunk":
        runs = [b"==> ./a <==\na\n==> ./b <==\nxy"]
    elif case == "shrunk by one":
        runs = [b"==> ./a <==\nab\n==> ./b <==\nxy"]
    elif case == "removed":
        runs = [b"==> ./a <==\nabc"]
    elif case == "added":
        runs = [*runs, b"\n==> ./c <==\nz"]
    elif case == "no headers":
        runs = [b"abcxy"]
    out = _heads_output(listing, *runs)
    if case == "not hex":
        out = out[:-3] + b"zz\n"
    elif case == "no listing end":
        out = out.replace(b"\0\0", b"\0", 1)
    assert _parse_heads(out, 16) is None


def test_read_heads_reads_file_by_file_when_the_output_does_not_add_up(tmp_path):
    (tmp_path / "seg").write_bytes(bytes(range(40)))
    (tmp_path / "short").write_bytes(b"ab")

    class Growing(Elsewhere):
        """Where a file grows between the listing and head (one byte more is read)."""

        def run(self, argv, **kw):
            done = super().run(argv, **kw)
            if len(self.calls) == 1:
                done = CommandResult(done.argv, done.returncode, done.stdout + b"00\n", b"")
            return done

    remote = Growing()
    assert Host(remote).read_heads(str(tmp_path), 16) == {"seg": bytes(range(16)), "short": b"ab"}
    scripts = [argv[2] for argv in remote.calls]
    assert len(scripts) == 2  # the heads of all, then file by file
    assert "head -v" in scripts[0] and "head" not in scripts[1]


def test_read_heads_follows_a_directory_given_as_a_symbolic_link(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "seg").write_bytes(b"abcd")
    (tmp_path / "mount").symlink_to(tmp_path / "real")
    assert Host().read_heads(str(tmp_path / "mount"), 2) == {"seg": b"ab"}


def test_local_reads_ask_the_kernel_not_a_command(public_dir, monkeypatch):
    """On this machine the reading file methods run no process (3-6 ms each: a
    recovery asked about 50 of them); what a command would say is what the
    tests above check, and tests/integration/test_ssh.py runs them as commands."""
    host = Host(LocalRunner())
    (public_dir / "d").mkdir()
    (public_dir / "d" / "f").write_bytes(b"abc")
    os.symlink(public_dir / "d", public_dir / "link")
    ran: list[list[str]] = []
    real = LocalRunner.run

    def counted(self: LocalRunner, argv: Any, **kwargs: Any) -> Any:
        ran.append(list(argv))
        return real(self, argv, **kwargs)

    monkeypatch.setattr(LocalRunner, "run", counted)
    base = str(public_dir)
    assert host.read_bytes(f"{base}/link/f", offset=1) == b"bc"
    info = host.stat(f"{base}/link/f")
    assert info is not None and info.size == 3
    assert host.stat(f"{base}/missing") is None
    assert host.exists(f"{base}/d") and not host.exists(f"{base}/missing")
    assert host.realpath(f"{base}/link/f") == os.path.realpath(f"{base}/d/f")
    assert host.list_dir(f"{base}/link") == ("f",)
    with pytest.raises(HostFileNotFound):
        host.read_bytes(f"{base}/missing")
    assert ran == []
    # What the kernel cannot answer simply is asked of the command, whose error
    # reads the same on every host.
    with pytest.raises(HostError, match="not a directory"):
        host.list_dir(f"{base}/d/f")
    assert host.realpath(f"{base}/missing/../x") == f"{base}/x"
    assert [a[0] for a in ran] == ["find", "realpath"]
