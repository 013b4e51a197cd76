"""The pgsnap agent: commands without the start-up.

A ``pgsnap`` command spends about 0.3 s before it does anything: the interpreter, then
importing psycopg and pgsnap (attrs makes some 200 classes). For a backup that takes
half a second, or a ``pgsnap list``, that is most of the command. ``pgsnap agent`` pays
it once: it imports everything a command
may use and waits on a Unix socket. With ``PGSNAP_AGENT`` set to that socket, the
``pgsnap`` command (a small client, :func:`request`) hands its command line to the
agent, which forks: the fork runs the command exactly as a new process would, with
the caller's standard input, output and error, working directory, environment and
umask, reads the configuration and the catalog afresh, and its exit status becomes
the command's. Nothing is kept between commands but the imported code.

Safety:

- The agent serves its own user only (the peer's uid, ``SO_PEERCRED``); its socket is
  made ``0600``.
- A command the agent will not run (another user, another installation or version of
  pgsnap, or code changed on disk since the agent started, after which the agent
  ends) is run by the client itself, in its own process, with a line on stderr
  saying why. So is every command when no agent answers.
- Ctrl-C, SIGTERM and SIGHUP sent to the client are passed on to the command; a
  client that goes away (killed) interrupts its command with SIGTERM, as closing a
  terminal would (a backup is undone, a recovery keeps its journal).
- SIGTERM, SIGINT or SIGHUP to the agent: it stops taking commands and ends when the
  running ones have ended; a second one ends it at once (the commands run on, in
  sessions of their own).

The client imports the standard library and pgsnap's version only (:mod:`pgsnap._entry`
calls it before anything else); the agent's side imports pgsnap when it starts serving.
See docs/reference/agent.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import stat
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, NoReturn

__all__ = ["ENV", "PROTOCOL", "request", "serve"]

logger = logging.getLogger(__name__)

ENV = "PGSNAP_AGENT"
"""The environment variable that names the agent's socket: set, and the ``pgsnap``
command asks the agent there to run it."""

PROTOCOL = 1
"""The version of what client and agent say to each other."""

_HEADER = struct.Struct("!I")
_MAX_REQUEST = 4 * 1024 * 1024
"""A request's largest size (its environment and command line)."""
_REQUEST_SECONDS = 5.0
"""How long the agent waits for a request once connected (the client sends it at once)."""
_EXIT_LOST = 1
"""The client's exit code when the agent ended before telling it the command's
(``EXIT_FAILED``: the command's outcome is in its log and journal, not known here)."""
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# ----------------------------------------------------------------------------- client


def _say(text: str) -> None:
    """A line on the command's standard error (the client is the command's process)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def _std_fds() -> tuple[list[int], list[int]]:
    """This process's standard input, output and error and its working directory, as
    file descriptors to pass (a closed one is /dev/null); the ones opened here."""
    fds: list[int] = []
    opened: list[int] = []
    for fd, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            fd = os.open(os.devnull, mode)  # noqa: PLW2901
            opened.append(fd)
        fds.append(fd)
    cwd = os.open(".", os.O_PATH | os.O_DIRECTORY)  # needs no read permission
    opened.append(cwd)
    fds.append(cwd)
    return fds, opened


def _message(stream: IO[bytes]) -> dict[str, Any] | None:
    """One JSON line from the agent; None at its end."""
    line = stream.readline(65536)
    if not line:
        return None
    value = json.loads(line)
    return value if isinstance(value, dict) else None


_PACKAGE = os.path.dirname(os.path.abspath(__file__))
"""pgsnap's package directory (this module's)."""


def _installation() -> dict[str, str]:
    """What makes this pgsnap this one: its package directory, version and interpreter."""
    from pgsnap._version import __version__  # noqa: PLC0415

    return {
        "package": os.path.realpath(_PACKAGE),
        "version": __version__,
        "prefix": sys.prefix,
    }


class _Forwarder:
    """Ctrl-C, SIGTERM and SIGHUP while the client waits: held until the command's
    process is known, then passed on to it (so one sent the moment the command starts
    reaches it, not the client)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.held: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Forwarder:
        self._previous = {sig: signal.signal(sig, self._signalled) for sig in _FORWARDED}
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _signalled(self, signum: int, _frame: object) -> None:
        if self.pid is None:
            self.held.append(signum)
        else:
            self._send(signum)

    def started(self, pid: int) -> None:
        self.pid = pid
        for signum in self.held:
            self._send(signum)

    def _send(self, signum: int) -> None:
        assert self.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)


