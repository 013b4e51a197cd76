"""Command results and the local runner.

:class:`CommandResult` is what every :class:`~pgsnap.protocols.Runner`
returns. :class:`LocalRunner` runs commands on this machine with
``subprocess``, as another OS user through ``runuser`` (or ``setpriv``) when
pgsnap runs as root.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

__all__ = ["CommandResult", "LocalRunner"]


def _argv(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.frozen
class CommandResult:
    """A finished command: its arguments, exit status and output (bytes)."""

    argv: tuple[str, ...] = attrs.field(converter=_argv)
    returncode: int
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.returncode == 0

    @property
    def text(self) -> str:
        """Standard output as text (UTF-8; undecodable bytes kept as surrogates)."""
        return self.stdout.decode("utf-8", "surrogateescape")

    @property
    def error_text(self) -> str:
        """The end of standard error as text (at most 2000 characters), stripped."""
        return self.stderr.decode("utf-8", "replace").strip()[-2000:]

    def check(self, *, what: str | None = None, host: str | None = None) -> CommandResult:
        """Return self when the command succeeded, else raise
        :class:`~pgsnap.errors.CommandError` naming ``what`` failed (default:
        the command line) with the end of its standard error."""
        raise NotImplementedError


class LocalRunner:
    """Runs commands on this machine (implements :class:`~pgsnap.protocols.Runner`).

    Commands run with ``cwd="/"``, standard input closed unless ``stdin`` is
    given, and ``LC_ALL=C`` so their output parses the same everywhere. With
    ``user``: directly when pgsnap already runs as that user; through
    ``runuser -u USER --`` (or ``setpriv``) when it runs as root;
    :class:`~pgsnap.errors.ConfigurationError` otherwise. A program that does
    not exist gives exit status 127, as a shell would. A command that
    outlives ``timeout`` is killed (its whole process group) and raises
    :class:`~pgsnap.errors.CommandTimeout`.
    """

    @property
    def description(self) -> str:
        """Always ``"local"``."""
        return "local"

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        """Run ``argv`` (see the class docstring)."""
        raise NotImplementedError
