"""Unit tests of pgsnap.wal.archive.DirectoryWalArchive (on a temporary directory)."""

from __future__ import annotations

import bz2
import gzip
import os
import pathlib
import shutil
import subprocess
from pathlib import Path

import pytest

from pgsnap import wal
from pgsnap.errors import ArchiveError, HistoryFileError, WalNameError
from pgsnap.model import LSN
from pgsnap.wal import SegmentRange, check, segment_name
from pgsnap.wal.archive import DirectoryWalArchive

SEG16 = 16 * 1024 * 1024
HIST3 = (
    '1\t0/5000EC0\tbefore 2026-11-30 00:17:56.52352+00\n\n\n2\t0/5000F50\tat restore point "rp1"\n'
)
HIST2 = "1\t0/5000EC0\tbefore 2026-11-30 00:17:56.52352+00\n"


def touch(path, data: bytes = b"") -> None:
    """A file; one named like a segment is a sparse 16 MiB file, as a real segment is."""
    path.write_bytes(data)
    if not data and len(path.name) == 24:
        os.truncate(path, SEG16)


@pytest.fixture
def archive(tmp_path):
    d = tmp_path / "arch ive's %dir"
    d.mkdir()
    for s in (3, 4):
        touch(d / segment_name(1, s, SEG16))
    touch(d / (segment_name(3, 5, SEG16) + ".gz"))
    touch(d / segment_name(3, 6, SEG16))
    touch(d / (segment_name(1, 5, SEG16) + ".partial"))
    (d / "00000002.history").write_text(HIST2)
    (d / "00000003.history.gz").write_bytes(gzip.compress(HIST3.encode()))
    (d / "000000010000000000000004.00000028.backup").write_text("START WAL LOCATION: x\n")
    touch(d / ".000000010000000000000007.XyZ12")  # rsync temp file
    touch(d / "000000010000000000000007.tmp")  # archive script temp file
    (d / "archive_status").mkdir()
    touch(d / "notes.txt")
    return DirectoryWalArchive(d, gzip=True)  # it holds a gzip-compressed segment


def test_list_names(archive):
    assert archive.list_names() == tuple(
        sorted(
            [
                "000000010000000000000003",
                "000000010000000000000004",
                "000000010000000000000004.00000028.backup",
                "000000010000000000000005.partial",
                "000000030000000000000005.gz",
                "000000030000000000000006",
                "00000002.history",
                "00000003.history.gz",
                "notes.txt",
            ]
        )
    )


def test_symlinked_files_count_dangling_links_do_not(tmp_path):
    d = tmp_path / "a"
    d.mkdir()
    target = tmp_path / "elsewhere"
    touch(target)
    os.symlink(target, d / segment_name(1, 1, SEG16))
    os.symlink(tmp_path / "missing", d / segment_name(1, 2, SEG16))
    assert DirectoryWalArchive(d).list_names() == (segment_name(1, 1, SEG16),)


def test_missing_directory(tmp_path):
    arch = DirectoryWalArchive(tmp_path / "nope")
    with pytest.raises(ArchiveError, match="does not exist") as exc:
        arch.list_names()
    assert exc.value.hint
    assert exc.value.details["path"] == str(tmp_path / "nope")


def test_not_a_directory(tmp_path):
    f = tmp_path / "file"
    touch(f)
    with pytest.raises(ArchiveError, match="not a directory"):
        DirectoryWalArchive(f).list_names()


def test_unreadable_directory(tmp_path):
    """As an unprivileged user (root reads everything: a forked child drops to postgres)."""
    import pwd
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="pgsnap-unreadable-"))  # reachable by postgres
    try:
        base.chmod(0o755)
        d = base / "locked"
        d.mkdir(mode=0o000)
        d.chmod(0o000)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports by exit status
            code = 1
            try:
                if os.geteuid() == 0:
                    user = pwd.getpwnam("postgres")
                    os.setgid(user.pw_gid)
                    os.setuid(user.pw_uid)
                try:
                    DirectoryWalArchive(d).list_names()
                except ArchiveError as exc:
                    code = 0 if "permission denied" in str(exc) and exc.hint else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        (base / "locked").chmod(0o700)
        shutil.rmtree(base)