def request(path: str, argv: Sequence[str]) -> int | None:
    """Run the ``pgsnap`` command ``argv`` (without the program's name) through the
    agent listening at ``path``; its exit code, or None when the agent did not take
    it (none listens there, or it refused: a line on stderr says why), and the
    caller runs it in its own process.

    A command killed by a signal kills this process with the same signal. A signal
    that came before the agent answered, when it did not take the command, is acted
    on here (Ctrl-C: ``KeyboardInterrupt``) instead of running the command.
    """
    with _Forwarder() as forwarder:
        said = _ask(path, argv, forwarder)
    if said is None and forwarder.held:
        signal.raise_signal(forwarder.held[0])  # its own handler again: as if it came now
    return said


def _ask(path: str, argv: Sequence[str], forwarder: _Forwarder) -> int | None:
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        _say(f"pgsnap: cannot reach an agent ({exc}); running in this process")
        return None
    with sock:
        try:
            sock.connect(path)
        except OSError as exc:
            why = exc.strerror or str(exc)
            _say(f"pgsnap: no agent at {path} ({why}); running in this process")
            return None
        try:
            fds, opened = _std_fds()
        except OSError as exc:
            _say(f"pgsnap: cannot hand this command to an agent ({exc}); running in this process")
            return None
        try:
            body = json.dumps(
                {
                    "protocol": PROTOCOL,
                    "argv": [sys.argv[0] if sys.argv and sys.argv[0] else "pgsnap", *argv],
                    "env": dict(os.environ),
                    "umask": _umask(),
                    **_installation(),
                }
            ).encode()
            data = _HEADER.pack(len(body)) + body
            sent = socket.send_fds(sock, [data], fds)
            if sent < len(data):
                sock.sendall(data[sent:])
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered (refused) before reading it all: its answer says why
        except OSError as exc:
            _say(f"pgsnap: the agent at {path} did not take the command ({exc}); running here")
            return None
        finally:
            for fd in opened:
                os.close(fd)
        stream = sock.makefile("rb")
        try:
            first = _message(stream)
        except (OSError, ValueError):
            first = None
        if first is None or "pid" not in first:
            why = (first or {}).get("refused", "it closed the connection")
            _say(f"pgsnap: the agent at {path} did not run the command: {why}; running here")
            return None
        pid = int(first["pid"])
        forwarder.started(pid)
        try:
            status = _message(stream)
        except (OSError, ValueError):
            status = None
    if status is None:
        _say(
            f"pgsnap: the agent at {path} ended before the command (process {pid}) did: "
            "its outcome is in its log and journal (pgsnap list, pgsnap resume)"
        )
        return _EXIT_LOST
    if "signal" in status:
        signum = int(status["signal"])
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's handler cannot be set
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + signum  # the signal is ignored or blocked here: say it the shell's way
    return int(status["exit"])


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------- agent


_THIRD_PARTY = (
    "psycopg",
    "psycopg.conninfo",
    "psycopg.errors",
    "requests",
    "tenacity",
    "zoneinfo",
    "decimal",
)
"""What pgsnap imports inside the functions that need it (psycopg costs 0.1-0.2 s)."""


def _preload() -> None:
    """Import what any command may use: every pgsnap module but the test harnesses,
    the libraries pgsnap imports when first used, and the backends other packages
    register."""
    import importlib  # noqa: PLC0415
    import importlib.metadata  # noqa: PLC0415
    import pkgutil  # noqa: PLC0415

    for module in pkgutil.walk_packages([_PACKAGE], "pgsnap."):
        name = module.name
        if name.startswith("pgsnap.testing") or name in (__name__, "pgsnap.__main__"):
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # an optional module: the command says so
            logger.debug("not preloaded: %s (%s)", name, exc)
    for name in _THIRD_PARTY:  # imported by pgsnap when first used
        try:
            importlib.import_module(name)
        except ImportError as exc:
            logger.debug("not preloaded: %s (%s)", name, exc)
    for ep in importlib.metadata.entry_points(group="pgsnap.backends"):
        try:
            importlib.import_module(ep.module)
        except Exception as exc:  # a plugin that cannot load: its command says so
            logger.warning("backend %s not preloaded: %s", ep.name, exc)


