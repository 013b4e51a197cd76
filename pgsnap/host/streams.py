"""Byte streams to and from a command on a host: what a copy reads a snapshot's tree
through (``tar -c`` on the host), and what a restore from a copy writes it with
(``tar -x`` on the host), when the host is not the machine pgsnap runs on.

A runner that can start a command as a local process (:class:`StreamingRunner`:
:class:`~pgsnap.host.LocalRunner`, the argument list itself;
:class:`~pgsnap.host.SshRunner`, the ``ssh`` command) streams: the data never
sits in memory whole. Any other runner (a test VM's console) goes through its
``run``: the output is read whole, the input gathered whole, then sent.

:func:`reading` yields the command's standard output; :func:`writing` its
standard input. Both wait for the command when the ``with`` block ends and raise
:class:`~pgsnap.errors.CommandError` (the end of its standard error) when it
failed; an error inside the block kills it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shlex
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Protocol, runtime_checkable

from pgsnap.errors import CommandError, CommandTimeout, HostError
from pgsnap.host.runners import CommandResult, Runner, _kill_group

__all__ = ["StreamingRunner", "reading", "writing"]

log = logging.getLogger(__name__)


@runtime_checkable
class StreamingRunner(Protocol):
    """Optional for a :class:`~pgsnap.protocols.Runner`: the local process that runs a
    command on its machine, so that its input and output can be streamed."""

    def process_argv(
        self, argv: Sequence[str], *, user: str | None = None
    ) -> tuple[list[str], Mapping[str, str]]:
        """The local argument list and environment of a process that runs ``argv``
        (as ``user``) on the runner's machine, with its standard streams."""
        ...


def _failed(argv: Sequence[str], returncode: int, stderr: bytes, where: str) -> CommandError:
    return CommandResult(tuple(argv), returncode, b"", stderr).error(host=where)


@contextlib.contextmanager
def _process(
    runner: StreamingRunner, argv: Sequence[str], user: str | None, timeout: float, *, out: bool
) -> Iterator[tuple[subprocess.Popen[bytes], IO[bytes]]]:
    local, env = runner.process_argv(argv, user=user)
    where = getattr(runner, "description", "local")
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                local,
                stdin=subprocess.DEVNULL if out else subprocess.PIPE,
                stdout=subprocess.PIPE if out else subprocess.DEVNULL,
                stderr=err,
                cwd="/",
                env=dict(env),
                start_new_session=True,
            )
        except OSError as exc:
            raise HostError(
                f"cannot run {shlex.join(argv)}: {exc.strerror or exc}", host=where
            ) from exc
        pipe = proc.stdout if out else proc.stdin
        assert pipe is not None
        try:
            yield proc, pipe
        except BaseException:
            _kill_group(proc.pid)
            pipe.close()
            proc.wait()
            raise
        pipe.close()
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            raise CommandTimeout(
                f"{shlex.join(argv)} did not finish within {timeout:g} s of its data",
                argv=tuple(argv),
                returncode=-1,
                host=where,
                hint="raise the timeout if the command is just slow",
                timeout=timeout,
            ) from None
        if returncode != 0:
            err.seek(0)
            raise _failed(argv, returncode, err.read()[-4000:], where)


@contextlib.contextmanager
def reading(
    runner: Runner, argv: Sequence[str], *, user: str | None = None, timeout: float = 600.0
) -> Iterator[IO[bytes]]:
    """The standard output of ``argv`` run through ``runner``, as a stream; the
    command must succeed (checked when the block ends: read the stream to its end)."""
    if isinstance(runner, StreamingRunner):
        with _process(runner, argv, user, timeout, out=True) as (_proc, pipe):
            yield pipe
        return
    result = runner.run(argv, user=user, timeout=timeout)
    result.check(host=runner.description)
    yield io.BytesIO(result.stdout)


@contextlib.contextmanager
def writing(
    runner: Runner, argv: Sequence[str], *, user: str | None = None, timeout: float = 600.0
) -> Iterator[IO[bytes]]:
    """The standard input of ``argv`` run through ``runner``, as a stream; when the
    block ends the input is closed and the command must succeed."""
    if isinstance(runner, StreamingRunner):
        with _process(runner, argv, user, timeout, out=False) as (_proc, pipe):
            yield pipe
        return
    buffer = io.BytesIO()
    yield buffer
    result = runner.run(argv, user=user, stdin=buffer.getvalue(), timeout=timeout)
    result.check(host=runner.description)
