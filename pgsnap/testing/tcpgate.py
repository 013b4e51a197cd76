"""A TCP gate for tests: a port on 127.0.0.1 forwarded to a server, that can be closed
(connections refused, those open cut) and opened again at once, as a network or a
server that goes away and comes back::

    with TcpGate(("127.0.0.1", s3_port)) as gate:
        client = connect(f"http://127.0.0.1:{gate.port}")
        gate.close()      # refused now
        gate.open()       # back, on the same port
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from types import TracebackType
from typing import Self

__all__ = ["TcpGate"]

log = logging.getLogger(__name__)


class TcpGate:
    """Forwards ``127.0.0.1:port`` to ``target`` while open (see the module docstring)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port: int = probe.getsockname()[1]
        probe.close()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self.open()

    def open(self) -> None:
        """Listen (again) on :attr:`port`."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        """Stop listening (new connections are refused) and cut the open ones."""
        with self._lock:
            listener, self._listener = self._listener, None
            cut, self._open = self._open, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in cut:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