def _module_files() -> dict[str, tuple[int, int, int]]:
    """The source files of the pgsnap modules loaded, and what says they changed."""
    root = _PACKAGE + os.sep
    files: dict[str, tuple[int, int, int]] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.startswith(root):
            with contextlib.suppress(OSError):
                files[path] = _identity(path)
    return files


def _identity(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _changed(files: Mapping[str, tuple[int, int, int]]) -> str | None:
    """A loaded module file that is not what the agent loaded, if any."""
    for path, identity in files.items():
        try:
            now = _identity(path)
        except OSError:
            return path
        if now != identity:
            return path
    return None


def _bind(path: str) -> socket.socket:
    """A listening socket at ``path``, mode 0600; refuses a path that holds anything
    but a dead socket (which is replaced)."""
    from pgsnap.errors import ConfigurationError  # noqa: PLC0415

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigurationError(
                f"{path} exists and is not a socket: the agent will not replace it",
                hint="name a path of its own (a socket is made there)",
            )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # a socket nobody listens on: an agent that died
            else:
                raise ConfigurationError(
                    f"an agent already listens at {path}",
                    hint="stop it first (SIGTERM), or name another socket",
                )
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    except OSError as exc:
        listener.close()
        raise ConfigurationError(
            f"cannot make the agent's socket {path}: {exc.strerror or exc}",
            hint="its directory must exist and be writable by this user",
        ) from exc
    finally:
        os.umask(old)
    listener.listen(64)
    return listener


class _Agent:
    """The serving loop's state: the socket, the loaded files, the running commands."""

    def __init__(
        self, path: str, listener: socket.socket, command: Callable[[list[str]], int]
    ) -> None:
        self.path = path
        self.command = command
        self.listener = listener
        self.inode = os.stat(path).st_ino
        self.files = _module_files()
        self.installation = _installation()
        self.running: dict[int, socket.socket] = {}
        self.stopping = False
        self.served = 0
        self._close_in_child: list[Any] = []

    # -- the loop

    def run(self, on_ready: Callable[[], None] | None) -> None:
        import gc  # noqa: PLC0415
        import selectors  # noqa: PLC0415

        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        stops = 0

        def stop(_signum: int, _frame: object) -> None:
            nonlocal stops
            stops += 1
            self.stopping = True

        previous = {
            sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        old_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        self._close_in_child = [wake_r, wake_w, selector]
        gc.freeze()  # what was imported: the collector and the forks leave it alone
        try:
            if on_ready is not None:
                on_ready()
            while not (self.stopping and (stops > 1 or not self.running)):
                if self.stopping and self.listener.fileno() != -1:
                    selector.unregister(self.listener)
                    self._close_listener()
                for key, _events in selector.select(timeout=None):
                    if key.fileobj is wake_r:
                        with contextlib.suppress(BlockingIOError):
                            wake_r.recv(4096)
                    elif not self.stopping:
                        self._accept()
                self._reap()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            selector.close()
            wake_r.close()
            wake_w.close()
            self._close_listener()
            for conn in self.running.values():
                conn.close()
        logger.info("agent at %s ended after %d commands", self.path, self.served)

    def _close_listener(self) -> None:
        if self.listener.fileno() == -1:
            return
        self.listener.close()
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:  # still ours
                os.unlink(self.path)

    def _reap(self) -> None:
        while self.running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.running.pop(pid, None)
            if conn is None:
                continue
            if os.WIFSIGNALED(status):
                said: dict[str, int] = {"signal": os.WTERMSIG(status)}
            else:
                said = {"exit": os.waitstatus_to_exitcode(status)}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(said).encode() + b"\n")
            conn.close()

    # -- one command

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        fds: list[int] = []
        try:
            conn.settimeout(_REQUEST_SECONDS)
            refusal, body, fds = self._receive(conn)
            if refusal:
                self._refuse(conn, refusal)
                return
            if refusal is not None:
                return
            assert body is not None
            pid = os.fork()
            if pid == 0:
                self._child(conn, body, fds)
            self.served += 1
            logger.info("process %d runs %s", pid, _command_name(body["argv"][1:]))
            self.running[pid] = conn  # kept until the command ends: its status goes there
            conn.settimeout(None)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError as exc:
            logger.warning("a command's connection failed: %s", exc)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if conn not in self.running.values():
                conn.close()

    def _receive(self, conn: socket.socket) -> tuple[str | None, dict[str, Any] | None, list[int]]:
        """The request on ``conn``: (why it is refused, ``""`` when nothing was asked,
        or None to run it; its body; its fds)."""
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            return (f"it serves user id {os.getuid()} only, not {uid}", None, [])
        data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 4)
        if not data and not fds:
            return ("", None, [])  # connected and left without asking: nothing to say
        if len(fds) != 4:
            return ("the request came without its four file descriptors", None, fds)
        while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
            if len(data) >= _HEADER.size and _HEADER.unpack_from(data)[0] > _MAX_REQUEST:
                return ("the request is too large", None, fds)
            more = conn.recv(65536)
            if not more:
                return ("the request was cut short", None, fds)
            data += more
        try:
            body = json.loads(data[_HEADER.size :])
        except ValueError:
            return ("the request is not JSON", None, fds)
        if not isinstance(body, dict) or body.get("protocol") != PROTOCOL:
            return (f"it speaks protocol {PROTOCOL} only", None, fds)
        theirs = {k: body.get(k) for k in self.installation}
        if theirs != self.installation:
            differs = ", ".join(
                f"{k} {theirs[k]!r} (the agent's: {v!r})"
                for k, v in self.installation.items()
                if theirs[k] != v
            )
            return (f"it runs another pgsnap: {differs}", None, fds)
        changed = _changed(self.files)
        if changed is not None:
            self.stopping = True
            logger.warning("agent at %s ends: %s changed since it started", self.path, changed)
            return (f"its code changed on disk ({changed}); it ends, restart it", None, fds)
        return (None, body, fds)

    def _refuse(self, conn: socket.socket, why: str) -> None:
        logger.info("refused a command: %s", why)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"refused": why}).encode() + b"\n")

    def _child(self, conn: socket.socket, body: dict[str, Any], fds: list[int]) -> NoReturn:
        """In the fork: become the command's process, run it, exit with its code."""
        code = 70  # EX_SOFTWARE: the fork could not run the command
        try:
            others = [c for c in self.running.values() if c is not conn]
            _become(body, fds, close=[self.listener, *self._close_in_child, *others])
            _watch(conn)
            code = self.command([str(a) for a in body["argv"][1:]])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # the process ends here, after saying why
            import traceback  # noqa: PLC0415

            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code & 0xFF)


