"""barman-cloud for tests: its ``barman-cloud-wal-archive`` and ``-wal-restore`` in a
virtual environment PostgreSQL's OS user can run.

:func:`barman_cloud_bin` makes the environment on first use (``python -m venv``,
then ``pip install 'barman[cloud,lz4,snappy,zstandard]==3.19.1'`` from the
configured package index: about 15 s) under ``/var/cache/pgsnap-test`` (not
``/root``: the ``postgres`` user runs the programs), and finds it afterwards; a
lock keeps two test workers from making it at once. :func:`barman_cloud_env`
is the environment the programs run with against a test S3 server. What the tests
prove with it: pgsnap reads what the real ``barman-cloud-wal-archive`` wrote, and
the restore command pgsnap writes runs the real ``barman-cloud-wal-restore``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from pgsnap.errors import PgsnapError

__all__ = [
    "BARMAN_REQUIREMENT",
    "CACHE_DIR",
    "BarmanCloudUnavailable",
    "barman_cloud_bin",
    "barman_cloud_env",
]

log = logging.getLogger(__name__)

BARMAN_REQUIREMENT: Final = "barman[cloud,lz4,snappy,zstandard]==3.19.1"
"""What the environment holds: barman-cloud with boto3 and every codec it can write."""
CACHE_DIR: Final = Path(
    os.environ.get("PGSNAP_BARMAN_CACHE", "/var/cache/pgsnap-test/barman-cloud-3.19.1")
)
"""Where the environment is made (``$PGSNAP_BARMAN_CACHE`` wins)."""
_MARKER: Final = ".pgsnap-complete"


class BarmanCloudUnavailable(PgsnapError):
    """barman-cloud could not be installed (no package index, no venv module)."""


def barman_cloud_bin(cache_dir: Path = CACHE_DIR) -> Path:
    """The ``bin`` directory holding ``barman-cloud-wal-archive`` and
    ``barman-cloud-wal-restore``, made on first use (see the module docstring).
    :class:`BarmanCloudUnavailable` when it cannot be made."""
    bindir = cache_dir / "bin"
    if (cache_dir / _MARKER).exists():
        return bindir
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(cache_dir.parent, 0o755)  # noqa: S103 - PostgreSQL's OS user runs from it
    with open(cache_dir.parent / f".{cache_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (cache_dir / _MARKER).exists():
                return bindir
            shutil.rmtree(cache_dir, ignore_errors=True)
            for argv in (
                [sys.executable, "-m", "venv", str(cache_dir)],
                [str(bindir / "python"), "-m", "pip", "install", "-q", BARMAN_REQUIREMENT],
            ):
                log.info("making barman-cloud's environment: %s", " ".join(argv))
                done = subprocess.run(
                    argv, capture_output=True, text=True, timeout=600, check=False
                )
                if done.returncode != 0:
                    raise BarmanCloudUnavailable(
                        f"{' '.join(argv)} failed ({done.returncode}): "
                        f"{(done.stderr or done.stdout)[-2000:]}",
                        hint="the tests need PyPI (or its mirror) to install barman once",
                    )
            for program in ("barman-cloud-wal-archive", "barman-cloud-wal-restore"):
                if not (bindir / program).is_file():
                    raise BarmanCloudUnavailable(
                        f"{program} is not in {bindir} after installing {BARMAN_REQUIREMENT}",
                        hint=f"remove {cache_dir} and try again",
                    )
            for directory, _dirs, _files in os.walk(cache_dir):  # whatever the umask
                os.chmod(directory, 0o755)  # noqa: S103 - PostgreSQL's OS user runs it
            (cache_dir / _MARKER).write_text(BARMAN_REQUIREMENT + "\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return bindir


def barman_cloud_env(
    access_key: str, secret_key: str, *, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """An environment for barman-cloud's programs run by a test against its own S3
    server: the keys as ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a region, and
    no profile or credentials file of the caller's."""
    env = {
        k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("AWS_")
    }
    env.update(
        AWS_ACCESS_KEY_ID=access_key,
        AWS_SECRET_ACCESS_KEY=secret_key,
        AWS_DEFAULT_REGION="us-east-1",
    )
    return env