def test_vanishing_file_is_skipped(tmp_path, monkeypatch):
    d = tmp_path / "a"
    d.mkdir()
    for s in (1, 2):
        touch(d / segment_name(1, s, SEG16))
    real_scandir = os.scandir

    class Entry:
        def __init__(self, e):
            self._e = e
            self.name = e.name

        def is_file(self):
            if self.name.endswith("1"):
                raise FileNotFoundError(self.name)
            return self._e.is_file()

    class Wrapper:
        def __init__(self, path):
            self._it = real_scandir(path)

        def __enter__(self):
            return (Entry(e) for e in self._it)

        def __exit__(self, *a):
            self._it.close()

    monkeypatch.setattr("pgsnap.wal.archive.os.scandir", Wrapper)
    assert DirectoryWalArchive(d).list_names() == (segment_name(1, 2, SEG16),)


def test_exists_and_name_validation(archive):
    assert archive.exists("00000002.history")
    assert archive.exists("00000003.history")  # stored as 00000003.history.gz
    assert archive.exists(segment_name(3, 5, SEG16))  # stored as .gz
    assert not archive.exists(segment_name(1, 5, SEG16))  # only a .partial
    assert not archive.exists("00000009.history")
    assert not archive.exists("archive_status")  # a directory
    for bad in ("../etc/passwd", "a/b", "", "..", "x\0y"):
        with pytest.raises(WalNameError, match="plain file name"):
            archive.exists(bad)


def test_read_text_plain_and_compressed(archive, tmp_path):
    assert archive.read_text("00000002.history") == HIST2
    assert archive.read_text("00000003.history.gz") == HIST3
    d = archive.path
    with open(os.path.join(d, "00000004.history.bz2"), "wb") as f:
        f.write(bz2.compress(b"1\t0/1\tx\n"))
    assert archive.read_text("00000004.history.bz2") == "1\t0/1\tx\n"


def test_read_text_errors(archive):
    with pytest.raises(ArchiveError, match="not in the WAL archive"):
        archive.read_text("00000009.history")
    with open(os.path.join(archive.path, "00000005.history.gz"), "wb") as f:
        f.write(b"not gzip")
    with pytest.raises(ArchiveError, match="not valid gz"):
        archive.read_text("00000005.history.gz")
    with open(os.path.join(archive.path, "00000006.history.zst"), "wb") as f:
        f.write(b"x")
    with pytest.raises(ArchiveError, match="cannot decompress"):
        archive.read_text("00000006.history.zst")
    with open(os.path.join(archive.path, "big.backup"), "wb") as f:
        f.write(b"x" * (1024 * 1024 + 1))
    with pytest.raises(ArchiveError, match="larger than"):
        archive.read_text("big.backup")
    with pytest.raises(ArchiveError, match="is a directory"):
        archive.read_text("archive_status")


def test_read_text_replaces_invalid_utf8(archive):
    with open(os.path.join(archive.path, "00000004.history"), "wb") as f:
        f.write(b'1\t0/1\tat restore point "caf\xe9"\n')
    assert "\ufffd" in archive.read_text("00000004.history")


def test_index(archive):
    idx = archive.index(SEG16)
    assert idx.ranges(1) == (SegmentRange(1, 3, 4),)
    assert idx.ranges(3) == (SegmentRange(3, 5, 6),)
    assert idx.partial_names == ("000000010000000000000005.partial",)
    assert idx.history_names == ("00000002.history", "00000003.history.gz")
    assert idx.unknown_names == ("notes.txt",)


def test_histories_and_check(archive):
    g = archive.histories()
    assert g.timelines() == (1, 2, 3)
    assert g.parent_of(3) == 2
    c = check(archive.index(SEG16), (1, LSN.parse("0/3000028")), None, g.latest(), g)
    assert c.complete, c.summary()
    assert c.reachable_lsn == LSN.parse("0/7000000")


def test_histories_prefers_plain_over_compressed(archive):
    with open(os.path.join(archive.path, "00000003.history"), "w") as f:
        f.write(HIST3)
    (g,) = [archive.histories()]
    assert g.latest() == 3


def test_malformed_history_names_the_file(archive):
    with open(os.path.join(archive.path, "00000004.history"), "w") as f:
        f.write("garbage\n")
    with pytest.raises(HistoryFileError, match=r"00000004\.history.*line 1") as exc:
        archive.histories()
    assert exc.value.details["name"] == "00000004.history"


def run_restore(command: str, cwd, name: str) -> int:
    cmd = command.replace("%f", name).replace("%p", "pg_wal/RECOVERYXLOG").replace("%%", "%")
    return subprocess.run(["/bin/sh", "-c", cmd], cwd=cwd, check=False).returncode


