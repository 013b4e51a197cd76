"""Copies, by property: whatever the tree, a copy restores it byte for byte; a second
copy of a changed tree sends exactly the chunks that are new to the target."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pgsnap.copies import DirectoryCopyTarget, chunk_id, copy_trees, restore_trees

CHUNK = 4096
NAMES = st.text(alphabet="abcdefgh_0123.", min_size=1, max_size=8).filter(
    lambda n: n not in (".", "..")
)
SIZES = st.sampled_from([0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 5000])
TREES = st.dictionaries(
    st.lists(NAMES, min_size=1, max_size=3).map(tuple),
    st.tuples(SIZES, st.integers(0, 255)),
    max_size=12,
)


def build(root: Path, files: dict[tuple[str, ...], tuple[int, int]]) -> None:
    root.mkdir()
    for parts, (size, seed) in sorted(files.items()):
        path = root.joinpath(*parts)
        if any(p.exists() and not p.is_dir() for p in [*path.parents][: len(parts) - 1]):
            continue  # a file already where this one's directory would be
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes((seed + i * 7) % 251 for i in range(size)))


def contents(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[str((Path(dirpath) / d).relative_to(root))] = None
        for f in filenames:
            path = Path(dirpath) / f
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def chunks_of(root: Path) -> set[str]:
    found = set()
    for data in contents(root).values():
        if data:
            found |= {chunk_id(data[i : i + CHUNK]) for i in range(0, len(data), CHUNK)}
    return found


@settings(max_examples=40)
@given(first=TREES, second=TREES)
def test_copies_restore_exactly_and_send_only_new_chunks(first, second) -> None:
    work = Path(tempfile.mkdtemp(prefix="pgsnap-copies-"))
    try:
        target = DirectoryCopyTarget(work / "target")
        a, b = work / "a", work / "b"
        build(a, first)
        build(b, second)
        kw = {"backup_id": "b", "chunk_size": CHUNK, "codec": "zlib"}
        clock = {"clock": lambda: dt.datetime(2026, 12, 1, tzinfo=dt.UTC)}
        m1, s1 = copy_trees({"t": a}, target, copy_id="one", **kw, **clock)  # type: ignore[arg-type]
        m2, s2 = copy_trees({"t": b}, target, copy_id="two", **kw, **clock)  # type: ignore[arg-type]
        assert s1.chunks_new == len(chunks_of(a))
        assert s2.chunks_new == len(chunks_of(b) - chunks_of(a))
        for manifest, source in ((m1, a), (m2, b)):
            dest = work / f"restored-{manifest.copy_id}"
            restore_trees(manifest, target, {"t": dest})
            assert contents(dest) == contents(source)
    finally:
        shutil.rmtree(work)
