"""The lvm2 test VM harness without a VM: why it cannot run, and what it refuses."""

from __future__ import annotations

import pytest

from pgsnap.errors import ConfigurationError
from pgsnap.testing import lvmvm


def test_a_missing_program_names_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = lvmvm._which
    monkeypatch.setattr(
        lvmvm, "_which", lambda p: None if p in ("qemu-system-x86_64", "lvm") else real(p)
    )
    reason = lvmvm.lvmvm_unavailable()
    assert reason is not None
    assert "qemu-system-x86" in reason and "lvm2" in reason


def test_an_unwritable_cache_is_a_reason(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    if lvmvm.lvmvm_unavailable() is not None:
        pytest.skip(f"the VM cannot run here anyway: {lvmvm.lvmvm_unavailable()}")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr(lvmvm, "CACHE_DIR", blocker / "cache")
    reason = lvmvm.lvmvm_unavailable()
    assert reason is not None and "cache" in reason


@pytest.mark.parametrize("argv", ["ls -l", [], [""], ["ls", 3], ["ls", "a\0b"]])
def test_commands_are_argument_lists(argv: object) -> None:
    with pytest.raises(ConfigurationError):
        lvmvm._check_argv(argv)  # type: ignore[arg-type]


def test_console_output_is_decoded_whatever_the_line_ends() -> None:
    assert lvmvm._unb64(b"aGVs\r\nbG8=\r\n") == b"hello"
    assert lvmvm._unb64(b"") == b""