def test_restore_command_quotes_and_works(archive, tmp_path):
    cmd = archive.restore_command(gzip=False)
    assert "%%dir" in cmd  # PostgreSQL's escape for a literal %
    assert cmd.startswith("test -f ")
    pgdata = tmp_path / "pgdata"
    (pgdata / "pg_wal").mkdir(parents=True)
    with open(os.path.join(archive.path, segment_name(1, 3, SEG16)), "wb") as f:
        f.write(b"WAL3")
    assert run_restore(cmd, pgdata, segment_name(1, 3, SEG16)) == 0
    assert (pgdata / "pg_wal" / "RECOVERYXLOG").read_bytes() == b"WAL3"
    assert run_restore(cmd, pgdata, "00000009.history") != 0


def test_restore_command_gzip(archive, tmp_path):
    cmd = archive.restore_command(gzip=True)
    pgdata = tmp_path / "pgdata"
    (pgdata / "pg_wal").mkdir(parents=True)
    with open(os.path.join(archive.path, segment_name(3, 5, SEG16) + ".gz"), "wb") as f:
        f.write(gzip.compress(b"WAL5"))
    assert run_restore(cmd, pgdata, segment_name(3, 5, SEG16)) == 0
    assert (pgdata / "pg_wal" / "RECOVERYXLOG").read_bytes() == b"WAL5"
    assert run_restore(cmd, pgdata, segment_name(3, 9, SEG16)) != 0


def test_restore_command_refuses_newlines(tmp_path):
    with pytest.raises(ArchiveError, match="line break"):
        DirectoryWalArchive(tmp_path / "a\nb").restore_command()


def test_repr_eq_and_abspath(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = DirectoryWalArchive("arch")
    assert a.path == os.path.join(str(tmp_path), "arch")
    assert a.location == a.path
    assert repr(a) == f"DirectoryWalArchive({a.path!r})"
    assert a == DirectoryWalArchive(tmp_path / "arch")
    assert hash(a) == hash(DirectoryWalArchive(tmp_path / "arch"))
    assert a != "arch"


def test_satisfies_wal_archive_protocol(archive):
    from pgsnap.protocols import WalArchive

    def use(arch: WalArchive) -> str:
        return arch.restore_command()

    assert "test -f" in use(archive)


def test_wal_module_stays_pure():
    # The pure modules of pgsnap.wal (the old wal.py) stay pure: no files, no clock,
    # no printing.
    for name in ("names", "timelines", "backup_files", "continuity", "health", "events"):
        src = (pathlib.Path(wal.__file__).parent / f"{name}.py").read_text(encoding="utf-8")
        for forbidden in ("import os", "open(", "import time", "print(", ".now(", ".today("):
            assert forbidden not in src, (name, forbidden)


def test_a_file_named_like_a_segment_but_of_the_wrong_size_is_not_wal(tmp_path):
    """Issue 7 #6: a 5-byte file named like a segment counted as WAL in `wal`, `check`
    and the planner."""
    seg = 1024 * 1024
    for s in (1, 2, 4):
        (tmp_path / segment_name(1, s, seg)).write_bytes(b"\0" * seg)
    (tmp_path / segment_name(1, 3, seg)).write_bytes(b"short")
    (tmp_path / "00000002.history").write_text("1\t0/5000000\tno recovery target\n")
    arch = DirectoryWalArchive(tmp_path)
    names = arch.list_names(segment_size=seg)
    assert segment_name(1, 3, seg) not in names
    assert "00000002.history" in names
    assert segment_name(1, 3, seg) in arch.list_names()  # every file, without a size
    assert arch.unusable(seg) == (
        (segment_name(1, 3, seg), f"5 bytes, not a {seg}-byte WAL segment"),
    )
    index = arch.index(seg)
    assert [g.names(seg)[0] for g in index.gaps(1)] == [segment_name(1, 3, seg)]
    assert segment_name(1, 3, seg) in index.unknown_names


def test_compressed_segments_count_only_when_the_restore_command_fetches_them(tmp_path):
    seg = 1024 * 1024
    (tmp_path / segment_name(1, 1, seg)).write_bytes(b"\0" * seg)
    (tmp_path / (segment_name(1, 2, seg) + ".gz")).write_bytes(b"gz")
    (tmp_path / (segment_name(1, 3, seg) + ".zst")).write_bytes(b"zstd")
    plain = DirectoryWalArchive(tmp_path)
    assert plain.list_names(segment_size=seg) == (segment_name(1, 1, seg),)
    assert "gzip" not in plain.restore_command()
    gz = DirectoryWalArchive(tmp_path, gzip=True)
    assert gz.list_names(segment_size=seg) == (
        segment_name(1, 1, seg),
        segment_name(1, 2, seg) + ".gz",
    )
    assert "gzip -dc" in gz.restore_command()
    assert [r[0] for r in gz.unusable(seg)] == [segment_name(1, 3, seg) + ".zst"]
