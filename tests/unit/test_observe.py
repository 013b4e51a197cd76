"""Pure parts of observation."""

from pgsnap.observe import is_live_segment

MB = 1 << 20


def _head(tli: int, pageaddr: int) -> bytes:
    return b"\x10\xd1\x06\x00" + tli.to_bytes(4, "little") + pageaddr.to_bytes(8, "little")


def test_a_segment_holds_wal_of_its_name_only_when_its_header_says_so():
    name = "000000020000000000000005"
    assert is_live_segment(name, _head(2, 5 * MB), MB)
    assert is_live_segment(name, _head(1, 5 * MB), MB)  # written on an ancestor timeline
    assert not is_live_segment(name, _head(2, 3 * MB), MB)  # recycled from segment 3
    assert not is_live_segment(name, _head(3, 5 * MB), MB)  # a later timeline's address
    assert not is_live_segment(name, bytes(16), MB)  # zero-filled, never written
    assert not is_live_segment(name, b"short", MB)


def test_other_files_count_as_they_are():
    assert is_live_segment("00000002.history", b"", MB)
    assert is_live_segment("000000010000000000000003.partial", b"", MB)
