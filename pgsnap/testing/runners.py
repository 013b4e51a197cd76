"""A scripted :class:`~pgsnap.protocols.Runner` for the unit tests of command-line backends.

A backend that drives a program on the database host (``btrfs``, ``lvs``)
is tested without that program by a runner that answers from a script and
records what it was asked::

    runner = ScriptedRunner()
    runner.answer(["lvs"], stdout=LVS_JSON)                 # a prefix and its output
    runner.on(lambda argv, stdin: None if argv[0] != "lvcreate" else runner.failed(argv, 5))
    backend = LvmBackend("vg0", host=Host(runner))
    ...
    assert runner.commands("lvcreate") == [[...]]

Handlers are tried newest first; the first that returns a result answers.
A command no handler answers goes to :meth:`ScriptedRunner.default`, which
raises :class:`UnscriptedCommand` (a test failure that names the command);
subclass and override it to answer a family of commands at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pgsnap.host.runners import CommandResult

__all__ = ["Handler", "ScriptedRunner", "UnscriptedCommand"]

Handler = Callable[[list[str], bytes | None], CommandResult | None]
"""``(argv, stdin) -> result``, or None to leave the command to the next handler."""


class UnscriptedCommand(AssertionError):
    """A command the script does not answer: the test did not expect it."""


class ScriptedRunner:
    """Answers commands from handlers and records every call (``calls``, with the
    users they ran as, ``run_as``, and the ``stdin`` they were given, by call number)."""

    description = "scripted"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.run_as: list[str | None] = []
        self.stdin: dict[int, bytes] = {}
        self.handlers: list[Handler] = []

    def on(self, handler: Handler) -> None:
        """Answer with ``handler`` (before every handler added earlier)."""
        self.handlers.insert(0, handler)

    def answer(
        self,
        prefix: Sequence[str],
        *,
        stdout: bytes = b"",
        returncode: int = 0,
        stderr: bytes = b"",
    ) -> None:
        """Answer every command that starts with ``prefix`` with this result."""
        head = list(prefix)

        def handler(argv: list[str], _stdin: bytes | None) -> CommandResult | None:
            if argv[: len(head)] != head:
                return None
            return CommandResult(tuple(argv), returncode, stdout, stderr)

        self.on(handler)

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        """Record the command and answer it from the script (see the module)."""
        args = list(argv)
        if not all(isinstance(a, str) for a in args):
            raise UnscriptedCommand(f"an argument is not text: {args!r}")
        self.calls.append(args)
        self.run_as.append(user)
        if stdin is not None:
            self.stdin[len(self.calls) - 1] = stdin
        for handler in self.handlers:
            result = handler(args, stdin)
            if result is not None:
                return result
        return self.default(args)

    def default(self, argv: list[str]) -> CommandResult:
        """The answer to a command no handler answered: :class:`UnscriptedCommand`."""
        raise UnscriptedCommand(f"unexpected command {argv}")

    @staticmethod
    def ok(argv: Sequence[str], stdout: bytes = b"") -> CommandResult:
        """A successful result of ``argv`` with ``stdout``."""
        return CommandResult(tuple(argv), 0, stdout, b"")

    @staticmethod
    def failed(argv: Sequence[str], returncode: int = 1, stderr: bytes = b"") -> CommandResult:
        """A failed result of ``argv``."""
        return CommandResult(tuple(argv), returncode, b"", stderr)

    def commands(self, *prefix: str) -> list[list[str]]:
        """The recorded commands that start with ``prefix`` (every one without)."""
        return [c for c in self.calls if c[: len(prefix)] == list(prefix)]