def _become(body: Mapping[str, Any], fds: Sequence[int], *, close: Sequence[Any]) -> None:
    """Make this fork the process the client would have been: its session, signals,
    descriptors, directory, umask, environment, command line, streams and logging."""
    import io  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    import time  # noqa: PLC0415

    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for thing in close:
        thing.close()
    os.setsid()  # no terminal of the agent's; the client's terminal is not ours to control
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    os.fchdir(fds[3])
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.umask(int(body["umask"]))
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in dict(body["env"]).items()})
    time.tzset()
    tempfile.tempdir = None  # TMPDIR again, should the agent have looked it up
    sys.argv = [str(a) for a in body["argv"]]
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=encoding)
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding=encoding,
        errors=errors,
        line_buffering=os.isatty(1),
        write_through=False,
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding=encoding,
        errors="backslashreplace",
        line_buffering=True,
    )
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)


def _watch(conn: socket.socket) -> None:
    """Interrupt the command (SIGTERM) when its client goes away."""
    import threading  # noqa: PLC0415

    conn.settimeout(None)

    def wait() -> None:
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="pgsnap-agent-client", daemon=True).start()


def _command_name(argv: Sequence[str]) -> str:
    """The subcommand's name, for the log (never its arguments: they may name secrets)."""
    from pgsnap._argv import subcommand  # noqa: PLC0415

    word = subcommand([str(a) for a in argv])
    return "no command" if word is None else repr(word)


def serve(
    path: str,
    *,
    command: Callable[[list[str]], int],
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Serve commands on the Unix socket ``path`` until SIGTERM, SIGINT or SIGHUP
    (after the running commands end; a second signal ends it at once), or until a
    loaded module's file changes.

    ``command`` runs one command line (without the program's name) in a fork and
    returns its exit code: ``pgsnap agent`` gives the ``pgsnap`` command's own.
    ``on_ready`` is called once the socket accepts commands. Raises
    :class:`~pgsnap.errors.ConfigurationError` when the socket cannot be made.
    """
    _preload()
    listener = _bind(path)
    agent = _Agent(path, listener, command)
    logger.info("agent at %s: %d modules loaded", path, len(agent.files))
    agent.run(on_ready)
